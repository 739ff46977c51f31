"""apex O0 with a dynamic loss scale asked for (``loss_scale="dynamic"``, or a value known only at
run time) scaled the fp32 loss and skipped a step whose gradients overflowed; the rewrite's
scaler is off for O0, so that step is taken (fresh43 X3: a NaN batch then destroys the weights).
Such a call is unsafe, wherever the level may be O0; a static or absent scale is not. Where the
level is an option read at run time (of any level), a check stops the O0 run with a dynamic scale
instead (as an O2 run stops), unless the file's defaults are that run."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

SCRIPT = """\
import argparse

import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--opt-level", default="O0", choices=["O0", "O1"])
parser.add_argument("--level", default="O1")
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--loss-scale", default=None)
args = parser.parse_args()
model = torch.nn.Linear(4, 1).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level={level}{scale})
for x in [torch.randn(2, 4).cuda()]:
    loss = model(x).pow(2).mean()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""
LEVELS = {  # the level, and whether it may be O0
    "literal O0": ('"O0"', True),
    "literal O1": ('"O1"', False),
    "an option defaulting to O0": ("args.opt_level", True),
    "O1 under a flag, else O0": ('"O1" if args.fp16 else "O0"', True),
    "an option of any level": ("args.level", True),
}
SCALES = {  # the loss_scale argument, and whether it may be dynamic
    "dynamic": (', loss_scale="dynamic"', True),
    "an option": (", loss_scale=args.loss_scale", True),
    "static": (", loss_scale=128.0", False),
    "a static string": (', loss_scale="128.0"', False),
    "absent": ("", False),
    "None": (", loss_scale=None", False),
}


@pytest.mark.parametrize(("level", "scale"), list(itertools.product(LEVELS, SCALES)))
def test_o0_with_a_dynamic_scale_is_unsafe_or_stopped(level, scale):
    (level_text, may_be_o0), (scale_text, may_be_dynamic) = LEVELS[level], SCALES[scale]
    result = migrate_source(SCRIPT.format(level=level_text, scale=scale_text), filename="train.py")
    reasons = " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix)
    stopped = level == "an option of any level" and scale in ("an option", "dynamic")
    assert ("O0 with a dynamic loss scale" in reasons) == (may_be_o0 and may_be_dynamic and not stopped), reasons
    assert ("opt_level O0 with a dynamic loss scale" in result.new_source) == stopped
    if stopped:  # the check stops that run only
        check = result.new_source[result.new_source.index('if args.level == "O0"'):result.new_source.index("scaler =")]
        for level_value, scale_value, stops in [("O0", "dynamic", True), ("O0", None, scale == "dynamic"), ("O1", "dynamic", False)]:
            args = type("Args", (), {"level": level_value, "loss_scale": scale_value})
            if stops:
                with pytest.raises(RuntimeError, match="O0 with a dynamic loss scale"):
                    exec(check, {"args": args})
            else:
                exec(check, {"args": args})


def test_a_run_the_defaults_make_is_not_stopped_but_unsafe():
    source = SCRIPT.replace('default="O1")', 'default="O0")').replace('parser.add_argument("--loss-scale", default=None)',
                                                                       'parser.add_argument("--loss-scale", default="dynamic")')
    result = migrate_source(source.format(level="args.level", scale=", loss_scale=args.loss_scale"), filename="train.py")
    assert any(d.fix.why_unsafe.startswith("O0 with a dynamic loss scale") for d in result.diagnostics if d.fix)
