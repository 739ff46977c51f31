"""A network the script casts to float16 itself and runs on float32 inputs, under apex O1.

A face-recognition trainer copies its backbone before ``amp.initialize``, and at each checkpoint
casts the copy with ``.half()`` (where apex is on), loads the trained weights into it and traces
it on ``torch.randn(...)``: apex O1's patched functions cast each op's inputs, so float32 inputs
met float16 weights. Natively, outside autocast, the trace raises ("Input type (float) and bias
type (c10::Half) should be the same"), and the safe rewrite crashed at its first checkpoint. In
the training loop the block goes under autocast, enabled as the training region; anywhere else
(after the loop, in a function called after it) the rewrite is unsafe and marked there. A cast
under an option of the file's own (not apex's flag) is left as it was.
"""
from __future__ import annotations

import itertools
import shutil

import pytest

from migrate.api import migrate_paths, migrate_source

pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

SCRIPT = """import copy

import torch
from apex import amp

torch.manual_seed(0)
device = "cuda"
use_amp = True
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
shadow = copy.deepcopy(model)
if use_amp:
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
batches = [(torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)) for _ in range(4)]
{export}
for step, (x, y) in enumerate(batches):
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    print("out", step, round(float(model[0].weight.float().sum()), 5))
{in_loop}{after}"""
# how the copy is cast to float16
CASTS = {
    "assigned": "shadow = shadow.half()",
    "in_place": "shadow.half()",
    "chained": "shadow = shadow.to(device).half()",
    "to_dtype": "shadow.to(torch.float16)",
}
# how it is run on a float32 input
RUNS = {
    "called": "out = shadow(torch.ones(2, 8, device=device))",
    "forward": "out = shadow.forward(torch.ones(2, 8, device=device))",
    "traced": "traced = torch.jit.trace(shadow, torch.ones(2, 8, device=device))\nout = traced(torch.ones(2, 8))",
}
PRINT = 'print("shadow", round(float(out.float().sum()), 2))'
PLACES = ("loop", "after", "function")


def _block(cast: str, run: str, guarded: bool, indent: str) -> str:
    lines = ([f"if use_amp:\n    {CASTS[cast]}"] if guarded else [CASTS[cast]]) + ["shadow.load_state_dict(model.state_dict())", RUNS[run], PRINT]
    return "".join(indent + line + "\n" for text in lines for line in text.splitlines())


def _script(cast: str, run: str, guarded: bool, place: str) -> str:
    if place == "loop":
        return SCRIPT.format(export="", in_loop="    if (step + 1) % 2 == 0:\n" + _block(cast, run, guarded, " " * 8), after="")
    if place == "after":
        return SCRIPT.format(export="", in_loop="", after=_block(cast, run, guarded, ""))
    return SCRIPT.format(export="\n\ndef export():\n    global shadow\n" + _block(cast, run, guarded, " " * 4) + "\n\n",
                         in_loop="", after="export()\n")


def _run_line(run: str) -> str:
    return RUNS[run].splitlines()[0]


CASES = list(itertools.product(sorted(CASTS), sorted(RUNS), (False, True)))


@pytest.mark.parametrize(("cast", "run", "guarded"), CASES)
def test_a_float16_network_run_in_the_loop_goes_under_autocast(cast, run, guarded):
    source = _script(cast, run, guarded, "loop")
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert "from apex import" not in new and "TODO(ampmigrate)" not in new, new
    lines = new.splitlines()
    at = next(index for index, line in enumerate(lines) if line.strip() == _run_line(run))
    opening = [index for index, line in enumerate(lines[:at]) if line.strip().startswith("with torch.autocast(")]
    assert len(opening) == 2, new  # the training region's, and this block's, enabled as it is
    training, region = (lines[index] for index in opening)
    assert region.strip() == training.strip() and len(lines[at]) - len(lines[at].lstrip()) > len(region) - len(region.lstrip()), new


@pytest.mark.parametrize(("cast", "run", "guarded", "place"), [(*case, place) for case in CASES for place in ("after", "function")])
def test_a_float16_network_run_outside_the_loop_keeps_the_rewrite_unsafe(cast, run, guarded, place):
    source = _script(cast, run, guarded, place)
    compile(source, "train.py", "exec")
    assert "from apex import" in migrate_source(source, "train.py").new_source
    new = migrate_source(source, "train.py", unsafe_fixes=True).new_source
    lines = new.splitlines()
    at = next(index for index, line in enumerate(lines) if line.strip() == _run_line(run))
    above = [line.strip() for line in lines[:at] if line.strip().startswith("#")]
    assert above and "TODO(ampmigrate)" in "\n".join(lines[at - 4:at]), new


@pytest.mark.parametrize("place", PLACES)
def test_a_network_cast_under_an_option_of_its_own_stays_as_it_was(place):
    """``if eval_in_half: shadow = shadow.half()``: not apex's flag, an option of the file's own,
    which casts for inputs it suits (token ids), natively too; the run is left as it was."""
    source = _script("assigned", "called", True, place).replace("if use_amp:\n" + " " * (8 if place == "loop" else 4 if place == "function" else 0) + "    shadow",
                                                              "if eval_in_half:\n" + " " * (8 if place == "loop" else 4 if place == "function" else 0) + "    shadow")
    source = source.replace("use_amp = True\n", "use_amp = True\neval_in_half = True\n")
    assert "if eval_in_half:" in source
    new = migrate_source(source, "train.py").new_source
    assert "from apex import" not in new and "TODO(ampmigrate)" not in new, new
    assert new.count("with torch.autocast(") == 1, new


@pytest.mark.parametrize("place", PLACES)
def test_a_float32_network_run_stays_as_it_was(place):
    """The copy is not cast: nothing mixes types, and the safe rewrite leaves the run alone."""
    source = _script("assigned", "called", False, place).replace("shadow = shadow.half()\n", "shadow = shadow.float()\n")
    new = migrate_source(source, "train.py").new_source
    assert "from apex import" not in new and "TODO(ampmigrate)" not in new, new
    assert new.count("with torch.autocast(") == 1, new


@pytest.mark.slow
@pytest.mark.parametrize(("cast", "run"), [("assigned", "called"), ("in_place", "traced")])
def test_the_rewrite_runs_the_float16_network_as_apex_did(tmp_path, cast, run):
    """On the CPU the float32 input meets the copy's float16 weights as on a GPU: the original on
    ampshim and its rewrite print the same, where the rewrite without autocast raised."""
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = tmp_path / "original"
    original.mkdir()
    (original / "train.py").write_text(_script(cast, run, True, "loop"))
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    result = compare(Target(str(original / "train.py")), Target(str(migrated / "train.py")), [], device="cpu",
                     steps=4, parallel=True, timeout=600)
    assert result.verdict == SAME, as_text(result)
