"""Python's own parser and compiler, run on the user's code without printing their warnings.

``ast.parse`` and ``compile`` warn about the code they read: ``"\\d"`` is an invalid escape
sequence (a ``SyntaxWarning`` printed by default from Python 3.12, as ``<unknown>:12: ...``,
naming no file), ``x is not ""`` compares identity with a literal. The code is the user's, read
here only to decide what to parse with libcst or to check that fixes compile: those warnings are
not this tool's to print, and on an old tree they were a screenful.

A parse also runs with the cycle collector paused (``cycle_collector_paused``): a syntax tree is
many objects made at once and kept, which the collector scans again and again as they are made,
ever more of them, to find no cycle (``ast.parse`` of a 5 MB file: 3.4 s, 1.3 s without it).
"""
from __future__ import annotations

import ast
import contextlib
import gc
import warnings
from typing import Iterator

__all__ = ["cycle_collector_paused", "parse", "warnings_off"]


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """No cycle collection inside: for code that builds a large tree of objects, all kept (a parse,
    a file's run of the rules). What it leaves is collected once it is over."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parse(source: str | bytes, mode: str = "exec") -> ast.AST:
    """``ast.parse(source, mode=mode)``, silently and with the cycle collector paused."""
    with warnings_off(), cycle_collector_paused():
        return ast.parse(source, mode=mode)
