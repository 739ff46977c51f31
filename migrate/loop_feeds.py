"""Methods running an initialized model whose result a loop hands back to the training.

A reinforcement-learning agent initializes its actor on an instance (``self.actor, self.actor_optimizer
= amp.initialize(self.actor, ...)``) and scales its losses in ``train``; ``select_action(self, s)``
(the agent's, or its base class's in another file) runs ``self.actor(s)``, and the script's loop
pushes what it returns into a replay buffer that it hands to ``agent.train(args, buffer)``. Under
O1, apex cast torch's functions process-wide, so the actions were computed in float16; natively the
method runs in float32 outside every autocast, and the data the agent trains on changes.

So each file that says apex is told (``SETTING``), for each class of its own whose method assigns a
model from ``amp.initialize`` to ``self``, each method of that class, of a base class or of a
subclass of it in the project (searched on disk) that calls that model outside the training
methods (those scaling a loss, or calling one that does), and each call of such a method in a loop
of the project that also calls a training method on the same object, and whose result reaches that
call's arguments (through assignments, loops over it, and objects of the file handed it:
``buffer.push(action)``). The planner decides what that means for its opt level.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from migrate import quiet
from migrate.files import place, project_root, project_trees_saying

__all__ = ["SETTING", "Feed", "elsewhere", "fed_lines"]

SETTING = "model-runs-feeding-training"  # ``Feed`` tuples of a file (not a user setting)

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


class Feed(NamedTuple):
    model: str  # the attribute the model is kept in (``actor`` of ``self.actor``)
    method: str  # the method running it (``select_action``)
    run_at: str  # where it runs the model, ``path:line`` in its project
    run_line: int  # that line where the method is in the file told, else 0
    trainer: str  # the training method the loop calls (``train``)
    fed_at: str  # where the loop calls the method, ``path:line``
    fed_line: int  # that line where the loop is in the file told, else 0


def elsewhere(texts: Mapping[Path, str]) -> dict[Path, tuple[Feed, ...]]:
    """For each file of ``texts``, the ``Feed`` of each of its classes (see the module's docstring)."""
    found = {}
    for path, text in texts.items():
        if "initialize" not in text or "scale_loss" not in text or "class " not in text:
            continue
        tree = quiet.parse_or_none(text)
        if tree is not None and (feeds := tuple(dict.fromkeys(_feeds_of(path, tree)))):
            found[path] = feeds
    return found


def fed_lines(settings: Mapping) -> frozenset[int]:
    """The lines of a file's own loops calling a method of its own that a ``Feed`` names: the
    method's run of the model is planned there (under autocast, or marked), not at the call."""
    return frozenset(feed.fed_line for feed in map(Feed._make, settings.get(SETTING, ())) if feed.fed_line and feed.run_line)


def _feeds_of(path: Path, tree: ast.Module) -> Iterator[Feed]:
    root, me = project_root(path), path.resolve()
    for owner in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        models = _initialized_attributes(owner)
        trainers = _training_methods(owner)
        if not models or not trainers:
            continue
        for file, cls in _lineage(owner, path, root):
            for method in cls.body:
                if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or method.name in trainers \
                        or method.name.startswith("__") or not method.args.args:
                    continue
                runs = [node for node in ast.walk(method) if _runs(node, method.args.args[0].arg, models)]
                if not runs:
                    continue
                model = _runs(runs[0], method.args.args[0].arg, models)
                here = file == me
                for caller, line, trainer in _feeding_calls(root, method.name, trainers):
                    yield Feed(model, method.name, place(file, runs[0].lineno, root), runs[0].lineno if here else 0,
                               trainer, place(caller, line, root), line if caller == me else 0)


def _initialized_attributes(owner: ast.ClassDef) -> set[str]:
    """The attributes a method of ``owner`` assigns a model to from ``amp.initialize``: the first
    argument's ``self.actor`` (or each of a list of them)."""
    found = set()
    for node in ast.walk(owner):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "initialize" and node.args:
            first = node.args[0]
            for item in (first.elts if isinstance(first, (ast.List, ast.Tuple)) else [first]):
                if isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) and item.value.id == "self":
                    found.add(item.attr)
    return found


