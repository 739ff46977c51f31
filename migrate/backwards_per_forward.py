"""Where one forward pass through a model takes several backward passes in the same iteration.

apex's DistributedDataParallel all-reduced the gradients at the end of every backward pass.
torch's reduces once per forward pass: a second backward pass through the same forward's output
raises where it looks for unused parameters ("Trying to backward through the graph a second
time"), and is not all-reduced otherwise. A domain-adaptation segmentor does it: `losses =
net(x)`, the segmentation loss's backward pass, then each discriminator loss's.

``second_backward(module, model)`` follows, in each function calling ``model`` (that spelling, or
an attribute or name ending in the same name: ``model`` handed on, ``self.model``), what the
forward's result flows into, statement by statement in source order, and gives the first two
backward passes reading it that can run in the same pass: not in two arms of one ``if``. One in
a loop that the forward pass is outside counts twice. A value under ``.detach()``, or computed
under ``torch.no_grad()``, carries nothing back (a GAN's discriminator loss on ``fake.detach()``).

``differing_forwards(module, model)`` is the other way round: two forward passes that one backward
pass reads, called with different options (``net(x, task="semantic")``, then ``net(y,
task="traversability")``). They may run different parts of the model, and torch's DDP finding
unused parameters, which searches the graph from the last forward pass only, takes what only the
first ran for unused, then raises when its gradient comes ("Expected to mark a variable ready only
once"). Two passes called alike (a siamese network's ``net(a)``, ``net(b)``) run the same parts.
"""
from __future__ import annotations

from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from migrate import apex_nodes as nodes, disk_reads
from migrate.files import in_project, project_files_saying, project_root
from migrate.tree_walk import descendants

__all__ = ["differing_forwards", "forwards_in_callers", "second_backward"]

_LOOPS = (cst.For, cst.While)


def second_backward(module: cst.Module, model: str) -> tuple[cst.CSTNode, cst.CSTNode] | None:
    """Two backward passes (``.backward()`` calls) through one forward pass of ``model``, or None."""
    last = model.rsplit(".", 1)[-1]
    scopes = [module, *(node for node in descendants(module) if type(node) is cst.FunctionDef)]
    for scope in scopes:
        statements = list(_statements(scope))
        for index, (statement, path) in enumerate(statements):
            if not _forward_calls(statement, model, last):
                continue
            carried = set(_targets(statement))
            around = {id(node) for node, _ in path}
            found: list[tuple[cst.CSTNode, tuple]] = []
            for later, later_path in statements[index + 1:]:
                call = _backward_reading(later, carried)
                if call is not None:
                    repeated = any(isinstance(node, _LOOPS) and id(node) not in around for node, _ in later_path)
                    found += [(call, later_path)] * (2 if repeated else 1)
                _carry(later, carried, _no_grad(later_path))
            pair = _together(found)
            if pair is not None:
                return pair
    return None


def differing_forwards(module: cst.Module, model: str) -> tuple[cst.Call, cst.Call] | None:
    """Two forward passes (calls of ``model``) with different options that one backward pass reads, or None."""
    last = model.rsplit(".", 1)[-1]
    scopes = [module, *(node for node in descendants(module) if type(node) is cst.FunctionDef)]
    for scope in scopes:
        statements = list(_statements(scope))
        read_by: dict[int, list[tuple[cst.Call, tuple]]] = {}  # a backward call's id -> the forward calls it reads
        for index, (statement, path) in enumerate(statements):
            forwards = _forward_calls(statement, model, last)
            if not forwards or _no_grad(path):
                continue
            carried = set(_targets(statement))
            for later, later_path in statements[index + 1:]:
                call = _backward_reading(later, carried)
                if call is not None:
                    read_by.setdefault(id(call), []).extend((forward, path) for forward in forwards)
                _carry(later, carried, _no_grad(later_path))
        for forwards in read_by.values():
            for i, (first, first_path) in enumerate(forwards):
                for second, second_path in forwards[i + 1:]:
                    if _options(first) != _options(second) and _together([(first, first_path), (second, second_path)]):
                        return first, second
    return None


