"""A fix as Ruff's edits: the smallest text replacements that turn one text into another."""
from __future__ import annotations

import difflib

from migrate.types import Edit, Position

__all__ = ["text_edits"]


def text_edits(before: str, after: str) -> tuple[Edit, ...]:
    """The edits, in order and not overlapping, that make ``after`` out of ``before``.

    Lines are compared first (as a diff does); each changed run of lines is then trimmed of the
    characters it shares at both ends, so a renamed call is one edit of the name, not of the line.
    """
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    starts = _line_starts(old)
    edits = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        removed, added = "".join(old[i1:i2]), "".join(new[j1:j2])
        head = _common_prefix(removed, added)
        tail = _common_prefix(removed[head:][::-1], added[head:][::-1])
        start, end = starts[i1] + head, starts[i1] + len(removed) - tail
        edits.append(Edit(added[head:len(added) - tail], _position(before, start), _position(before, end)))
    return tuple(edits)


def _line_starts(lines: list[str]) -> list[int]:
    starts, offset = [], 0
    for line in lines:
        starts.append(offset)
        offset += len(line)
    starts.append(offset)  # one past the last line: where an edit at the very end starts
    return starts


def _common_prefix(a: str, b: str) -> int:
    size = min(len(a), len(b))
    for index in range(size):
        if a[index] != b[index]:
            return index
    return size


def _position(text: str, offset: int) -> Position:
    """1-based row and column of ``offset`` in ``text`` (columns count characters)."""
    row = text.count("\n", 0, offset) + 1
    line_start = text.rfind("\n", 0, offset) + 1
    return Position(row, offset - line_start + 1)
