"""An ``if``/``else`` around the scaled backward whose arm stands on its header's line
(``else: loss.backward()``). Folding the two arms into one line read the comment of each arm's
header, which a one-line arm does not have: a rule crashed, and a TTS trainer was left untouched
("AMP901 a rule crashed: AttributeError"). Such arms stay as written, and the rest is migrated.
"""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

HEAD = """import argparse

import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
args = parser.parse_args()
model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
{setup}
for x, y in [(torch.randn(8, 4).cuda(), torch.randn(8, 2).cuda())]:
    optimizer.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
{backward}    optimizer.step()
"""
SETUPS = {
    "block": "if args.fp16:\n    model, optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n",
    "one_line_else": "if args.fp16:\n    model, optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\nelse: print(\"fp32\")\n",
}
SCALED = ("        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
          "            scaled_loss.backward()\n")
BACKWARDS = {
    "else_on_one_line": "    if args.fp16:\n" + SCALED + "    else: loss.backward()\n",
    "if_on_one_line": "    if not args.fp16: loss.backward()\n    else:\n" + SCALED,
    "flag_copy_else_on_one_line": "    fp16 = args.fp16\n    if fp16:\n" + SCALED + "    else: loss.backward()  # fp32\n",
}


@pytest.mark.parametrize(("setup", "backward"), list(itertools.product(sorted(SETUPS), sorted(BACKWARDS))))
def test_a_one_line_arm_is_migrated_without_a_crash(setup, backward):
    source = HEAD.format(setup=SETUPS[setup], backward=BACKWARDS[backward])
    compile(source, "train.py", "exec")
    result = migrate_source(source, "train.py")
    new = result.new_source
    assert "from apex import" not in new and "AMP901" not in str(result), new
    compile(new, "train.py", "exec")
    assert "scaler.scale(loss).backward()" in new and "scaler.step(optimizer)" in new, new
    assert "loss.backward()" in new.replace("scaler.scale(loss).backward()", ""), new  # the plain arm, as written
