"""Gradients read where the step may not follow: clips become scale-aware, other reads stay unsafe."""
from __future__ import annotations

import re

import pytest

from migrate.api import migrate_source

ACCUMULATING = """\
import torch
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for step, batch in enumerate(loader):
    loss = model(batch) / 4
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    {read}
    if (step + 1) % 4 == 0:
        optimizer.step()
        optimizer.zero_grad()
"""


def _flat(code: str) -> str:
    """``code`` without comments, white space or trailing commas: its tokens, however laid out."""
    return "".join(re.sub(r"#[^\n]*", "", code).split()).replace(",)", ")")


def _migrate(read: str, unsafe_fixes: bool = False):
    result = migrate_source(ACCUMULATING.format(read=read), "train.py", unsafe_fixes=unsafe_fixes)
    assert result.error is None, result.error
    return result


@pytest.mark.parametrize("read, expected", [
    ("torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)",
     "torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm * scaler.get_scale())"),
    ("norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)",
     'norm = torch.nn.utils.clip_grad_norm_((p for group in optimizer.param_groups for p in group["params"]), '
     "1.0 * scaler.get_scale()) / scaler.get_scale()"),
    ("log(clip_grad_norm_(model.parameters(), max_norm=a + b).item())",
     "log((clip_grad_norm_(model.parameters(), max_norm=(a + b) * scaler.get_scale()) / scaler.get_scale()).item())"),
    ("torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)",
     "torch.nn.utils.clip_grad_value_(model.parameters(), 0.5 * scaler.get_scale())"),
])
def test_a_clip_at_every_micro_batch_becomes_scale_aware_and_safe(read, expected):
    result = _migrate(read)
    # laid out within 88 columns (one argument a line, with a trailing comma, where it would not fit)
    assert _flat(expected) in _flat(result.new_source)
    assert max(map(len, result.new_source.splitlines())) <= 88
    assert "unscale_" not in result.new_source  # a second unscale_ before the step would raise
    assert {d.fix.applicability.value for d in result.diagnostics if d.fix} == {"safe"}
    # right on scaled gradients, and marked so: AMP101 reports nothing there, the mark is used
    assert "  # noqa: AMP101\n" in result.new_source
    assert "    # clips the scaled gradients at the threshold times the scale\n" in result.new_source
    again = migrate_source(result.new_source, "train.py", select=["AMP101", "AMP800"])
    assert again.diagnostics == () and again.new_source == result.new_source


def test_other_gradient_reads_there_stay_unsafe_and_are_never_unscaled_twice():
    read = "norms.append(sum(p.grad.norm() for p in model.parameters()))"
    result = _migrate(read)
    assert result.new_source in (None, result.source)
    unsafe = _migrate(read, unsafe_fixes=True).new_source
    code = "\n".join(line for line in unsafe.splitlines() if not line.lstrip().startswith("#"))
    assert "unscale_" not in code  # the review marker may name it; no call is made
    # the marker is on the read itself
    assert "# TODO(ampmigrate): this reads gradients still scaled by the loss scale" in unsafe
    assert unsafe.split("this reads gradients still scaled")[1].split("norms.append(")[0].count("\n") <= 3


def test_a_clip_the_step_always_follows_is_unscaled_first():
    source = ACCUMULATING.format(read="pass").replace(
        "        optimizer.step()", "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n        optimizer.step()")
    result = migrate_source(source, "train.py")
    assert "        scaler.unscale_(optimizer)\n        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n" in result.new_source


def test_a_clip_before_an_if_else_that_steps_in_every_arm_is_unscaled_first():
    result = migrate_source("""\
import torch
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for batch in loader:
    for micro in batch.split(8):
        loss = model(micro)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if warming_up:
        optimizer.step()
        warmup.step()
    else:
        optimizer.step()
""", "train.py")
    assert "    scaler.unscale_(optimizer)\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n" in result.new_source
    assert {d.fix.applicability.value for d in result.diagnostics if d.fix} == {"safe"}


def test_a_clip_inside_the_scale_loss_block_reads_scaled_gradients_as_under_apex():
    # apex unscaled only when the block exited: a clip inside it saw scaled gradients.
    result = migrate_source("""\
import torch
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x in loader:
    loss = model(x)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    optimizer.step()
""", "train.py")
    assert ("    scaled_loss = scaler.scale(loss)\n    scaled_loss.backward()\n"
            "    # reads scaled gradients, as apex did inside amp.scale_loss\n"
            "    torch.nn.utils.clip_grad_norm_(  # noqa: AMP101\n"
            '        (p for group in optimizer.param_groups for p in group["params"]), 1.0\n'
            "    )\n"
            "    scaler.step(optimizer)\n") in result.new_source
    assert {d.fix.applicability.value for d in result.diagnostics if d.fix} == {"safe"}


@pytest.mark.parametrize("statement, reads", [
    ("grad_clipper.step(amp.master_params(optimizer))", True),
    ("self.clipper.clip(model.parameters())", True),
    ("gradClipper.step(model.parameters())", True),
    ("self.grad_scaler.step(optimizer)", False),
    ("scheduler.step()", False),
])
def test_a_method_of_a_clipper_reads_gradients(statement, reads):
    """A project's own clipper (``GradientClipper(max_grad_norm=1.0).step(params)``) read the
    gradients apex had unscaled: left before the step with no ``unscale_`` or marker, it clipped
    the scaled ones (the update then ~1/65536 of apex's). A scaler named ``grad_...`` is no reader."""
    import libcst as cst

    from migrate import grad_readers

    assert grad_readers.reads_grads(cst.parse_module(statement + "\n").body[0]) is reads
