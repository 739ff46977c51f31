"""Lines continued by a backslash move with their statement when the rewrite puts it under
``with torch.autocast(...):``: libcst indents a bracket's lines with the block but writes a
backslash's as they were, so ``loss = a + \\`` kept its next line at the old depth, left of the
statement it belongs to. Over the statement continued (the forward pass, the loss, one in an ``if``
in the region), one or two continued lines, the file's indentation (two or four spaces) and its
line endings, each continued line keeps its offset from its statement's first line."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

CONTINUED = {
    "forward": ["out = model(x) \\", "    * scale"],
    "loss": ["loss = criterion(out, y) + \\", "    0.1 * out.abs().mean() + \\", "    0.01 * out.pow(2).mean()"],
    "in_if": ["if scale > 1:", "    out = out + \\", "        out.mean()"],
}


def _source(continued: str, lines: int, unit: str, newline: str) -> str:
    block = CONTINUED[continued]
    if continued == "loss" and lines == 1:
        block = [block[0], "    0.1 * out.abs().mean()"]
    def indented(line: str, depth: int) -> str:
        stripped = line.lstrip(" ")
        return unit * depth + unit * ((len(line) - len(stripped)) // 4) + stripped
    body = ["from apex import amp", "", "", "def train(model, optimizer, loader, criterion, scale):",
            indented('model, optimizer = amp.initialize(model, optimizer, opt_level="O1")', 1),
            indented("for x, y in loader:", 1)]
    forward = block if continued == "forward" else ["out = model(x)"]
    loss = block if continued == "loss" else ["loss = criterion(out, y)"]
    between = block if continued == "in_if" else []
    for line in [*forward, *between, *loss, "optimizer.zero_grad()", "with amp.scale_loss(loss, optimizer) as scaled_loss:",
                 "    scaled_loss.backward()", "optimizer.step()"]:
        body.append(indented(line, 2))
    return newline.join(body) + newline


def _offsets(source: str, continued: str) -> list[int]:
    """For each line a backslash continues, its indentation less that of the line starting its statement."""
    lines = source.splitlines()
    found, start = [], None
    for index, line in enumerate(lines):
        if index and lines[index - 1].endswith("\\"):
            found.append(len(line) - len(line.lstrip()) - start)
        else:
            start = len(line) - len(line.lstrip())
    return found


@pytest.mark.parametrize("continued, lines, unit, newline",
                         [case for case in itertools.product(CONTINUED, [1, 2], ["    ", "  "], ["\n", "\r\n"])
                          if case[1] == 1 or case[0] == "loss"])
def test_backslash_lines_keep_their_place_under_the_new_block(continued, lines, unit, newline):
    source = _source(continued, lines, unit, newline)
    new = migrate_source(source, "train.py").new_source
    assert new is not None and "with torch.autocast(" in new, new
    assert _offsets(new, continued) == _offsets(source, continued) and _offsets(source, continued), new
    compile(new, "train.py", "exec")
    assert migrate_source(new, "train.py").new_source in (None, new), "not idempotent"
