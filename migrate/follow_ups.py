"""The fixes that only earlier fixes made possible, as findings of the original text.

The engine applies fixes round after round (``migrate.engine``): removing ``from apex import amp``
leaves the ``try`` around it guarding nothing, and the next round removes that ``try``; a flag the
rewrite made constant is folded in the round after. Those fixes change the file as much as the
first round's, and their messages say what changed (a run without apex now uses mixed precision),
so they are listed with the others: each located at the line of the original text its node came
from (by a line diff of the two texts), with no edits of its own (it applies to a text only the
earlier fixes make).
"""
from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import libcst as cst
from libcst.metadata import CodeRange

from migrate.rule import Report
from migrate.types import Diagnostic, Position

__all__ = ["Applied", "follow_up_diagnostics"]


class Applied(NamedTuple):
    """A fix applied in a round: its report, and the text of that round with its nodes' positions."""

    report: Report
    text: str
    positions: Mapping[cst.CSTNode, CodeRange]


def follow_up_diagnostics(
    source: str,
    first_round: Sequence[Diagnostic],
    rounds: Sequence[Sequence[Applied]],
    diagnostic_of,
) -> tuple[Diagnostic, ...]:
    """The fixes of ``rounds`` after the first that ``first_round`` does not already list.

    A fix nested in another is listed in the first round but applied in the next (the outer one
    is replaced first), so each later fix first takes up an unapplied listing of the same code and
    fix. ``diagnostic_of(report, positions)`` makes a finding of a report.
    """
    listed = Counter((d.code, d.fix.message) for d in first_round if d.applied and d.fix is not None)
    pending = listed - Counter((a.report.code, a.report.fix_message) for a in (rounds[0] if rounds else ()))
    found: list[Diagnostic] = []
    maps: dict[str, _LineMap] = {}
    for applied in (a for round_ in rounds[1:] for a in round_):
        key = (applied.report.code, applied.report.fix_message)
        if pending[key] > 0:
            pending[key] -= 1
            continue
        if applied.text not in maps:
            maps[applied.text] = _LineMap(source, applied.text)
        line_map = maps[applied.text]
        diagnostic = diagnostic_of(applied.report, applied.positions)
        found.append(diagnostic._replace(
            location=line_map.position(diagnostic.location),
            end_location=line_map.position(diagnostic.end_location),
            related=tuple(item._replace(location=line_map.position(item.location), end_location=line_map.position(item.end_location))
                          for item in diagnostic.related),
            applied=True,
        ))
    return tuple(found)


class _LineMap:
    """Lines of a later text mapped to the original's: an unchanged line to itself, a line a fix
    wrote to the first line of what it replaced there."""

    def __init__(self, source: str, text: str) -> None:
        self._original_lines = source.count("\n") + 1
        matcher = difflib.SequenceMatcher(None, source.splitlines(), text.splitlines(), autojunk=False)
        self._blocks = matcher.get_opcodes()

    def position(self, where: Position) -> Position:
        line = where.row - 1
        for tag, start, _end, later_start, later_end in self._blocks:
            if later_start <= line < later_end:
                if tag == "equal":
                    return Position(start + line - later_start + 1, where.column)
                return Position(min(start + 1, self._original_lines), 1)
        return Position(self._original_lines, 1)
