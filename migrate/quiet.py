"""Python's own parser and compiler, run on the user's code without printing their warnings.

``ast.parse`` and ``compile`` warn about the code they read: ``"\\d"`` is an invalid escape
sequence (a ``SyntaxWarning`` printed by default from Python 3.12, as ``<unknown>:12: ...``,
naming no file), ``x is not ""`` compares identity with a literal. The code is the user's, read
here only to decide what to parse with libcst or to check that fixes compile: those warnings are
not this tool's to print, and on an old tree they were a screenful.
"""
from __future__ import annotations

import ast
import contextlib
import warnings
from typing import Iterator

__all__ = ["parse", "warnings_off"]


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def parse(source: str | bytes, mode: str = "exec") -> ast.AST:
    """``ast.parse(source, mode=mode)``, silently."""
    with warnings_off():
        return ast.parse(source, mode=mode)
