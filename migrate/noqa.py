"""What a file's comments tell the linter: ``# noqa`` directives and ``# ampmigrate: skip-file``.

As Ruff reads them:

- ``# noqa: AMP100`` (or a list, ``# noqa: AMP100, AMP101``) on the line a finding is reported on
  suppresses that finding, and its fix, for those codes; a bare ``# noqa`` suppresses every code.
- The line of a finding is the line it starts on, except inside a multi-line string (the directive
  goes after the closing quotes) or a statement continued with backslashes (it goes on the last line).
- ``# ampmigrate: skip-file`` on a line of its own leaves the whole file alone.

A directive's codes that suppressed nothing are *unused* (``AMP800``). Only codes of the rules
that ran, and ``AMP`` codes no rule has, are reported: other tools' codes and a bare ``# noqa``
belong to other linters too, and a rule left out of this run may well need its directive.
Nothing here imports libcst.
"""
from __future__ import annotations

import bisect
import io
import itertools
import re
import tokenize
from dataclasses import dataclass, field
from typing import Collection, Iterable, NamedTuple

from migrate import quiet
from migrate.types import UNUSED_NOQA_CODE

__all__ = ["Directive", "Directives", "Unused", "add_directives", "remove_unused", "skips_file", "unused"]

_SKIP_FILE = re.compile(r"^[ \t]*#[ \t]*ampmigrate:[ \t]*skip-file[ \t]*$", re.MULTILINE | re.IGNORECASE)
_CODE = r"[A-Z]+[0-9]+"
# "# noqa" alone, or "# noqa: CODE, CODE" (codes separated by commas and/or spaces).
_DIRECTIVE = re.compile(
    rf"#\s*(?i:noqa)(?:(?P<colon>:\s*)(?P<codes>{_CODE}(?:(?:\s*,\s*|[ \t]+){_CODE})*)|(?![\w:-]))"
)
_QUICK = re.compile(r"noqa", re.IGNORECASE)


def skips_file(text: str) -> bool:
    """Whether ``text`` has a ``# ampmigrate: skip-file`` line."""
    return "skip-file" in text and _SKIP_FILE.search(text) is not None


@dataclass(eq=False)
class Directive:
    """One ``# noqa`` in a comment: its row, where it sits in the line, its codes (None: bare)."""

    row: int
    start: int  # column (0-based) of its "#" in the line
    comment_start: int  # column of the comment holding it ("# type: ignore  # noqa")
    end: int  # column just past its last code
    codes: tuple[str, ...] | None
    used: set[str] = field(default_factory=set)  # the codes that suppressed a finding


class Directives:
    """The ``# noqa`` directives of a text, found from its tokens, and the line each finding maps to."""

    def __init__(self, text: str, *, lines_moved: bool = False) -> None:
        """``lines_moved``: where each row's directive goes is wanted even with no directive yet."""
        self.text = text
        self.by_row: dict[int, Directive] = {}
        self._moved: dict[int, int] = {}  # a row inside a multi-line string or continuation -> its directive row
        if lines_moved or _QUICK.search(text):
            self._read(text)

    def row_of(self, row: int) -> int:
        """The row a directive for a finding starting on ``row`` goes on."""
        return self._moved.get(row, row)

    def __bool__(self) -> bool:
        return bool(self.by_row)

    def suppresses(self, row: int, code: str) -> bool:
        """Whether a finding ``code`` starting on ``row`` is suppressed (and marks the directive used)."""
        directive = self.by_row.get(self.row_of(row))
        if directive is None:
            return False
        if directive.codes is None:
            return True
        if code in directive.codes:
            directive.used.add(code)
            return True
        return False

    def _read(self, text: str) -> None:
        lines = text.split("\n")  # rows as tokenize counts them (a form feed ends no line)
        last_on_row: dict[int, int] = {}
        try:
            for first, part in _parts_with_directives(text, lines):
                for token in tokenize.generate_tokens(io.StringIO(part).readline):
                    self._read_token(token, first, lines, last_on_row)
        except (tokenize.TokenError, SyntaxError):  # libcst parsed it; tokenize may still balk: read lines
            self.by_row.clear()
            self._moved.clear()
            for row, line in enumerate(lines, start=1):
                if "#" in line:
                    self._add(row, line, line.index("#"))
            return
        # A line ending in a backslash continues on the next: the directive goes on the last one.
        continued = {
            row for row, kind in last_on_row.items()
            if kind != tokenize.COMMENT and row <= len(lines) and lines[row - 1].rstrip("\r").endswith("\\")
        }
        for row in sorted({*self._moved, *continued}):  # follow the chain: a string's end may be continued
            target = row
            while True:
                following = self._moved.get(target, target)
                following += following in continued
                if following == target:
                    break
                target = following
            self._moved[row] = target

    def _read_token(self, token: tokenize.TokenInfo, first: int, lines: list[str], last_on_row: dict[int, int]) -> None:
        """One token of the lines from row ``first`` + 1 on."""
        kind = token.type
        start_row, start_col, end_row = token.start[0] + first, token.start[1], token.end[0] + first
        if kind == tokenize.COMMENT:
            self._add(start_row, lines[start_row - 1], start_col)
        elif end_row > start_row and kind not in (tokenize.NL, tokenize.NEWLINE):  # a multi-line string
            for row in range(start_row, end_row):
                self._moved[row] = end_row
        if kind not in (tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.DEDENT):
            last_on_row[end_row] = kind

    def _add(self, row: int, line: str, column: int) -> None:
        match = _DIRECTIVE.search(line, column)
        if match is None:
            return
        codes = tuple(re.findall(_CODE, match.group("codes"))) if match.group("codes") else None
        self.by_row[row] = Directive(row, match.start(), column, match.end(), codes)


