"""What other files of a project hand a training function: tensors a forward pass made there.

A loss computed from a parameter (``def gen_update(self, x_ab, x_a)``) is cast by apex O1 all
the way back to the forward pass that made ``x_ab``, wherever it ran: apex patched torch for
the whole process. The autocast region a rewrite puts in ``gen_update`` does not reach a forward
pass run by its caller (``x_ab = trainer.forward(x)`` in ``train.py``), which then runs in fp32.
The file alone cannot see that caller: so each file that scales a loss inside a function with
parameters is told (``SETTING``) where its project (``files.project_root``, searched on disk
even when one file is given) calls that function by name, and which argument each call binds to
what a call made (``x_ab, x_ba = trainer.forward(x)``: the first two to ``forward``). The plan
(``apex_plan.autocast``) then asks whether that maker runs a model of the file.

Decided on ``ast`` only, and per function of the caller without its order: a name the caller
binds from a call anywhere in the function counts, so an argument rebound afterwards may still
count (the rewrite is then only reported unsafe, never made wrong).
"""
from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from migrate import disk_reads, quiet
from migrate.files import in_project, project_python_files, project_root

__all__ = ["SETTING", "Handed", "handed_elsewhere", "own_nodes"]

SETTING = "forward-callers"  # the setting that hands a file these calls (not a user setting)
_MOST_NAMES = 8  # functions of one file searched for: a training file scales its loss in few


class Handed(NamedTuple):
    """At ``place`` (``path:line``, relative to the project), a call of ``function`` binds the
    parameter at ``key`` (an index among the arguments after ``self``, or a keyword) to what a
    call of ``maker`` returned (``trainer.forward(x)``: ``"forward"``)."""

    function: str
    place: str
    key: int | str
    maker: str


def handed_elsewhere(texts: Mapping[Path, str]) -> dict[Path, tuple[Handed, ...]]:
    """For each file in ``texts`` that scales a loss inside a function with parameters, the calls
    of those functions by other files of its project that hand them what a call made."""
    wanted: dict[Path, tuple[str, ...]] = {}
    for path, text in texts.items():
        names = _scaling_functions(text) if "scale_loss" in text else ()
        if names:
            wanted[path] = names
    by_root: dict[Path, set[str]] = {}
    for path, names in wanted.items():
        by_root.setdefault(project_root(path), set()).update(names)
    found: dict[Path, tuple[Handed, ...]] = {}
    for path, names in wanted.items():
        calls = _calls(project_root(path), frozenset(by_root[project_root(path)]))
        mine = tuple(call for file, call in calls if file != path.resolve() and call.function in names)
        if mine:
            found[path] = mine
    return found


def _scaling_functions(text: str) -> tuple[str, ...]:
    """The names of the functions that call ``scale_loss`` in their own body and take a parameter
    besides ``self``/``cls``."""
    tree = quiet.parse_or_none(text)
    if tree is None:
        return ()
    names = []
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and _takes_parameters(function) and any(
            isinstance(node, ast.Call) and _callee(node) == "scale_loss" for node in own_nodes(function)
        ):
            names.append(function.name)
    return tuple(dict.fromkeys(names))[:_MOST_NAMES]


def _takes_parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    arguments = function.args
    return any(a.arg not in ("self", "cls") for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs))


@disk_reads.cached(maxsize=64)
def _calls(root: Path, names: frozenset[str]) -> tuple[tuple[Path, Handed], ...]:
    """Every call of one of ``names`` in the project's files, each read once, with its file."""
    found = []
    needles = [name.encode() + b"(" for name in names]
    for file in project_python_files(root):
        try:
            data = file.read_bytes()
        except OSError:
            continue
        if not any(needle in data for needle in needles) or not in_project(file, root):
            continue  # no call, or a project of its own inside this one
        try:
            tree = quiet.parse(data)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        place = str(file.relative_to(root)) if file.is_relative_to(root) else str(file)
        for scope in ast.walk(tree):
            if isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [(file, call) for call in _handed_in(scope, names, place)]
    return tuple(found)


def _handed_in(scope: ast.AST, names: frozenset[str], place: str) -> Iterator[Handed]:
    own = list(own_nodes(scope))
    made: dict[str, set[str]] = {}  # a name the scope binds -> the callees whose results it was bound to
    for node in own:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for bound in ast.walk(target):
                    if isinstance(bound, ast.Name):
                        made.setdefault(bound.id, set()).add(_callee(node.value))
    for call in own:
        if not isinstance(call, ast.Call) or _callee(call) not in names:
            continue
        keyed = [(index, arg) for index, arg in enumerate(call.args)]
        if any(isinstance(arg, ast.Starred) for arg in call.args):
            keyed = keyed[: next(i for i, arg in enumerate(call.args) if isinstance(arg, ast.Starred))]
        keyed += [(keyword.arg, keyword.value) for keyword in call.keywords if keyword.arg is not None]
        for key, value in keyed:
            while isinstance(value, (ast.Subscript, ast.Attribute)):  # `out[0]`, `out.logits`: what `out` was
                value = value.value
            makers = {_callee(value)} if isinstance(value, ast.Call) else made.get(value.id, set()) if isinstance(value, ast.Name) else set()
            for maker in sorted(makers - {""}):
                yield Handed(_callee(call), f"{place}:{call.lineno}", key, maker)


def own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope``'s own body: a function, class or lambda defined in it is given, but
    not what it holds (``ast``'s counterpart of ``apex_nodes.own_code``)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
