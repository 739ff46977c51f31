"""libcst's parse of a module, in pieces when the module is large.

libcst's parser takes time and memory that grow faster than a module's size: a 5 MB module took
32 s and 2.8 GB whole, 13 s and 0.7 GB as pieces of about 64 KB. A large module is cut between
top-level statements (found with ``ast``: 2 s for those 5 MB), each piece is parsed alone, and the
pieces' statements are joined into one ``Module``: the same tree as parsing it whole
(``tests/migrate/test_parsing.py`` compares them node for node). Where that cannot be vouched for,
the module is parsed whole: ``ast`` cannot read it, a piece does not parse, or the pieces disagree
on the module's default indentation or line end (libcst takes the first of the file; a piece would
take its own).
"""
from __future__ import annotations

import re

import libcst as cst

from migrate import quiet

__all__ = ["parse_module"]

# Pieces of about this many characters (libcst's time per character grows beyond it); a module
# under four pieces is parsed whole: the gain would not pay for the look with ast.
PIECE_SIZE = 64 * 1024
_LINE_END = re.compile(r"\r\n|\r|\n")


def parse_module(text: str, piece_size: int | None = None) -> cst.Module:
    """``libcst.parse_module(text)``, in pieces of about ``piece_size`` (default ``PIECE_SIZE``) characters."""
    piece_size = piece_size or PIECE_SIZE
    if len(text) < 4 * piece_size:
        return cst.parse_module(text)
    pieces = _pieces(text, piece_size)
    if len(pieces) < 2:
        return cst.parse_module(text)
    try:
        modules = [cst.parse_module(piece) for piece in pieces]
    except cst.ParserSyntaxError:
        return cst.parse_module(text)  # its error, located in the whole text
    first = modules[0]
    if any(m.default_indent != first.default_indent or m.default_newline != first.default_newline for m in modules):
        return cst.parse_module(text)
    body: list[cst.BaseStatement] = []
    before: tuple[cst.EmptyLine, ...] = ()
    for module in modules:
        statements = list(module.body)
        if before:  # the comment and blank lines ending the previous piece lead this piece's first statement
            statements[0] = statements[0].with_changes(leading_lines=(*before, *statements[0].leading_lines))
        body += statements
        before = tuple(module.footer)
    last = modules[-1]
    return first.with_changes(body=body, footer=last.footer, has_trailing_newline=last.has_trailing_newline)


def _pieces(text: str, piece_size: int) -> list[str]:
    """``text`` cut at the first line of top-level statements (a decorator's, if any), into pieces
    of at least ``piece_size`` characters; one piece where ``ast`` cannot read it."""
    try:
        tree = quiet.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [text]
    if len(tree.body) < 2:
        return [text]
    offsets = [0, *(end.end() for end in _LINE_END.finditer(text))]  # where each line starts, as ast counts lines
    pieces, start, previous_end = [], 0, tree.body[0].end_lineno
    for statement in tree.body[1:]:  # each piece holds a statement
        first = min([statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", ()))]) - 1
        if (first >= previous_end and offsets[first] - offsets[start] >= piece_size
                and _starts_a_line(text, offsets[first]) and _plain_gap(text, offsets[previous_end:first + 1])):
            pieces.append(text[offsets[start]:offsets[first]])
            start = first
        previous_end = statement.end_lineno
    pieces.append(text[offsets[start]:])
    return pieces


def _plain_gap(text: str, starts: list[int]) -> bool:
    """Whether the lines between two statements (``starts``: where each begins, then where the next
    statement does) are blank or column-0 comments: libcst loses a line of only spaces at the end of
    a piece (``"import json\\n\\n    \\n"`` comes back one line short)."""
    return all(text[start] in "#\r\n" for start in starts[:-1])


def _starts_a_line(text: str, offset: int) -> bool:
    """Whether the line at ``offset`` starts a logical line at column 0: a statement after a
    backslash (``a = 1; \\``) continues the line before it, as one indented does."""
    return not text[offset].isspace() and not text[max(0, offset - 3):offset].rstrip("\r\n").endswith("\\")