def _parts_with_directives(text: str, lines: list[str]) -> list[tuple[int, str]]:
    """The parts of ``text`` to tokenize, each with the number of lines before it: the whole text;
    or, when the run's ``ast`` tree of it is at hand (a large file's, kept from its cut into
    pieces), the top-level statements (with the lines after them) that hold a ``# noqa``
    (tokenize reads about 3 MB a second). A multi-line string or a continuation never leaves its
    top-level statement, so the rows a directive covers are all in its part."""
    tree = quiet.kept_tree(text)
    if tree is None or "\r" in text.replace("\r\n", ""):  # ast counts a lone CR as a line end
        return [(0, text)]
    statements = tree.body
    starts = [0]  # the first line (0-based) of each part
    for previous, statement in zip(statements, statements[1:]):
        first = min([statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", ()))]) - 1
        if first >= previous.end_lineno and first > starts[-1]:
            starts.append(first)
    line_starts = [0, *itertools.accumulate(len(line) + 1 for line in lines)]
    wanted = sorted({bisect.bisect_right(starts, bisect.bisect_right(line_starts, match.start()) - 1) - 1
                     for match in _DIRECTIVE.finditer(text)})
    ends = [*starts[1:], len(lines)]
    return [(starts[k], text[line_starts[starts[k]]:line_starts[ends[k]]]) for k in wanted]


class Unused(NamedTuple):
    """A directive's codes that suppressed nothing; ``unknown``: those no rule has."""

    directive: Directive
    codes: tuple[str, ...]
    unknown: tuple[str, ...]

    @property
    def message(self) -> str:
        parts = []
        unused = [code for code in self.codes if code not in self.unknown]
        if unused:
            parts.append(f"unused: {', '.join(unused)}")
        if self.unknown:
            parts.append(f"unknown: {', '.join(self.unknown)}")
        return f"Unused `noqa` directive ({'; '.join(parts)})"


def unused(directives: Directives, ran: Collection[str], known: Collection[str]) -> list[Unused]:
    """The directives with codes of rules that ``ran`` (or ``AMP`` codes not ``known``) that suppressed nothing."""
    found = []
    for directive in directives.by_row.values():
        if directive.codes is None or UNUSED_NOQA_CODE in directive.codes:  # "# noqa: AMP800, ..." keeps them all
            continue
        idle = tuple(
            code for code in directive.codes
            if code not in directive.used and (code in ran or (code.startswith("AMP") and code not in known))
        )
        if idle:
            found.append(Unused(directive, idle, tuple(code for code in idle if code not in known)))
    return sorted(found, key=lambda item: item.directive.row)


def remove_unused(text: str, found: Iterable[Unused]) -> str:
    """``text`` without the unused codes; a directive left with no code is removed with the
    spaces before it, and whatever the comment says besides stays."""
    found = list(found)
    if not found:
        return text
    lines = text.split("\n")
    for item in found:
        directive = item.directive
        line = lines[directive.row - 1]
        body = line.rstrip("\r")
        ending = line[len(body):]
        kept = [code for code in directive.codes or () if code not in item.codes]
        before, after = body[: directive.start], body[directive.end :]
        if kept:
            body = f"{before}# noqa: {', '.join(kept)}{after}"
        else:
            rest = after.strip().lstrip("#").strip()
            code_part = before.rstrip()
            if directive.start != directive.comment_start:  # "# type: ignore  # noqa: AMP001"
                body = code_part + (f"  # {rest}" if rest else "")
            elif rest:
                body = f"{code_part}  # {rest}" if code_part else f"{before}# {rest}"
            else:
                body = code_part
        lines[directive.row - 1] = body + ending
    return "\n".join(lines)


def add_directives(text: str, findings: Iterable[tuple[int, str]]) -> tuple[str, int]:
    """``text`` with ``# noqa: CODE`` for each finding ``(row, code)`` (Ruff's ``--add-noqa``), on
    the line its directive goes on (after a multi-line string, on a continuation's last line): its
    codes added to a directive there already, or the directive put at the line's end, before any
    comment the line has. A bare ``# noqa`` there already covers every code. Returns the new
    text and the number of codes added."""
    directives = Directives(text, lines_moved=True)
    wanted: dict[int, list[str]] = {}
    for row, code in findings:
        codes = wanted.setdefault(directives.row_of(row), [])
        if code not in codes:
            codes.append(code)
    comments = _comment_columns(text)
    lines = text.split("\n")
    added = 0
    for row, codes in sorted(wanted.items()):
        line = lines[row - 1]
        body = line.rstrip("\r")
        ending = line[len(body):]
        existing = directives.by_row.get(row)
        if existing is not None:
            new = [] if existing.codes is None else [code for code in codes if code not in existing.codes]
            if new:
                merged = ", ".join([*existing.codes, *new])
                body = f"{body[:existing.start]}# noqa: {merged}{body[existing.end:]}"
        else:
            new = codes
            column = comments.get(row)
            directive = f"# noqa: {', '.join(codes)}"
            if column is None:
                body = f"{body.rstrip()}  {directive}"
            elif body[:column].strip():  # code, then a comment: the directive between them
                body = f"{body[:column].rstrip()}  {directive} {body[column:]}"
            else:
                body = f"{body[:column]}{directive} {body[column:]}"
        added += len(new)
        lines[row - 1] = body + ending
    return "\n".join(lines), added


def _comment_columns(text: str) -> dict[int, int]:
    """The column of each line's comment, from the tokens (a ``#`` in a string is none)."""
    found: dict[int, int] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                found[token.start[0]] = token.start[1]
    except (tokenize.TokenError, SyntaxError):
        pass
    return found
