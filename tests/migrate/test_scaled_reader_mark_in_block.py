"""A gradient read inside ``amp.scale_loss`` that sits in a block of its own (``if not delay:``,
a loop over the parameters, ``with``, ``try``, an ``elif`` or ``else``) keeps reading scaled
gradients, as under apex, with ``# noqa: AMP101`` on the line AMP101 reports: the block's header
where the lint could put ``unscale_`` before it (the step always follows), the read's own line
where it could not (the step waits for an accumulation boundary). Before, the mark went on the
header only: with no fix AMP101 reported the read inside, the unused-noqa pass removed the
header's directive, and the migrated file had a finding of its own on the next check."""
from __future__ import annotations

import itertools
import textwrap

import pytest

from migrate.api import migrate_source

READS = {  # the reading statement, at the block's indentation
    "one_line": "norms = [p.grad.norm() for p in model.parameters() if p.grad is not None]",
    "brackets_over_lines": "grads = [p.grad.data for p in model.parameters()\n         if p.requires_grad and p.grad is not None]",
    "helper_after": "grads = [p.grad for p in model.parameters()]\ngather(grads)",
}
BLOCKS = {  # the block around the read, "{read}" at its place
    "if": "if not delay:\n    # gather before unscaling\n    {read}",
    "elif": "if delay:\n    pass\nelif step > 0:\n    {read}",
    "else": "if delay:\n    pass\nelse:\n    {read}",
    "for": "for _ in range(1):\n    {read}",
    "with": "with torch.no_grad():\n    {read}",
    "try": "try:\n    {read}\nexcept RuntimeError:\n    pass",
    "except": "try:\n    gather([])\nexcept RuntimeError:\n    {read}",
    "nested": "if not delay:\n    for _ in range(1):\n        {read}",
}
STEPS = {
    "always": "optimizer.step()\noptimizer.zero_grad()",
    "boundary": "if (step + 1) % accum == 0:\n    optimizer.step()\n    optimizer.zero_grad()",
}
SCRIPT = """\
import torch
from apex import amp


def gather(grads):
    for g in grads:
        g.mul_(1.0)


def train(model, optimizer, loader, accum):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        delay = (step + 1) % accum != 0
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
{block}
{step}
"""


def _script(read: str, block: str, step: str) -> str:
    inner = BLOCKS[block]
    indent = inner[inner.index("{read}") - 1::-1].index("\n")  # the read's column in the block
    placed = inner.replace("{read}", textwrap.indent(READS[read], " " * indent).lstrip())
    return SCRIPT.format(block=textwrap.indent(placed, " " * 12), step=textwrap.indent(STEPS[step], " " * 8))


@pytest.mark.parametrize("read, block, step, unsafe", list(itertools.product(READS, BLOCKS, STEPS, (False, True))))
def test_the_mark_stands_where_amp101_reports(read, block, step, unsafe):
    source = _script(read, block, step)
    compile(source, "train.py", "exec")
    result = migrate_source(source, "train.py", unsafe_fixes=unsafe)
    assert result.error is None, result.error
    migrated = result.new_source
    # gradients handed to a helper (which may change them) at a boundary step: apex had set the
    # earlier micro-batches' aside in the block (test_scaled_reads_under_accumulation)
    aside = read == "helper_after" and step == "boundary"
    if aside and not unsafe:
        assert migrated == source
        return
    assert "from apex" not in migrated, migrated
    assert migrated.count("# noqa: AMP101") == 1, migrated
    assert migrated.count("# reads scaled gradients, as apex did inside amp.scale_loss") == 1, migrated
    again = migrate_source(migrated, "train.py", fix=False)
    assert [d.code for d in again.diagnostics] == (["AMP017"] if aside else []), migrated
