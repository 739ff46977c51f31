"""A parameter's data made float16 by the file itself: ``param.data = param.data.to(torch.float16)``.

A video-retrieval trainer's validation casts part of the model to float32 for its evaluation and,
after it, back to float16 with ``param.data = param.data.to(torch.float16)``. apex stepped the
float16 gradients those parameters then get; ``GradScaler.unscale_`` refuses them ("Attempting to
unscale FP16 gradients"), so the rewrite crashed at the first step after a validation (a
``compare`` run of the first case below, before the fix: the same losses for two steps, then that
error). Such a file is reported and left on apex in both modes, as one doing ``model.half()`` is.
"""
from __future__ import annotations

import itertools

import pytest
from rewrite_runs import reasons_left_on_apex

from migrate.api import migrate_source

SCRIPT = """import argparse
import torch
import torch.nn as nn
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
args = parser.parse_args()
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
{helper}

for step in range(4):
    loss = model(torch.randn(2, 4).cuda()).pow(2).mean()
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
{in_loop}
"""
# how the parameter's data becomes float16: `param.data = <what>.<cast>`, as (what, cast)
CASTS = {"to_dtype": ("{p}.data", "to(torch.float16)"), "to_keyword": ("{p}.data", "to(dtype=torch.half)"),
         "half": ("{p}.data", "half()"), "type": ("{p}.data", "type(torch.cuda.HalfTensor)"),
         "from_the_parameter": ("{p}", "half()")}
# which parameters: a loop over parameters(), over named_parameters(), or one named directly
WHICH = {
    "parameters": ("for param in model[1].parameters():", "param"),
    "named": ("for name, param in model.named_parameters():", "param"),
    "named_weight": ("", "model[1].weight"),
}
# under a test of the parameter's dtype, or not
TESTED = ("dtype_test", "always")
# where: in a validation function the loop calls, or in the loop itself
WHERE = ("function", "loop")


def _script(cast: str, which: str, tested: str, where: str) -> str:
    loop, parameter = WHICH[which]
    cast_what, the_cast = CASTS[cast]
    lines = [f"{parameter}.data = {cast_what.format(p=parameter)}.{the_cast}"]
    if tested == "dtype_test":
        lines = [f"if {parameter}.dtype == torch.float32:", *("    " + line for line in lines)]
    if loop:
        lines = [loop, *("    " + line for line in lines)]
    if where == "function":
        body = "\n".join("    " + line for line in ["model.eval()", *lines, "model.train()"])
        return SCRIPT.format(helper=f"\n\ndef validate(model):\n{body}\n", in_loop="    if step == 1:\n        validate(model)")
    return SCRIPT.format(helper="", in_loop="    if step == 1:\n" + "\n".join("        " + line for line in lines))


CASES = list(itertools.product(sorted(CASTS), sorted(WHICH), TESTED, WHERE, ("safe", "unsafe")))


@pytest.mark.parametrize(("cast", "which", "tested", "where", "mode"), CASES)
def test_a_parameter_made_float16_keeps_the_file_on_apex(cast, which, tested, where, mode):
    reasons = reasons_left_on_apex(_script(cast, which, tested, where), unsafe=mode == "unsafe")
    assert reasons and all("makes a parameter float16" in reason and "unscale FP16" in reason for reason in reasons), reasons


# float32 casts and float16 copies that are not a parameter's data: rewritten as before
CONTROLS = {
    "to_float32": "    for param in model.parameters():\n        param.data = param.data.float()",
    "a_copy": "    weights = [param.data.half() for param in model.parameters()]",
    "inputs": "    inputs = torch.randn(2, 4).cuda()\n    inputs = inputs.half()",
}


@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_other_casts_are_rewritten(control):
    source = SCRIPT.format(helper=f"\n\ndef validate(model):\n{CONTROLS[control]}\n",
                           in_loop="    if step == 1:\n        validate(model)")
    new = migrate_source(source, "train.py").new_source
    assert "from apex import" not in new and "scaler.step(optimizer)" in new, new
