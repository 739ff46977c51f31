"""A backward pass on the unscaled loss inside ``amp.scale_loss`` (``with amp.scale_loss(loss,
optimizer) as scaled_loss: loss.backward()``). apex unscaled the gradients as the block exited, so
they came out divided by the loss scale; the safe rewrite keeps that (``loss.backward()`` and
``scaler.step``, which divides them too) and trains the same. The unsafe fix scales the loss
(AMP109), which trains differently, so the rewritten line carries a ``TODO(ampmigrate)`` marker
saying so (a wrapper-era trainer's unsafe rewrite changed it with no word).
"""
from __future__ import annotations

import itertools
import shutil
import textwrap

import pytest

from migrate.api import migrate_paths, migrate_source

pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

HEAD = """import torch
from apex import amp

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
batches = [torch.randn(8, 4) for _ in range(4)]
"""
STEP = """{loss} = model(x).pow(2).mean()
optimizer.zero_grad()
with amp.scale_loss({loss}, optimizer) as scaled_loss:
    {backward}
optimizer.step()
print("out", round(float(model.weight.float().sum()), 6))
"""
# where the loop stands: its opening lines and the call that runs it
HOLDERS = {
    "module": ("for x in batches:\n", ""),
    "function": ("def train():\n    for x in batches:\n", "train()\n"),
    "method": ("class Trainer:\n    def train(self):\n        for x in batches:\n", "Trainer().train()\n"),
}
BACKWARDS = ["{loss}.backward()", "{loss}.backward(retain_graph=False)"]
LOSSES = ["loss", "total"]


def _script(holder: str, backward: str, loss: str) -> str:
    opening, call = HOLDERS[holder]
    depth = opening.count("\n") * 4
    step = STEP.format(loss=loss, backward=backward.format(loss=loss))
    return HEAD + "\n\n" + opening + textwrap.indent(step, " " * depth) + "\n\n" + call


VARIANTS = list(itertools.product(HOLDERS, BACKWARDS, LOSSES))


@pytest.mark.parametrize(("holder", "backward", "loss"), VARIANTS)
def test_the_safe_rewrite_keeps_the_unscaled_backward_pass(holder, backward, loss):
    new = migrate_source(_script(holder, backward, loss), "train.py").new_source
    assert "from apex import" not in new, new
    assert f"\n{backward.format(loss=loss)}\n" in "\n" + "\n".join(line.strip() for line in new.splitlines()) + "\n", new
    assert "TODO(ampmigrate)" not in new, new


@pytest.mark.parametrize(("holder", "backward", "loss"), VARIANTS)
def test_the_unsafe_rewrite_scales_the_loss_under_a_marker(holder, backward, loss):
    new = migrate_source(_script(holder, backward, loss), "train.py", unsafe_fixes=True).new_source
    lines = [line.strip() for line in new.splitlines()]
    scaled = [i for i, line in enumerate(lines) if line.startswith(f"scaler.scale({loss}).backward(")]
    assert len(scaled) == 1, new
    marker = next(i for i in range(scaled[0], -1, -1) if lines[i].startswith("# TODO(ampmigrate)"))
    assert all(lines[i].startswith("#") for i in range(marker, scaled[0])), new
    assert "never scaled" in " ".join(lines[marker:scaled[0]]), new


@pytest.mark.slow
def test_the_safe_rewrite_trains_as_apex_did_and_the_unsafe_one_does_not(tmp_path):
    """The marker is needed: the safe rewrite trains as apex did, the unsafe one differently."""
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = tmp_path / "original"
    original.mkdir()
    (original / "train.py").write_text(_script("function", BACKWARDS[0], "loss"))
    results = {}
    for unsafe in (False, True):
        migrated = tmp_path / f"migrated{int(unsafe)}"
        shutil.copytree(original, migrated)
        migrate_paths([migrated], unsafe_fixes=unsafe)
        results[unsafe] = compare(Target(str(original / "train.py")), Target(str(migrated / "train.py")), [],
                                  device="cpu", steps=4, parallel=True, timeout=600)
    assert results[False].verdict == SAME, as_text(results[False])
    assert results[True].verdict != SAME, as_text(results[True])
