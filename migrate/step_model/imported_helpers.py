"""What the functions of a project's other files read on the host, for the calls a walk cannot enter.

A training loop logs through helpers of its project: ``metric_logger.update(**loss_dict)``
(whose ``update`` calls ``v.item()`` on each value), ``misc.check_nan_losses(loss)`` (a
``math.isnan``). The walk enters the file's own helpers; a helper of another file is found from
the file's imports (``from lavis.common.logger import MetricLogger``, ``from slowfast.utils import
misc``, relative ones too) by looking for the module's file in the file's folder and the folders
above it, as Python would find it from a script run at the project's root. Its function, or the
method of a class the caller made (``metric_logger = MetricLogger()``), is read with ``ast``:
which parameters it pulls to the host (``p.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()``,
``float(p)``, ``math.isnan(p)``), also through a loop over them (``for k, v in kwargs.items()``),
and whether it runs a backward pass.

A helper whose file is not found, or that reads its parameters only through further calls,
reads nothing here: a read may be missed, never invented.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.module_paths import PROJECT_FOLDERS_UP, find_on_disk, parsed_module

__all__ = ["ImportedHelpers", "Reader"]

_PULLS = frozenset({"item", "cpu", "tolist", "numpy"})
_HOST_TESTS = frozenset({"isnan", "isinf", "isfinite"})  # `math.isnan(loss)`


@dataclass(frozen=True)
class Reader:
    """A function or method of another file that pulls some of its parameters to the host."""

    label: str  # `MetricLogger.update`
    where: str  # `lavis/common/logger.py:90`, the first read
    positions: tuple[int, ...]  # the positional parameters it reads (a method's `self` left out)
    names: frozenset[str]  # the same, by name, and the keyword-only ones
    keywords: bool  # the values of its `**kwargs`
    backward: str | None = None  # where it runs a backward pass (`scaler.scale(loss).backward()`), if it does

    def arguments(self, call: cst.Call) -> list[cst.Arg]:
        """The arguments of ``call`` that land in a parameter this helper reads."""
        read = []
        for index, arg in enumerate(call.args):
            if arg.star == "**":
                if self.keywords or self.names:
                    read.append(arg)
            elif arg.star == "*":
                continue
            elif arg.keyword is not None:
                if arg.keyword.value in self.names or self.keywords:
                    read.append(arg)
            elif index in self.positions:
                read.append(arg)
        return read


class ImportedHelpers:
    """The readers the calls of one file reach in other files of its project."""

    def __init__(self, filename: str | None, module: cst.Module) -> None:
        self._path = Path(filename).resolve() if filename and filename.endswith(".py") else None
        self._module = module
        self._imports: dict[str, tuple[str, int, str | None]] | None = None  # local name -> (module, level, attribute)

    def reader(self, call: cst.Call, instances: dict[str, str]) -> Reader | None:
        """The reader ``call`` calls: an imported function (``check(x)``, ``misc.check(x)``) or a
        method of an instance of an imported class (``logger.update(...)``)."""
        if self._path is None:
            return None
        func = call.func
        if type(func) is cst.Name:
            return self._function(func.value, None)
        if type(func) is not cst.Attribute:
            return None
        owner = _dotted(func.value)  # asked of every call a walk does not enter: no code generated
        if owner in instances:  # `metric_logger = MetricLogger(...)`: its class's method
            return self._function(instances[owner], func.attr.value)
        if type(func.value) is cst.Name:  # `misc.check_nan_losses(loss)`: a module's function
            found = self._bound(func.value.value)
            if found is not None:
                module, level, attribute = found
                dotted = f"{module}.{attribute}" if attribute else module
                return _reader_in(_module_file(self._path, dotted.lstrip("."), level), func.attr.value, None)
        return None

    def _function(self, local: str, method: str | None) -> Reader | None:
        found = self._bound(local)
        if found is None:
            return None
        module, level, attribute = found
        if attribute is None:
            return None
        return _reader_in(_module_file(self._path, module, level), attribute, method)

    def _bound(self, local: str) -> tuple[str, int, str | None] | None:
        if self._imports is None:
            self._imports = _imports(self._module)
        return self._imports.get(local)


def _imports(module: cst.Module) -> dict[str, tuple[str, int, str | None]]:
    """What each top-level import binds: ``MetricLogger`` -> ``("lavis.common.logger", 0,
    "MetricLogger")``; ``misc`` -> ``("slowfast.utils", 0, "misc")``; ``np`` -> ``("numpy", 0, None)``."""
    bound: dict[str, tuple[str, int, str | None]] = {}
    lines = [s for s in module.body if isinstance(s, cst.SimpleStatementLine)]
    for statement in module.body:  # and those of a top-level `try:` or `if`
        if isinstance(statement, (cst.Try, cst.If)):
            lines += [s for s in statement.body.body if isinstance(s, cst.SimpleStatementLine)]
    for statement in lines:
        for small in statement.body:
            if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                source = nodes.code(small.module) if small.module is not None else ""
                for alias in small.names:
                    local = nodes.code(alias.asname.name) if alias.asname else nodes.code(alias.name)
                    bound[local] = (source, len(small.relative), nodes.code(alias.name))
            elif isinstance(small, cst.Import):
                for alias in small.names:
                    if alias.asname is not None:
                        bound[nodes.code(alias.asname.name)] = (nodes.code(alias.name), 0, None)
    return bound


@lru_cache(maxsize=1024)
def _module_file(path: Path, dotted: str, level: int) -> Path | None:
    return find_on_disk(path, level, [part for part in dotted.split(".") if part], PROJECT_FOLDERS_UP)


def _reader_in(file: Path | None, name: str, method: str | None) -> Reader | None:
    """The reader ``name`` (a function, or ``method`` of class ``name``) of ``file``."""
    return None if file is None else _readers(str(file)).get((name, method))


@lru_cache(maxsize=256)
def _readers(file: str) -> dict[tuple[str, str | None], Reader]:
    """Every function and method of ``file`` that pulls a parameter to the host, by (name, method)."""
    tree = parsed_module(file)
    if tree is None:
        return {}
    shown = _shown_path(Path(file))
    found: dict[tuple[str, str | None], Reader] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            reader = _reader(node, node.name, shown, method=False)
            if reader is not None:
                found[(node.name, None)] = reader
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    reader = _reader(item, f"{node.name}.{item.name}", shown, method=True)
                    if reader is not None:
                        found[(node.name, item.name)] = reader
    return found


def _shown_path(file: Path) -> str:
    parts = file.parts
    return "/".join(parts[-3:]) if len(parts) > 3 else str(file)


def _reader(function: ast.FunctionDef | ast.AsyncFunctionDef, label: str, shown: str, *, method: bool) -> Reader | None:
    arguments = function.args
    positional = [a.arg for a in (*arguments.posonlyargs, *arguments.args)]
    if method and positional:
        positional = positional[1:]  # `self`
    parameters = set(positional) | {a.arg for a in arguments.kwonlyargs}
    keywords = arguments.kwarg.arg if arguments.kwarg else None
    if keywords:
        parameters.add(keywords)
    aliases = {name: name for name in parameters}  # a name -> the parameter whose values it holds
    body = list(_own_nodes(function))
    for node in body:  # `for k, v in kwargs.items()`, `for loss in losses`: the loop's item holds a value of it
        if isinstance(node, (ast.For, ast.comprehension)):
            source = _iterated(node.iter)
            if source in aliases:
                for target in _item_targets(node.target):
                    aliases[target] = aliases[source]
    read: dict[str, int] = {}
    for node in _own_nodes(function, counted=True):
        if isinstance(node, ast.Call):
            value = _pulled(node)
            if value in aliases and aliases[value] not in read:
                read[aliases[value]] = node.lineno
    backwards = [node.lineno for node in body if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                 and node.func.attr == "backward"]
    if not read and not backwards:
        return None
    first = min(read.values()) if read else min(backwards)
    return Reader(label=label, where=f"{shown}:{first}",
                  positions=tuple(index for index, name in enumerate(positional) if name in read),
                  names=frozenset(name for name in read if name != keywords),
                  keywords=keywords in read,
                  backward=f"{shown}:{min(backwards)}" if backwards else None)


def _own_nodes(function: ast.AST, *, counted: bool = False):
    """The nodes of ``function``'s body, not of functions, lambdas or classes defined in it;
    ``counted``: not those under an ``if`` on a count (``if self.step % 100 == 0:``), as a helper
    that logs every n calls does not wait each call."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if counted and isinstance(node, ast.If) and any(
                isinstance(part, ast.BinOp) and isinstance(part.op, ast.Mod) for part in ast.walk(node.test)):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _dotted(node: cst.BaseExpression) -> str | None:
    """``logger`` or ``self.logger``; None for anything else."""
    if type(node) is cst.Name:
        return node.value
    if type(node) is cst.Attribute and type(node.value) is cst.Name:
        return f"{node.value.value}.{node.attr.value}"
    return None


