"""AMP101 on a read after a loop of micro-batches whose ``scaler.unscale_(optimizer)`` runs inside
the loop, after the scaled backward, under a test of the pass (``if is_last_batch:``), with the
step after the loop. Only an ``unscale_`` on the loop's last pass leaves gradients the step can
take: one on an earlier pass has the next backward add scaled gradients to unscaled ones, and a
second one before ``update()`` raises. So the read after the loop sees unscaled gradients, and
nothing is reported (yurakuratov/t5-experiments' trainer logs the gradient norm there). An
``unscale_`` after the loop under a test of its own, or a loop that also steps, is still reported."""
from __future__ import annotations

import itertools
import textwrap

import pytest

from migrate.api import migrate_source

LOOPS = {  # the loop over micro-batches, "{body}" at the backward's place; `j` numbers the pass
    "enumerate": "for j, chunk in enumerate(chunks):\n    {body}",
    "range": "for j in range(len(chunks)):\n    chunk = chunks[j]\n    {body}",
    "range_step": "for j in range(0, len(chunks), 1):\n    chunk = chunks[j]\n    {body}",
    "while": "j = 0\nwhile j < len(chunks):\n    chunk = chunks[j]\n    {body}\n    j += 1",
}
LAST = {  # how the pass tests for the last micro-batch, before and at the `unscale_`
    "named": ("is_last = j == len(chunks) - 1", "if is_last:"),
    "compare": ("", "if j == len(chunks) - 1:"),
    "plus_one": ("", "if j + 1 == len(chunks):"),
    "not_more": ("more = j < len(chunks) - 1", "if not more:"),
    "at_least": ("", "if j >= len(chunks) - 1:"),
}
READS = {  # after the loop, before the step
    "clip": "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    "norm": "norm = torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]).norm()",
    "helper": "norm = grad_norm(model)",
}
FUNCTION = """\
import torch


def grad_norm(model):
    return torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]).norm()


def train(model, optimizer, loader, scaler):
    for batch in loader:
        chunks = batch.split(4)
{loop}
{read}
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""
BACKWARD = """\
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(chunk).mean() / len(chunks)
{before}
scaler.scale(loss).backward()
{test}
    scaler.unscale_(optimizer)"""


def _indented(text: str, spaces: int) -> str:
    return textwrap.indent(text, " " * spaces)


def _script(loop: str, last: str, read: str, loop_steps: bool = False) -> str:
    before, test = LAST[last]
    if loop_steps:  # the loop steps every other pass: the read after it may see a pass after that step
        before, test = "", "if (j + 1) % 2 == 0:"
    body = BACKWARD.format(before=before, test=test)
    if loop_steps:
        body += "\n    scaler.step(optimizer)\n    scaler.update()"
    body = "\n".join(line for line in body.splitlines() if line.strip())
    head, tail = LOOPS[loop].split("{body}")
    column = len(head) - len(head.rstrip(" ")) if head.endswith(" ") else 0
    text = head + _indented(body, column)[column:] + tail
    source = FUNCTION.format(loop=_indented(text, 8), read=_indented(READS[read], 8))
    compile(source, "train.py", "exec")
    return source


def _codes(source: str) -> set[str]:
    return {d.code for d in migrate_source(source, filename="train.py", fix=False).diagnostics}


@pytest.mark.parametrize("loop, last, read", list(itertools.product(LOOPS, LAST, READS)))
def test_a_read_after_the_loop_that_unscaled_its_last_pass_is_not_reported(loop, last, read):
    assert "AMP101" not in _codes(_script(loop, last, read))


@pytest.mark.parametrize("loop, read", list(itertools.product(LOOPS, READS)))
def test_a_loop_that_also_steps_leaves_the_read_after_it_reported(loop, read):
    assert "AMP101" in _codes(_script(loop, "compare", read, loop_steps=True))  # the test is `(j + 1) % 2 == 0`


@pytest.mark.parametrize("read", READS)
def test_an_unscale_under_a_test_of_its_own_after_the_loop_is_still_reported(read):
    source = _script("enumerate", "compare", read).replace(
        "        " + READS[read], "        if clip:\n            scaler.unscale_(optimizer)\n        " + READS[read])
    source = source.replace("            if j == len(chunks) - 1:\n                scaler.unscale_(optimizer)\n", "")
    compile(source, "train.py", "exec")
    assert "unscale_" not in source.split("for j")[1].split("if clip")[0]
    assert "AMP101" in _codes(source)


@pytest.mark.parametrize("read", READS)
def test_a_loop_without_unscale_is_still_reported(read):
    source = _script("enumerate", "compare", read).replace(
        "            if j == len(chunks) - 1:\n                scaler.unscale_(optimizer)\n", "")
    assert "unscale_" not in source
    assert "AMP101" in _codes(source)
