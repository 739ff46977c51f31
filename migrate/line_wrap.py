"""Lay out the lines a fix wrote that run past the file's line limit, as a formatter would.

A fix writes a line whole (a call with one more argument, a statement moved one level deeper
under ``torch.autocast``, a scale factor with its condition). Where such a line is longer than
the file's own longest line (or 88), it is split the way Black splits: at the last bracket pair
that holds something (``head(`` / contents / ``)``), the contents one element a line at their
commas, or else at a conditional expression's ``if``/``else``, or at ``and``/``or``; a header or
right-hand side with no bracket of its own is put in parentheses first.

Only whitespace inside brackets changes (plus a trailing comma after a split list, and the added
parentheses), and a layout is kept only if the file's syntax tree is the same as before: a
line that cannot be split that way stays as it is.
"""
from __future__ import annotations

import ast
import io
import tokenize
from collections import Counter
from typing import NamedTuple

__all__ = ["fit_new_lines", "line_limit"]

_INDENT = "    "
_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = {")", "]", "}"}
_HEADERS = ("if ", "elif ", "while ", "return ", "assert ")


class _Token(NamedTuple):
    kind: int
    text: str
    start: int  # offsets in the line
    end: int
    depth: int  # brackets open before it


def line_limit(text: str) -> int:
    """How long a line a fix may write in ``text``: its longest, or 88 if that is shorter."""
    return max(88, max((len(line) for line in text.splitlines()), default=0))


def fit_new_lines(before: str, after: str, limit: int | None = None) -> str:
    """``after`` with each of its lines that ``before`` does not have and that is longer than
    ``limit`` (``before``'s own limit by default) split over several lines, where that can be
    done without changing the code."""
    limit = line_limit(before) if limit is None else limit
    had = Counter(before.splitlines())
    lines = after.splitlines(keepends=True)
    long = [index for index, line in enumerate(lines)
            if len(line.rstrip("\r\n")) > limit and not had[line.rstrip("\r\n")]]
    if not long:
        return after
    try:
        tree, depths = _dump(after), _depth_at_line_starts(after)
    except (SyntaxError, ValueError, tokenize.TokenError):
        return after
    for index in reversed(long):  # from the end, so the indices above stay right
        if index + 1 not in depths:  # inside a string
            continue
        line = lines[index]
        ending = line[len(line.rstrip("\r\n")):] or "\n"
        wrapped = _fit_line(line.rstrip("\r\n"), limit, inside_brackets=depths[index + 1] > 0)
        if wrapped is None:
            continue
        candidate = lines[:index] + [text + ending for text in wrapped] + lines[index + 1:]
        try:
            same = _dump("".join(candidate)) == tree
        except (SyntaxError, ValueError):
            same = False
        if same:
            lines = candidate
    return "".join(lines)


def _depth_at_line_starts(text: str) -> dict[int, int]:
    """For each line that starts with code (not inside a string), the brackets open before it."""
    depths: dict[int, int] = {}
    depth = 0
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        depths.setdefault(token.start[0], depth)
        if token.type == tokenize.OP and token.string in _OPENERS:
            depth += 1
        elif token.type == tokenize.OP and token.string in _CLOSERS:
            depth -= 1
    return depths


def _dump(text: str) -> str:
    return ast.dump(ast.parse(text))


def _fit_line(line: str, limit: int, *, inside_brackets: bool) -> list[str] | None:
    indent = line[: len(line) - len(line.lstrip())]
    tokens = _tokens(line.strip())
    if tokens is None or any(t.kind == tokenize.OP and t.text == ";" and t.depth == 0 for t in tokens):
        return None
    body, comment = line.strip(), ""
    if tokens and tokens[-1].kind == tokenize.COMMENT:
        body, comment = body[: tokens[-1].start].rstrip(), "  " + tokens[-1].text
        tokens = tokens[:-1]
    if len(indent) + len(body) <= limit:  # a comment is not split (as a formatter leaves it)
        return None
    if inside_brackets:  # a line of a bracket's contents: any token may end it
        lines = _split_contents(indent, body, limit)
        lines = None if lines == [line] else lines
    else:
        lines = _split_statement(indent, body, tokens, limit)
    if lines is None or max(len(text) for text in lines) >= len(line):
        return None
    if comment:  # on the first line, where a `# noqa` for the statement is read
        lines[0] += comment
    return lines


