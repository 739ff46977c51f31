"""An evaluation feeding the model float16 tensors it made (``image = batch.half() / 255``) in
the loop around the training function. apex O1 cast each op's inputs, so the float32 weights took
them; outside autocast the pass raises ("Input type (c10::Half) and bias type (float)"), and the
safe rewrite of a diabetic-macular-edema trainer crashed at its first validation. Such an
evaluation goes under autocast, enabled as the training region, also where the script and its
functions stand under ``if __name__ == "__main__":``; one fed float32 tensors and only logged
stays outside, as before.
"""
from __future__ import annotations

import itertools
import shutil
import textwrap

import pytest

from migrate.api import migrate_paths, migrate_source

pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

SCRIPT = """import argparse

import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()
torch.manual_seed(0)
device = "cuda"
model = torch.nn.Sequential(torch.nn.Conv1d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(24, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
batches = [(torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)) for _ in range(4)]


def train():
    model.train()
    for x, y in batches:
        image = {half}
        image = image.unsqueeze(1)
        loss = torch.nn.functional.mse_loss(model(image).float(), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()


{evaluation}


for epoch in range(args.epochs):
    train()
    {call}
    print("out", epoch, round(float(model[0].weight.float().sum()), 5))
"""
# how the float16 tensor is made from `x`
HALVES = {
    "half": "x.half()",
    "half_scaled": "(x.half() / 255)",
    "to_dtype": "x.to(torch.float16)",
    "to_keyword": "x.to(dtype=torch.float16)",
}
# the evaluation, and its call in the epoch loop ({half}: the float16 spelling)
EVALUATIONS = {
    "global_model": ("def validation():\n    model.eval()\n    with torch.no_grad():\n        for x, _ in batches:\n"
                     "            image = {half}\n            image = image.unsqueeze(1)\n            out = model(image)\n"
                     "            print('val', float(out.float().mean()))", "validation()"),
    "handed_model": ("def evaluate(net, data):\n    net.eval()\n    with torch.no_grad():\n        for x, _ in data:\n"
                     "            print('val', float(net({half}.unsqueeze(1)).float().mean()))", "evaluate(model, batches)"),
    "bound_result": ("def validation():\n    model.eval()\n    with torch.no_grad():\n        x = batches[0][0]\n"
                     "        return float(model({half}.unsqueeze(1)).float().mean())", "score = validation()"),
}


def _script(half: str, evaluation: str, float_eval: bool = False, guarded: bool = False) -> str:
    body, call = EVALUATIONS[evaluation]
    spelled = HALVES[half]
    source = SCRIPT.format(half=spelled, evaluation=body.format(half="x" if float_eval else spelled), call=call)
    if guarded:  # the whole script, its functions too, under `if __name__ == "__main__":`
        head, _, rest = source.partition("parser = argparse")
        source = head + 'if __name__ == "__main__":\n' + textwrap.indent("parser = argparse" + rest, "    ")
    return source


@pytest.mark.parametrize(("half", "evaluation", "guarded"), list(itertools.product(HALVES, EVALUATIONS, [False, True])))
def test_an_evaluation_fed_float16_runs_under_autocast(half, evaluation, guarded):
    source = _script(half, evaluation, guarded=guarded)
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert "from apex import" not in new, new
    call = EVALUATIONS[evaluation][1]
    head = new.partition(f"\n{' ' * (12 if guarded else 8)}{call}\n")[0]
    assert head != new and head.rstrip().splitlines()[-1].strip().startswith("with torch.autocast("), new


@pytest.mark.parametrize("evaluation", sorted(EVALUATIONS))
def test_an_evaluation_fed_float32_stays_outside(evaluation):
    source = _script("half", evaluation, float_eval=True)
    new = migrate_source(source, "train.py").new_source
    assert "from apex import" not in new, new
    call = EVALUATIONS[evaluation][1]
    assert f"\n    {call}\n" in new, new


@pytest.mark.slow
@pytest.mark.parametrize("evaluation", ["global_model", "handed_model"])
def test_the_rewrite_runs_its_evaluation_as_apex_did(tmp_path, evaluation):
    """On the CPU the float16 input meets float32 weights as on a GPU: the original on ampshim
    and its rewrite train the same, where the rewrite without autocast raised."""
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = tmp_path / "original"
    original.mkdir()
    (original / "train.py").write_text(_script("half", evaluation))
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    result = compare(Target(str(original / "train.py")), Target(str(migrated / "train.py")), [], device="cpu",
                     steps=12, parallel=True, timeout=600)
    assert result.verdict == SAME, as_text(result)