def _training_methods(owner: ast.ClassDef) -> set[str]:
    """The methods of ``owner`` scaling a loss, and those calling one of them on ``self``."""
    methods = {node.name: node for node in owner.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    trainers = {name for name, method in methods.items() if any(
        isinstance(node, ast.Attribute) and node.attr == "scale_loss" for node in ast.walk(method))}
    grown = True
    while grown:
        callers = {name for name, method in methods.items() if name not in trainers and any(
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in trainers
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "self" for node in ast.walk(method))}
        trainers |= callers
        grown = bool(callers)
    return trainers


def _lineage(owner: ast.ClassDef, path: Path, root: Path) -> list[tuple[Path, ast.ClassDef]]:
    """``owner``, the classes of the project it derives from (by name, up the chain), and those
    of the project naming it as a base."""
    found, seen, names = [(path.resolve(), owner)], {owner.name}, _base_names(owner)
    while names:
        name = names.pop()
        if name in seen:
            continue
        seen.add(name)
        for file, tree in project_trees_saying(root, f"class {name}".encode()):
            for cls in tree.body:
                if isinstance(cls, ast.ClassDef) and cls.name == name:
                    found.append((file.resolve(), cls))
                    names |= _base_names(cls)
    for file, tree in project_trees_saying(root, owner.name.encode()):
        found.extend((file.resolve(), cls) for cls in tree.body
                     if isinstance(cls, ast.ClassDef) and owner.name in _base_names(cls) and cls.name not in seen)
    return found


def _base_names(cls: ast.ClassDef) -> set[str]:
    return {ast.unparse(base).split(".")[-1] for base in cls.bases} - {"object", "Module"}


def _runs(node: ast.AST, own: str, models: set[str]) -> str | None:
    """The model ``node`` runs: ``self.actor(state)`` or ``self.actor.forward(state)``."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "forward":
        func = func.value
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == own and func.attr in models:
        return func.attr
    return None


def _feeding_calls(root: Path, method: str, trainers: set[str]) -> Iterator[tuple[Path, int, str]]:
    """Each call ``agent.method(...)`` of the project in a loop that calls ``agent.<trainer>(...)``
    with what the first call returned: its file, line and the trainer."""
    for file, tree in project_trees_saying(root, f".{method}(".encode()):
        parents = {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        bound = _bound_names(tree)
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == method):
                continue
            loop, receiver = _outermost_loop(call, parents), ast.unparse(call.func.value)
            if loop is None:
                continue
            for trained in ast.walk(loop):
                if isinstance(trained, ast.Call) and isinstance(trained.func, ast.Attribute) and trained.func.attr in trainers \
                        and ast.unparse(trained.func.value) == receiver and _reaches(loop, call, trained, bound):
                    yield file.resolve(), call.lineno, trained.func.attr
                    break


def _outermost_loop(node: ast.AST, parents: dict) -> ast.AST | None:
    """The outermost loop around ``node`` in its own function (or at module level)."""
    loop = None
    while (node := parents.get(id(node))) is not None and not isinstance(node, _SCOPES):
        if isinstance(node, _LOOPS):
            loop = node
    return loop


def _bound_names(tree: ast.Module) -> set[str]:
    """The names the file binds itself (assigned, parameters, loop targets), not those it imports:
    an object of its own may keep what it is handed (a replay buffer); a module does not."""
    imported = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    bound = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    bound |= {arg.arg for node in ast.walk(tree) if isinstance(node, ast.arguments)
              for arg in (*node.posonlyargs, *node.args, *node.kwonlyargs)}
    return bound - imported


def _reaches(loop: ast.AST, source: ast.Call, trained: ast.Call, bound: set[str]) -> bool:
    """Whether what ``source`` returns reaches ``trained``'s arguments in ``loop``: through names
    (and ``self.buffer``-like attributes) assigned from it, loop targets over it, and objects of
    the file handed it (``buffer.push(a)``, ``self.memory.append(a)``)."""
    reached: set[str] = set()

    def reads(expression: ast.AST) -> bool:
        return any(node is source or (isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load)
                                      and _path(node) in reached) for node in ast.walk(expression))

    grown = True
    while grown:
        before = len(reached)
        for node in ast.walk(loop):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None and reads(node.value):
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    reached |= _bound_paths(target)
            elif isinstance(node, (ast.For, ast.AsyncFor)) and reads(node.iter):
                reached |= _bound_paths(node.target)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node is not source \
                    and (holder := _path(node.func.value)) is not None and holder.split(".")[0] in bound \
                    and any(reads(arg) for arg in (*node.args, *(keyword.value for keyword in node.keywords))):
                reached.add(holder)  # an object of the file handed it may keep it
        grown = len(reached) > before
    return any(reads(arg) for arg in (*trained.args, *(keyword.value for keyword in trained.keywords)))


def _path(node: ast.AST) -> str | None:
    """``buffer`` or ``self.memory``: a name, or attributes of one; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (owner := _path(node.value)) is not None:
        return f"{owner}.{node.attr}"
    return None


def _bound_paths(target: ast.AST) -> set[str]:
    """What an assignment to ``target`` binds or changes (``a, b``; ``self.memory``; ``batch[0]``: ``batch``)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return {path for item in target.elts for path in _bound_paths(item)}
    if isinstance(target, ast.Starred):
        return _bound_paths(target.value)
    while isinstance(target, ast.Subscript):
        target = target.value
    path = _path(target)
    return {path} if path is not None else set()