def _split_statement(indent: str, body: str, tokens: list[_Token], limit: int) -> list[str] | None:
    """``head(`` / contents / ``)tail``: at the last bracket pair with contents where only
    closers follow it, else around a header's condition or an assignment's value, else at
    that last bracket pair anyway."""
    last = _right_hand(body, tokens)
    fits = last is not None and len(indent) + len(last[0]) <= limit
    choices = [last if fits and _trivial(last[2]) else None, _parenthesized(body, tokens), last if fits else None]
    parts = next((choice for choice in choices if choice is not None), None)
    if parts is None:
        return None
    head, inner, tail = parts
    if len(indent) + len(head) > limit:
        return None
    return [indent + head, *_split_contents(indent + _INDENT, inner, limit), indent + tail]


def _trivial(tail: str) -> bool:
    """Only closing brackets, commas, a colon, attributes or ``as name`` after the split."""
    tokens = _tokens(tail.lstrip(")]}")) if tail.lstrip(")]}") else []
    return tokens is not None and all(
        token.text in (",", ":", ".", "(", ")", "[", "]") or token.kind == tokenize.NAME and token.text not in ("and", "or", "if", "else", "not", "in", "is")
        for token in tokens
    )


def _right_hand(body: str, tokens: list[_Token]) -> tuple[str, str, str] | None:
    for index in range(len(tokens) - 1, -1, -1):
        token = tokens[index]
        if token.depth == 0 and token.kind == tokenize.OP and token.text in _OPENERS:
            end = _closing(tokens, index)
            closing = tokens[end]
            inner = body[token.end: closing.start].strip()
            # an empty pair (`.cuda()`), or one holding a lone name or number (`.pow(2)`), is a
            # trailer: split the one before it
            if inner and not (end == index + 2 and tokens[index + 1].kind in (tokenize.NAME, tokenize.NUMBER)):
                return body[: token.end], inner, body[closing.start:]
    return None


def _parenthesized(body: str, tokens: list[_Token]) -> tuple[str, str, str] | None:
    """A header's condition or an assignment's value, put in parentheses to be split."""
    colon = body.endswith(":") and tokens[-1].depth == 0
    end = len(body) - 1 if colon else len(body)
    for header in _HEADERS:
        if body.startswith(header) and (colon or header in ("return ", "assert ")):
            return body[: len(header)] + "(", body[len(header): end].strip(), ")" + body[end:]
    equals = [t for t in tokens if t.depth == 0 and t.kind == tokenize.OP and t.text == "="]
    if len(equals) == 1 and not colon:
        return body[: equals[0].end] + " (", body[equals[0].end:].strip(), ")"
    return None


def _split_contents(indent: str, inner: str, limit: int) -> list[str]:
    """The contents of a bracket pair (where any token may end a line), one piece a line."""
    if len(indent) + len(inner) <= limit:
        return [indent + inner]
    tokens = _tokens(inner)
    if tokens is None:
        return [indent + inner]
    trailing = _right_hand(inner, tokens)
    # a call or parenthesized group last (not a subscript) is split before the operators
    trailing = (trailing if trailing and trailing[0].endswith("(") and len(indent) + len(trailing[0]) <= limit
                and _trivial(trailing[2]) else None)
    for split in (_at_commas, _at_words(("if", "else")), _at_words(("and", "or")), _at_comprehension,
                  lambda *_: trailing and [], _at_operators(("+", "-")), _at_operators(("*", "/", "//", "%", "@"))):
        pieces = split(inner, tokens)
        if pieces == [] and trailing:  # `head(` / contents / `)` before splitting at operators
            head, contents, tail = trailing
            return [indent + head, *_split_contents(indent + _INDENT, contents, limit), indent + tail]
        if pieces is not None and len(pieces) > 1:
            return [line for piece in pieces for line in _split_contents(indent, piece, limit)]
    return _split_statement(indent, inner, tokens, limit) or [indent + inner]