def forwards_in_callers(filename: str, function: str) -> list[tuple[str, tuple[int, int]]]:
    """``differing_forwards`` in the other files of the project holding ``filename`` through the names
    they assign a call of ``function`` to (``net = network.wrap(net)``), each as the file's path
    from the project's root (``"train.py: "``) and the two lines."""
    path = Path(filename)
    if path.suffix != ".py" or not path.is_file():
        return []
    return _forwards_in_callers(project_root(path), path.resolve(), function)


@disk_reads.cached(maxsize=64)
def _forwards_in_callers(root: Path, own: Path, function: str) -> list[tuple[str, tuple[int, int]]]:
    found: list[tuple[str, tuple[int, int]]] = []
    for path, data in project_files_saying(root, f"{function}(".encode()):
        if path.resolve() == own or not in_project(path, root):
            continue
        try:
            wrapper = MetadataWrapper(cst.parse_module(data.decode("utf-8")), unsafe_skip_copy=True)
        except (cst.ParserSyntaxError, UnicodeDecodeError, RecursionError):
            continue
        names = {nodes.code(node.targets[0].target) for node in descendants(wrapper.module)
                 if type(node) is cst.Assign and len(node.targets) == 1 and type(node.value) is cst.Call
                 and nodes.call_name(node.value) == function}
        for name in sorted(names):
            pair = differing_forwards(wrapper.module, name)
            if pair is not None:
                positions = wrapper.resolve(PositionProvider)
                found.append((f"{path.relative_to(root).as_posix()}: ", tuple(positions[node].start.line for node in pair)))
                break
    return found


def _forward_calls(statement: cst.CSTNode, model: str, last: str) -> list[cst.Call]:
    """The calls of ``model`` (or ``self.model``, ``model`` under another owner) in ``statement``
    where it binds a result (``out = model(x)``); none elsewhere."""
    if not isinstance(statement, cst.SimpleStatementLine) or not _targets(statement):
        return []
    return [node for node in descendants(statement, nodes.not_a_definition) if type(node) is cst.Call
            and (nodes.code(node.func) == model or nodes.code(node.func).rsplit(".", 1)[-1] == last)]


def _options(call: cst.Call) -> tuple:
    """What tells a forward pass's path through the model: its keywords, each literal's value
    (``task="semantic"``, ``True``), and how many positional values it is given; not the data (``gts=labels``)."""
    def literal(value: cst.BaseExpression) -> str | None:
        plain = isinstance(value, (cst.SimpleString, cst.Integer, cst.Float)) or (
            type(value) is cst.Name and value.value in ("True", "False", "None"))
        return nodes.code(value) if plain else None
    positional = tuple(literal(arg.value) for arg in call.args if arg.keyword is None)
    return positional, sorted((arg.keyword.value, literal(arg.value)) for arg in call.args if arg.keyword is not None)


def _statements(scope: cst.CSTNode, path: tuple = ()):
    """Each simple statement and ``with`` or ``for`` header of ``scope`` (not of nested functions), in source
    order, with the compound statements around it and the arm of each it is in."""
    body = scope.body.body if isinstance(scope, (cst.FunctionDef, cst.If, cst.Else, cst.For, cst.While, cst.With, cst.Try,
                                                  cst.ExceptHandler, cst.Finally)) else scope.body
    for statement in body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, cst.SimpleStatementLine):
            yield statement, path
            continue
        if isinstance(statement, (cst.With, cst.For)):
            yield statement.with_changes(body=cst.IndentedBlock(body=[])), path  # its items or target bind names
        yield from _compound(statement, path)


