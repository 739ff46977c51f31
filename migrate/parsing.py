"""libcst's parse of a module, in pieces when the module is large.

libcst's parser takes time and memory that grow faster than a module's size: a 5 MB module took
32 s and 2.8 GB whole, 13 s and 0.7 GB as pieces of about 64 KB. A large module is cut between
top-level statements (found with ``ast``: 2 s for those 5 MB), each piece is parsed alone, and the
pieces' statements are joined into one ``Module``: the same tree as parsing it whole
(``tests/migrate/test_parsing.py`` compares them node for node), the pieces read with the whole
module's default indentation and line end. Where that cannot be vouched for, the module is parsed
whole: ``ast`` cannot read it, or a piece does not parse.

Given the trigger words of the rules to run, the top-level definitions none of them reads are not
parsed at all: each run of them is one ``Unparsed`` node holding its text (``migrate.unread``), which
generates that text and has no children. A 5 MB module of model code around a few training functions
is then mostly text.
"""
from __future__ import annotations

import re

import libcst as cst

from migrate import quiet
from migrate.unread import Unparsed, unread_statements

__all__ = ["parse_module"]

# Pieces of about this many characters (libcst's time per character grows beyond it); a module
# under four pieces is parsed whole: the gain would not pay for the look with ast.
PIECE_SIZE = 64 * 1024
_LINE_END = re.compile(r"\r\n|\r|\n")


def parse_module(text: str, piece_size: int | None = None, words: tuple[str, ...] | None = None) -> cst.Module:
    """``libcst.parse_module(text)``, in pieces of about ``piece_size`` (default ``PIECE_SIZE``)
    characters. Given the trigger ``words`` of the rules to run, the top-level definitions none of
    them reads are left unparsed (``migrate.unread``)."""
    piece_size = piece_size or PIECE_SIZE
    if len(text) < 4 * piece_size:
        return cst.parse_module(text)
    parts = _parts(text, piece_size, words)
    if len(parts) < 2:
        return cst.parse_module(text)
    try:
        modules, indent = _parse_pieces(parts)
    except cst.ParserSyntaxError:
        return cst.parse_module(text)  # its error, located in the whole text
    body: list[cst.BaseStatement] = []
    before: tuple[cst.EmptyLine, ...] = ()
    for module in modules:
        if isinstance(module, Unparsed):
            body.append(module.with_changes(leading_lines=before))
            before = ()
            continue
        statements = list(module.body)
        if body:  # the comment and blank lines before this piece's first statement are its own
            before += tuple(module.header)
            statements[0] = statements[0].with_changes(leading_lines=(*before, *statements[0].leading_lines))
        body += statements
        before = tuple(module.footer)
    parsed = [module for module in modules if isinstance(module, cst.Module)]
    first, last = parsed[0], parsed[-1]
    return first.with_changes(body=body, default_indent=indent or first.default_indent,
                              footer=last.footer, has_trailing_newline=last.has_trailing_newline)


def _parse_pieces(parts: list[str | Unparsed]) -> tuple[list[cst.Module | Unparsed], str | None]:
    """Each piece's tree as a part of the whole module's. libcst takes a module's default line end
    from its first line and its default indentation from its first indented block, and writes
    only the line ends and indentations that differ from them: a piece alone would take its own.
    So each piece after the first is parsed behind a statement that has the whole module's, which
    is then dropped. Also gives the module's default indentation (None: it has no indented block)."""
    modules: list[cst.Module | Unparsed] = []
    newline = indent = None
    for part in parts:
        if isinstance(part, Unparsed):
            modules.append(part)
            continue
        if newline is None:
            module = cst.parse_module(part)
            newline = module.default_newline
        else:
            lead = f"if 1:{newline}{indent}pass{newline}" if indent is not None else f"pass{newline}"
            module = cst.parse_module(lead + part)
            module = module.with_changes(body=module.body[1:])
        if indent is None and any(map(_has_block, module.body)):
            indent = module.default_indent
        modules.append(module)
    return modules, indent


_CLAUSES = ("body", "orelse", "handlers", "finalbody", "cases")


def _has_block(node: cst.CSTNode) -> bool:
    """Whether a top-level statement has an indented block (its suite, an ``else:``, an
    ``except:``): only those set a module's default indentation."""
    if isinstance(node, cst.IndentedBlock):
        return True
    if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) or node is None:
        return False
    for name in _CLAUSES:
        value = getattr(node, name, None)
        if any(_has_block(clause) for clause in (value if isinstance(value, (list, tuple)) else (value,))):
            return True
    return False


def _parts(text: str, piece_size: int, words: tuple[str, ...] | None) -> list[str | Unparsed]:
    """``text`` cut at the first line of top-level statements (a decorator's, if any), into pieces
    of at least ``piece_size`` characters to parse, and, given ``words``, the runs of definitions
    no rule reads, unparsed; one piece where ``ast`` cannot read it."""
    try:
        tree = quiet.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [text]
    statements = tree.body
    if len(statements) < 2:
        return [text]
    # where each line starts, as ast counts lines, and the end of the text (a last line without a line end)
    offsets = [0, *(end.end() for end in _LINE_END.finditer(text)), len(text)]
    firsts = [min([s.lineno, *(d.lineno for d in getattr(s, "decorator_list", ()))]) - 1 for s in statements]
    ends = [s.end_lineno for s in statements]
    cut_before = [False] + [  # whether a piece may start with statement k
        firsts[k] >= ends[k - 1] and _starts_a_line(text, offsets[firsts[k]])
        and _plain_gap(text, offsets[ends[k - 1]:firsts[k] + 1])
        for k in range(1, len(statements))
    ]
    unread = [False] * len(statements)
    if words is not None:
        eligible = [cut_before[k] and k + 1 < len(statements) and cut_before[k + 1] for k in range(len(statements))]
        texts = [text[offsets[first]:offsets[end]] for first, end in zip(firsts, ends)]
        unread = unread_statements(tree, texts, words, eligible)
    parts: list[str | Unparsed] = []
    start = 0  # where the piece being gathered starts
    k = 0
    while k < len(statements):
        if unread[k]:
            last = k
            while unread[last + 1]:
                last += 1
            if offsets[firsts[k]] > start:
                parts.append(text[start:offsets[firsts[k]]])
            parts.append(Unparsed(code=text[offsets[firsts[k]]:offsets[ends[last]]], statements=last + 1 - k))
            start, k = offsets[ends[last]], last + 1
            continue
        if k and cut_before[k] and not unread[k - 1] and offsets[firsts[k]] - start >= piece_size:
            parts.append(text[start:offsets[firsts[k]]])
            start = offsets[firsts[k]]
        k += 1
    parts.append(text[start:])
    return parts


def _plain_gap(text: str, starts: list[int]) -> bool:
    """Whether the lines between two statements (``starts``: where each begins, then where the next
    statement does) are blank or column-0 comments: libcst loses a line of only spaces at the end of
    a piece (``"import json\\n\\n    \\n"`` comes back one line short)."""
    return all(text[start] in "#\r\n" for start in starts[:-1])


def _starts_a_line(text: str, offset: int) -> bool:
    """Whether the line at ``offset`` starts a logical line at column 0: a statement after a
    backslash (``a = 1; \\``) continues the line before it, as one indented does."""
    return not text[offset].isspace() and not text[max(0, offset - 3):offset].rstrip("\r\n").endswith("\\")
