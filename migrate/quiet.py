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

__all__ = ["cycle_collector_paused", "kept_tree", "parse", "trees_kept", "warnings_off"]


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
    """``ast.parse(source, mode=mode)``, silently and with the cycle collector paused. Within
    ``trees_kept``, a module parsed again is not: its tree is not to be changed."""
    tree = kept_tree(source) if mode == "exec" else None
    if tree is not None:
        return tree
    with warnings_off(), cycle_collector_paused():
        tree = ast.parse(source, mode=mode)
    if _kept is not None and mode == "exec":
        _kept.update(source=source, tree=tree)
    return tree


def parse_or_none(source: str | bytes) -> ast.Module | None:
    """``parse(source)``, or None for a module that does not parse (or is too deep to)."""
    try:
        return parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


_kept: dict | None = None  # the last module ``parse`` read within ``trees_kept``: its source and tree


def kept_tree(source: str | bytes) -> ast.Module | None:
    """The tree ``parse`` keeps of ``source`` (within ``trees_kept``), if it has one: for work that
    pays only where that tree is at hand already."""
    return _kept["tree"] if _kept is not None and _kept.get("source") == source else None


@contextlib.contextmanager
def trees_kept() -> Iterator[None]:
    """Within it, ``parse`` keeps the last module's tree for the next parse of the same text: a
    large file's run asks for it to cut the file in pieces and again to place its findings (1.5 s
    each for 5 MB). A tree kept longer would be scanned by every cycle collection after it."""
    global _kept
    outer, _kept = _kept, ({} if _kept is None else _kept)
    try:
        yield
    finally:
        _kept = outer
