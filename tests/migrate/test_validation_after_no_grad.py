"""A validation in the training loop: passes under ``torch.no_grad()``, then losses on their outputs.

A GAN trainer validates every few steps inside its training loop: ``with torch.no_grad(): output
= generator(z)``, a second block running the discriminator on it, then, a few lines on, the
validation losses, one of them a perceptual loss whose own float32 network runs on ``output``.
apex O1 cast that network's input; the rewrite put only the no-grad blocks under autocast, so a
float16 ``output`` met float32 weights outside it and the safe rewrite crashed at the first
validation. The lines after a wrapped pass, up to the last that computes from what it (or the
lines before it) bound, now go under the same autocast; the span stops before a line that trains.
"""
from __future__ import annotations

import itertools

import pytest
from rewrite_runs import compare_with_its_rewrite

from migrate.api import migrate_source

pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

SCRIPT = """import torch
import torch.nn.functional as F
from apex import amp

torch.manual_seed(0)
generator = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh()).cuda()
critic = torch.nn.Linear(8, 1).cuda()
perceptual = torch.nn.Linear(8, 3).cuda()  # a float32 network of the loss, never initialized
optimizer = torch.optim.SGD(generator.parameters(), lr=0.1)
generator, optimizer = amp.initialize(generator, optimizer, opt_level="O1", verbosity=0)
batches = [(torch.randn(4, 4).cuda(), torch.randn(4, 8).cuda()) for _ in range(4)]
for step, (z, target) in enumerate(batches):
    loss = F.mse_loss(generator(z), target)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    if step % 2 == 0:
        total = 0.0
        for valid_z, valid_target in batches[:2]:
            with torch.no_grad():
                output = generator(valid_z)
{between}{second}
{losses}
        print("valid", step, round(float(total), 3))
    print("loss", step, round(loss.item(), 5))
"""
# what stands between the passes and the losses
BETWEEN = {
    "nothing": "",
    "a_line": "            valid_target = valid_target.cuda()\n",
    "a_comment": "\n            # the validation losses\n",
}
# a second no-grad block running another network on the first's output
SECOND = {
    "none": "",
    "critic": "            with torch.no_grad():\n                judged = critic(output)\n",
}
# how the losses read the output: the perceptual network on it, first or after another loss, or in an `if`
LOSSES = {
    "first": ("            valid_loss = F.mse_loss(perceptual(output), perceptual(valid_target))\n"
              "            total = total + valid_loss\n"),
    "second": ("            pixel = F.l1_loss(output, valid_target)\n"
               "            valid_loss = pixel + F.mse_loss(perceptual(output), perceptual(valid_target))\n"
               "            total = total + valid_loss\n"),
    "in_if": ("            if step >= 0:\n"
              "                valid_loss = F.mse_loss(perceptual(output), perceptual(valid_target))\n"
              "                total = total + valid_loss\n"),
}


def _script(between: str, second: str, losses: str) -> str:
    return SCRIPT.format(between=BETWEEN[between], second=SECOND[second], losses=LOSSES[losses].rstrip("\n"))


CASES = list(itertools.product(sorted(BETWEEN), sorted(SECOND), sorted(LOSSES)))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


@pytest.mark.parametrize(("between", "second", "losses"), CASES)
def test_the_losses_on_a_no_grad_output_go_under_its_autocast(between, second, losses):
    source = _script(between, second, losses)
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert "from apex import" not in new and "TODO(ampmigrate)" not in new, new
    lines = new.splitlines()
    opening = next(index for index, line in enumerate(lines) if line.strip().startswith("with torch.autocast(")
                   and index > next(i for i, text in enumerate(lines) if "for valid_z" in text))
    at = next(index for index, line in enumerate(lines) if "perceptual(output)" in line)
    assert opening < at and all(_indent(line) > _indent(lines[opening]) for line in lines[opening + 1:at + 1] if line.strip()), new
    printed = next(index for index, line in enumerate(lines) if 'print("valid"' in line)
    assert _indent(lines[printed]) <= _indent(lines[opening]), new  # the span ends at the last reader


def test_the_span_stops_before_a_line_that_trains():
    """A plain backward between the pass and a later reader ends the span: it stays outside."""
    source = _script("nothing", "none", "first").replace(
        "            valid_loss = F.mse_loss(perceptual(output), perceptual(valid_target))\n",
        "            critic(valid_target).sum().backward()\n"
        "            valid_loss = F.mse_loss(perceptual(output.float()), perceptual(valid_target))\n")
    new = migrate_source(source, "train.py").new_source
    lines = new.splitlines()
    at = next(index for index, line in enumerate(lines) if ".sum().backward()" in line)
    opening = next(index for index, line in enumerate(lines) if line.strip().startswith("with torch.autocast(")
                   and index > next(i for i, text in enumerate(lines) if "for valid_z" in text))
    assert _indent(lines[at]) <= _indent(lines[opening]), new


@pytest.mark.slow
@pytest.mark.parametrize(("between", "second", "losses"), [("a_line", "critic", "second"), ("nothing", "none", "in_if")])
def test_the_rewrite_validates_as_apex_did(tmp_path, between, second, losses):
    """On the CPU the float16 (bfloat16) output meets the perceptual network's float32 weights as
    on a GPU: the original on ampshim and its rewrite print the same, where the rewrite raised."""
    from ampshim.compare import SAME
    from ampshim.compare.report import as_text

    original = tmp_path / "original"
    original.mkdir()
    (original / "train.py").write_text(_script(between, second, losses))
    result = compare_with_its_rewrite(original)
    assert result.verdict == SAME, as_text(result)
