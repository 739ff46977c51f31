"""``if flag: opt_level = "O1"; amp.initialize(..., opt_level=opt_level)``: the block sets what
the call reads, so the scaler is made in the block and a disabled one stands in before it. Where
that block runs first in the function and every scaled backward is under a test of the flag, the
stand-in only steps (in fp32 runs) and a plain backward in the flag's other arm is no backward the
scaler must scale: no unsafe reason for either (before, both made the rewrite unsafe); the two arms
are then the one line ``scaler.scale(loss).backward()``."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source

TEMPLATE = """\
import torch
from apex import amp
{extra}

def train({flag_owner}model, optimizer, loader):
{flag_setup}    if {flag}:
        opt_level = "O1"
        model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
{backward}
        optimizer.step()
        optimizer.zero_grad()
"""
FLAGS = {"attribute": ("hparams.fp16_run", "hparams, ", ""), "parameter_copy": ("use_amp", "args, ", "    use_amp = args.amp\n")}
BACKWARDS = {
    "scaled_first": "        if {flag}:\n            with amp.scale_loss(loss, optimizer) as scaled:\n                scaled.backward()\n"
                    "        else:\n            loss.backward()",
    "plain_first": "        if not {flag}:\n            loss.backward()\n        else:\n"
                   "            with amp.scale_loss(loss, optimizer) as scaled:\n                scaled.backward()",
}
# a module-level function reading amp makes the scaler a module global (a disabled one at module level)
GLOBAL = '\n\ndef amp_state():\n    return amp.state_dict()\n'


@pytest.mark.parametrize("flag", sorted(FLAGS))
@pytest.mark.parametrize("backward", sorted(BACKWARDS))
def test_the_block_that_makes_the_scaler_runs_first(flag, backward):
    test, owner, setup = FLAGS[flag]
    source = TEMPLATE.format(extra="", flag_owner=owner, flag_setup=setup, flag=test,
                             backward=BACKWARDS[backward].format(flag=test))
    result = migrate_source(source, "train.py")
    assert "amp.initialize" not in result.new_source and "TODO(ampmigrate)" not in result.new_source, result.new_source
    assert 'GradScaler("cuda", enabled=False)' in result.new_source  # the stand-in, before the block


@pytest.mark.parametrize("flag", sorted(FLAGS))
@pytest.mark.parametrize("backward", sorted(BACKWARDS))
def test_a_plain_backward_in_the_flags_other_arm_needs_no_scaling(flag, backward):
    test, owner, setup = FLAGS[flag]
    source = TEMPLATE.format(extra=GLOBAL, flag_owner=owner, flag_setup=setup, flag=test,
                             backward=BACKWARDS[backward].format(flag=test))
    result = migrate_source(source, "train.py", unsafe_fixes=True)
    assert "amp.initialize" not in result.new_source, result.new_source
    assert "plain backward pass" not in result.new_source, result.new_source
    # the arms folded into one line: where the flag fails the stand-in scaler is disabled and hands the loss back
    assert "\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)" in result.new_source, result.new_source


def test_a_scaled_backward_outside_the_flag_keeps_the_reason():
    """Scaled whatever the flag: where it is off the original failed (apex not initialized), the
    rewrite trains in fp32 with the stand-in."""
    test, owner, setup = FLAGS["attribute"]
    source = TEMPLATE.format(extra="", flag_owner=owner, flag_setup=setup, flag=test,
                             backward="        with amp.scale_loss(loss, optimizer) as scaled:\n            scaled.backward()")
    result = migrate_source(source, "train.py", unsafe_fixes=True)
    assert "a disabled one stands in" in " ".join(result.new_source.replace("#   ", "").split()), result.new_source