def _iterated(iterated: ast.expr) -> str | None:
    """``kwargs`` for ``kwargs.items()``, ``kwargs.values()`` or ``kwargs``."""
    if isinstance(iterated, ast.Call) and isinstance(iterated.func, ast.Attribute) and iterated.func.attr in ("items", "values"):
        iterated = iterated.func.value
    return iterated.id if isinstance(iterated, ast.Name) else None


def _item_targets(target: ast.expr) -> list[str]:
    """The names a loop binds to an item: ``v`` of ``k, v`` (``items()``), or the one name."""
    if isinstance(target, ast.Tuple) and len(target.elts) == 2 and isinstance(target.elts[1], ast.Name):
        return [target.elts[1].id]
    return [target.id] if isinstance(target, ast.Name) else []


def _pulled(call: ast.Call) -> str | None:
    """The name ``call`` pulls to the host: ``v`` of ``v.item()``, ``float(v)``, ``math.isnan(v)``."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _PULLS and not call.args and isinstance(func.value, ast.Name):
        return func.value.id
    if isinstance(func, ast.Name) and func.id == "float" and len(call.args) == 1 and isinstance(call.args[0], ast.Name):
        return call.args[0].id
    if (isinstance(func, ast.Attribute) and func.attr in _HOST_TESTS and isinstance(func.value, ast.Name)
            and func.value.id in ("math", "np", "numpy") and call.args and isinstance(call.args[0], ast.Name)):
        return call.args[0].id
    return None