def _at_commas(inner: str, tokens: list[_Token]) -> list[str] | None:
    commas = [t for t in tokens if t.depth == 0 and t.kind == tokenize.OP and t.text == ","]
    top_words = {t.text for t in tokens if t.depth == 0 and t.kind == tokenize.NAME}
    if not commas or top_words & {"lambda", "for"}:
        return None
    bounds = [0, *(t.end for t in commas)]
    pieces = [inner[start:end].strip() for start, end in zip(bounds, [*(t.end for t in commas), len(inner)])]
    pieces = [piece for piece in pieces if piece]
    if not pieces[-1].endswith(","):
        pieces[-1] += ","
    return pieces


def _at_words(words: tuple[str, ...]):
    """Before each top-level ``words`` (``if``/``else`` of a conditional expression, ``and``/``or``)."""
    def split(inner: str, tokens: list[_Token]) -> list[str] | None:
        top = [t for t in tokens if t.depth == 0 and t.kind == tokenize.NAME]
        if any(t.text in ("for", "lambda") for t in top):  # a comprehension's `if` is not a split point
            return None
        return _cut(inner, [t.start for t in top if t.text in words])
    return split


def _at_comprehension(inner: str, tokens: list[_Token]) -> list[str] | None:
    """Before each ``for`` of a comprehension's contents and each ``if`` after the first."""
    top = [t for t in tokens if t.depth == 0 and t.kind == tokenize.NAME]
    fors = [t.start for t in top if t.text == "for"]
    if not fors or any(t.text == "lambda" for t in top):
        return None
    asyncs = {t.end + 1 for t in top if t.text == "async"}
    cuts = [t.start for t in top if t.text == "for" and t.start not in asyncs or t.text == "if" and t.start > fors[0]]
    cuts += [t.start for t in top if t.text == "async" and t.end + 1 in fors]
    return _cut(inner, sorted(cuts))


def _at_operators(operators: tuple[str, ...]):
    """Before each top-level binary ``operators`` (a ``-`` after an operator is unary)."""
    def split(inner: str, tokens: list[_Token]) -> list[str] | None:
        if any(t.depth == 0 and t.text in ("for", "lambda") for t in tokens):
            return None
        cuts = [token.start for previous, token in zip(tokens, tokens[1:])
                if token.depth == 0 and token.kind == tokenize.OP and token.text in operators
                and (previous.kind in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING) or previous.text in _CLOSERS)
                and previous.text not in ("and", "or", "not", "if", "else", "in", "is", "return", "lambda")]
        return _cut(inner, cuts)
    return split


def _cut(inner: str, cuts: list[int]) -> list[str] | None:
    if not cuts:
        return None
    bounds = [0, *cuts, len(inner)]
    return [inner[start:end].strip() for start, end in zip(bounds, bounds[1:]) if inner[start:end].strip()]


def _closing(tokens: list[_Token], opening: int) -> int:
    depth = tokens[opening].depth
    for index in range(opening + 1, len(tokens)):
        token = tokens[index]
        if token.kind == tokenize.OP and token.text in _CLOSERS and token.depth == depth:
            return index
    raise ValueError("unbalanced brackets")


def _tokens(text: str) -> list[_Token] | None:
    """The tokens of one line of code with the brackets open before each, or None if the line
    is not whole by itself (an open bracket or string, a continuation)."""
    tokens, depth, in_fstring, fstring_start = [], 0, 0, 0
    fstring_begin, fstring_end = getattr(tokenize, "FSTRING_START", None), getattr(tokenize, "FSTRING_END", None)
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT):
                continue
            if token.start[0] != 1 or token.end[0] != 1:
                return None
            if token.type == fstring_begin:  # an f-string is one string here, its braces not brackets
                in_fstring += 1
                fstring_start = fstring_start if in_fstring > 1 else token.start[1]
                continue
            if in_fstring:
                if token.type == fstring_end:
                    in_fstring -= 1
                    if not in_fstring:
                        tokens.append(_Token(tokenize.STRING, text[fstring_start: token.end[1]], fstring_start, token.end[1], depth))
                continue
            if token.type == tokenize.OP and token.string in _CLOSERS:
                depth -= 1
            if depth < 0:
                return None
            tokens.append(_Token(token.type, token.string, token.start[1], token.end[1], depth))
            if token.type == tokenize.OP and token.string in _OPENERS:
                depth += 1
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    return tokens if depth == 0 and not in_fstring else None
