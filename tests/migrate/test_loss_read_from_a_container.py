"""The scaled loss read out of what a line binds (``amp.scale_loss(loss_list[0], opt)`` after
``loss_list = compute_loss(out, y)``): apex cast that line, whose cross-entropy ran in float32 on
the float16 logits; the autocast region covers it too, not only the forward pass before it."""
from __future__ import annotations

import ast
import itertools
import textwrap

import pytest

from migrate.api import migrate_source

SCRIPT = '''\
import torch
import torch.nn.functional as F
from apex import amp


def compute_losses(out, y):
    return [F.cross_entropy(out, y), out.float().pow(2).mean()]


def train(model, optimizer, batches):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
{loop}
        out = model(x)
{binding}
{between}
        with amp.scale_loss({read}, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
'''
# the line binding what the scaled loss is read from, and how it is read
CONTAINERS = {
    "list_element": ("loss_list = compute_losses(out, y)", "loss_list[0]"),
    "dict_item": ('losses = {"ce": F.cross_entropy(out, y), "l2": out.pow(2).mean()}', 'losses["ce"]'),
    "summed": ("terms = compute_losses(out, y)", "sum(terms)"),
    "tuple_element": ("ce, l2 = compute_losses(out, y)", "ce + 0.1 * l2"),
    "attribute": ("stats = type('Stats', (), {'loss': F.cross_entropy(out, y)})", "stats.loss"),
}
LOOPS = {"for": "    for x, y in batches:", "enumerate": "    for step, (x, y) in enumerate(batches):",
         "while": "    while batches:\n        x, y = batches.pop()"}
BETWEEN = {"nothing": "", "del": "        del x", "print": "        print(out.shape)"}


def _bound_in_the_region(source: str, binding: str) -> bool:
    tree = ast.parse(source)
    regions = [node for node in ast.walk(tree) if isinstance(node, ast.With)
               and any("autocast" in ast.unparse(item.context_expr) for item in node.items)]
    wanted = ast.unparse(ast.parse(binding.strip()))
    return any(ast.unparse(statement) == wanted for region in regions for statement in region.body)


@pytest.mark.parametrize("container, loop, between", list(itertools.product(CONTAINERS, LOOPS, BETWEEN)))
def test_the_line_binding_what_the_loss_is_read_from_is_under_autocast(container, loop, between):
    binding, read = CONTAINERS[container]
    source = SCRIPT.format(loop=LOOPS[loop], binding=textwrap.indent(binding, " " * 8), between=BETWEEN[between],
                           read=read)
    result = migrate_source(source, "train.py")
    assert "apex" not in result.new_source, [d.message for d in result.diagnostics]
    assert _bound_in_the_region(result.new_source, binding), result.new_source
