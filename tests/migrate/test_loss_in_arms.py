"""The forward pass before an ``if`` whose arms each compute the loss and scale its backward pass
(``logits = model(x)``, then ``if accumulate: loss = criterion(logits, y) / n`` with the scaled
backward in that arm, ``else: loss = criterion(logits, y)`` with its own). apex cast the loss
computation too (cross-entropy in float32): each arm's loss goes under a region of its own,
beside the forward's. Before, only the forward was under autocast: the loss was computed from
float16 logits in float16, and the safe rewrite trained differently."""
from __future__ import annotations

import libcst as cst
import pytest

from migrate.api import migrate_source

TEMPLATE = """\
import torch
from apex import amp


def train(model, criterion, optimizer, batches, accumulate, use_amp):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for index, (x, y) in enumerate(batches):
{forward}
        if {test}:
{first_arm}
        else:
{second_arm}
"""
FORWARDS = {"plain": "        logits = model(x)", "tuple": "        logits, features = model(x)",
            "prepared": "        x = x.cuda()\n        logits = model(x)"}
TESTS = {"attribute": "accumulate > 1", "negated": "not accumulate"}


def _arm(loss: str, nested: bool, step_every: bool) -> str:
    scaled = ["with amp.scale_loss(loss, optimizer) as scaled_loss:", "    scaled_loss.backward()"]
    if nested:  # the scaled backward under a flag of its own, a plain one else
        scaled = ["if use_amp:", *("    " + line for line in scaled), "else:", "    loss.backward()"]
    step = ["optimizer.step()", "optimizer.zero_grad()"]
    if not step_every:
        step = ["if (index + 1) % 2 == 0:", *("    " + line for line in step)]
    return "\n".join("            " + line for line in [loss, *scaled, *step])


LOSSES = {"divided": "loss = criterion(logits, y) / 2", "dict": 'loss = sum({"ce": criterion(logits, y)}.values())'}


def _under_autocast(source: str) -> dict[str, bool]:
    """Each ``loss = ...`` line: whether a ``with torch.autocast(...)`` holds it."""
    found: dict[str, bool] = {}

    class Visitor(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (cst.metadata.ParentNodeProvider,)

        def visit_Assign(self, node: cst.Assign) -> None:
            if any(isinstance(t.target, cst.Name) and t.target.value == "loss" for t in node.targets):
                parent, held = node, False
                while parent is not None:
                    parent = self.get_metadata(cst.metadata.ParentNodeProvider, parent, None)
                    if isinstance(parent, cst.With) and "autocast" in cst.Module([]).code_for_node(parent.items[0]):
                        held = True
                found[cst.Module([]).code_for_node(node)] = held

    cst.metadata.MetadataWrapper(cst.parse_module(source)).visit(Visitor())
    return found


@pytest.mark.parametrize("forward", sorted(FORWARDS))
@pytest.mark.parametrize("test", sorted(TESTS))
@pytest.mark.parametrize("losses", [("divided", "dict"), ("dict", "divided")])
@pytest.mark.parametrize("nested, step_every", [(False, False), (True, True), (False, True)])
def test_each_arms_loss_is_computed_under_autocast(forward, test, losses, nested, step_every):
    source = TEMPLATE.format(forward=FORWARDS[forward], test=TESTS[test],
                             first_arm=_arm(LOSSES[losses[0]], nested, step_every=False),
                             second_arm=_arm(LOSSES[losses[1]], nested, step_every))
    result = migrate_source(source, "train.py", unsafe_fixes=True)
    assert result.error is None and "amp.scale_loss" not in result.new_source, result.new_source
    held = _under_autocast(result.new_source)
    assert len(held) == 2 and all(held.values()), result.new_source
    compile(result.new_source, "train.py", "exec")