def _compound(statement: cst.CSTNode, path: tuple):
    if isinstance(statement, cst.If):
        yield from _statements(statement, (*path, (statement, "body")))
        if statement.orelse is not None:
            if isinstance(statement.orelse, cst.If):
                yield from _compound(statement.orelse, (*path, (statement, "orelse")))
            else:
                yield from _statements(statement.orelse, (*path, (statement, "orelse")))
    elif isinstance(statement, cst.Try):
        yield from _statements(statement, (*path, (statement, "body")))
        for handler in statement.handlers:
            yield from _statements(handler, (*path, (statement, "handler")))
        if statement.finalbody is not None:
            yield from _statements(statement.finalbody, (*path, (statement, "finally")))
    elif isinstance(statement, (cst.For, cst.While, cst.With)):
        yield from _statements(statement, (*path, (statement, "body")))
    elif hasattr(statement, "body") and isinstance(getattr(statement, "body"), cst.IndentedBlock):
        yield from _statements(statement, (*path, (statement, "body")))


def _targets(statement: cst.CSTNode) -> list[str]:
    """The names and attributes ``statement`` binds (``loss``, ``self.out``, each of a tuple's)."""
    names: list[str] = []
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else (
                [small.target] if isinstance(small, (cst.AnnAssign, cst.AugAssign)) else [])
            names += [name for target in targets for name in _spelled(target)]
    elif isinstance(statement, cst.With):
        names += [nodes.code(item.asname.name) for item in statement.items if item.asname is not None]
    return names


def _spelled(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _spelled(element.value)]
    if isinstance(target, cst.StarredElement):
        return _spelled(target.value)
    return [nodes.code(target)] if isinstance(target, (cst.Name, cst.Attribute)) else []


def _reads(expression: cst.CSTNode, carried: set[str]) -> bool:
    """Whether ``expression`` reads a carried name outside a ``.detach()``."""
    def enter(node: cst.CSTNode) -> bool:
        detached = type(node) is cst.Call and isinstance(node.func, cst.Attribute) and node.func.attr.value in ("detach", "item")
        return not detached and nodes.not_a_definition(node)
    return any(type(node) in (cst.Name, cst.Attribute) and nodes.code(node) in carried for node in descendants(expression, enter))


def _carry(statement: cst.CSTNode, carried: set[str], no_grad: bool) -> None:
    """What ``statement`` binds carries the forward's result where its value reads it."""
    if isinstance(statement, cst.With):
        for item in statement.items:
            if item.asname is not None and _reads(item.item, carried):
                carried.add(nodes.code(item.asname.name))
        return
    if isinstance(statement, cst.For):  # `for part in (main, aux):` carries each part
        reads = _reads(statement.iter, carried)
        for name in _spelled(statement.target):
            (carried.add if reads else carried.discard)(name)
        return
    for small in statement.body:
        value = getattr(small, "value", None)
        if value is None or not isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            continue
        reads = _reads(value, carried) and not no_grad
        for name in _targets(cst.SimpleStatementLine(body=[small])):
            if reads:
                carried.add(name)
            elif not isinstance(small, cst.AugAssign):
                carried.discard(name)


def _backward_reading(statement: cst.CSTNode, carried: set[str]) -> cst.Call | None:
    if not isinstance(statement, cst.SimpleStatementLine):
        return None
    for node in descendants(statement, nodes.not_a_definition):
        if type(node) is cst.Call and isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward" \
                and _reads(node.func.value, carried):
            return node
    return None


def _no_grad(path: tuple) -> bool:
    return any(isinstance(node, cst.With) and any(nodes.call_name(item.item) in ("no_grad", "inference_mode")
                                                  for item in node.items if type(item.item) is cst.Call)
               for node, _ in path)


def _together(found: list[tuple[cst.CSTNode, tuple]]) -> tuple[cst.CSTNode, cst.CSTNode] | None:
    """The first two of ``found`` that no ``if`` puts in two arms."""
    for i, (first, first_path) in enumerate(found):
        for second, second_path in found[i + 1:]:
            arms = {id(node): arm for node, arm in first_path}
            if not any(isinstance(node, cst.If) and arms.get(id(node), arm) != arm for node, arm in second_path):
                return first, second
    return None
