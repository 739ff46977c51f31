"""``if fp16: amp.initialize(...)`` in one arm of another ``if`` that the training loop is not in
(``if torch.cuda.device_count() > 1: model = nn.DataParallel(model) else: if cfg.FP16:
amp.initialize``, a re-identification trainer's). The GradScaler made before ``if fp16:`` would
exist on that arm's path only: the loop's ``scaler.is_enabled()`` raised UnboundLocalError on
every multi-GPU run, the float32 default included. The scaler is made, disabled, at the top of
the function, and enabled where apex was initialized; where the outer block holds the loop too,
or is a ``with``, the scaler is made before ``if fp16:`` as before.
"""
from __future__ import annotations

import itertools
import shutil
import textwrap
from pathlib import Path

import pytest

from migrate.api import migrate_paths

pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

SCRIPT = """import argparse

import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--gpus", type=int, default=1)
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()


def train(args):
    torch.manual_seed(0)
    device = "cuda"
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
{setup}
    for _ in range(args.steps):
        x, y = torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
    return model


train(args)
"""
INIT = "if args.fp16:\n    model, optimizer = amp.initialize(model, optimizer, opt_level='O1', verbosity=0)"
# the other arm: what several GPUs would do, a plain model here
SPREAD = "model = torch.nn.Sequential(*model)"
# where `if args.fp16:` stands: in an arm of an `if` the loop is not in
ARMS = {
    "else arm": f"if args.gpus > 1:\n    {SPREAD}\nelse:\n" + textwrap.indent(INIT, "    "),
    "if arm": "if args.gpus == 1:\n" + textwrap.indent(INIT, "    ") + f"\nelse:\n    {SPREAD}",
    "elif arm": f"if args.gpus > 2:\n    {SPREAD}\nelif args.gpus == 1:\n" + textwrap.indent(INIT, "    "),
    "under a device test": (f"if device:\n    model.to(device)\n    if args.gpus > 1:\n        {SPREAD}\n    else:\n"
                            + textwrap.indent(INIT, "        ")),
    "no other arm": "if args.gpus == 1:\n" + textwrap.indent(INIT, "    "),
}
# where `if args.fp16:` may still be preceded by the scaler: its block runs whenever it is reached
HOISTED = {
    "a with": "with torch.no_grad():\n" + textwrap.indent(INIT, "    "),
    "the function's body": INIT,
}


def _script(setup: str) -> str:
    return SCRIPT.format(setup=textwrap.indent(setup, "    "))


def _migrated(tmp_path: Path, source: str) -> tuple[str, object]:
    path = tmp_path / "train.py"
    path.write_text(source)
    [result] = migrate_paths([path])
    return path.read_text(), result


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_the_scaler_stands_in_disabled_from_the_top_of_the_function(tmp_path, arm):
    text, result = _migrated(tmp_path, _script(ARMS[arm]))
    assert result.changed, [d.message for d in result.diagnostics]
    assert "apex" not in text, text
    top, _, rest = text.partition("    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)\n")
    assert rest.startswith('    scaler = torch.amp.GradScaler("cuda", enabled=False)'), text
    assert 'scaler = torch.amp.GradScaler("cuda")' in rest, text
    compile(text, "train.py", "exec")
    assert not migrate_paths([tmp_path / "train.py"])[0].changed  # idempotent


@pytest.mark.parametrize("place", sorted(HOISTED))
def test_a_flag_if_whose_block_always_runs_is_hoisted_as_before(tmp_path, place):
    text, result = _migrated(tmp_path, _script(HOISTED[place]))
    assert result.changed, [d.message for d in result.diagnostics]
    assert any(f'scaler = torch.amp.GradScaler("cuda", enabled={on})' in text for on in ("args.fp16", "bool(args.fp16)")), text
    assert "enabled=False" not in text


def test_an_outer_if_holding_the_loop_too_keeps_the_hoist(tmp_path):
    head, _, tail = SCRIPT.partition("{setup}\n")
    loop, _, end = tail.partition("    return model\n")
    source = (head + "    if args.gpus >= 1:\n" + textwrap.indent(INIT, "        ") + "\n" + textwrap.indent(loop, "    ")
              + "    return model\n" + end)
    compile(source, "train.py", "exec")
    text, result = _migrated(tmp_path, source)
    assert result.changed, [d.message for d in result.diagnostics]
    assert "enabled=False" not in text and "GradScaler(\"cuda\", enabled=" in text, text


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["else arm", "under a device test"])
def test_the_rewrite_trains_the_same_on_every_path(tmp_path, arm):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = tmp_path / "original"
    original.mkdir()
    (original / "train.py").write_text(_script(ARMS[arm]))
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    # several "GPUs" with --fp16 raised under apex (scale_loss before initialize): not compared
    for argv in ([], ["--fp16"], ["--gpus", "2"]):
        result = compare(Target(str(original / "train.py")), Target(str(migrated / "train.py")), argv, device="cpu",
                         steps=12, parallel=True, timeout=600)
        assert result.verdict == SAME, (argv, as_text(result))
