"""The imports a round of fixes adds and removes, scheduled once for all its fixes.

libcst's ``AddImportsVisitor`` and ``RemoveImportsVisitor`` do the work; around them: an import
already there is not added (found without their walk of the whole tree), an import removal keeps
the comments above the line, a ``global`` left declaring only what its function binds no more
goes, and an ``if flag:`` left holding only ``pass`` goes.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_nodes import is_docstring, is_import_line, is_pure
from migrate.flow.bindings import bindings
from migrate.rule import Report
from migrate.fallback_arms import commented, given_none, read_in
from migrate.metadata import parents
from migrate.tree_walk import descendants, walk
from migrate.types import ImportChange
from migrate.unread import Unparsed

__all__ = ["already_imported", "apply"]


def apply(module: cst.Module, applied: Iterable[Report], filename: str, *, alone: bool = False) -> cst.Module:
    """``module`` with the imports the ``applied`` fixes add and remove.

    ``alone``: one fix of a file's several, for its edits. An import it would remove is kept
    while the module still names it anywhere but in an import, which spares libcst's scope
    analysis (seconds on a large file) once per fix; the other fixes nearly always use it still.
    """
    applied = list(applied)
    adds = [imp for imp in _unique(imp for report in applied for imp in report.add_imports) if not already_imported(module, imp)]
    removes = _unique(imp for report in applied for imp in report.remove_imports)
    if alone and removes:
        removes = [imp for imp in removes if not _named_outside_imports(module, _bound_name(imp))]
    if adds or removes:
        module = _schedule(module, adds, removes, filename)
    return module


def _schedule(
    module: cst.Module, adds: list[ImportChange], removes: list[ImportChange], filename: str
) -> cst.Module:
    # Imported here: libcst.codemod pulls in libcst.matchers, which costs a fifth of a second
    # at start-up, and only files that change need it.
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

    context = CodemodContext(filename=filename)
    for imp in adds:
        AddImportsVisitor.add_needed_import(context, imp.module, imp.obj, imp.asname, imp.relative)
    for imp in removes:
        RemoveImportsVisitor.remove_unused_import(context, imp.module, imp.obj, imp.asname)
    if adds:
        module = _above_relative_imports(AddImportsVisitor(context).transform_module(module),
                                         [imp for imp in adds if not imp.relative])
    if removes:
        before = _empty_ifs(module)
        removed = {_bound_name(imp) for imp in removes}
        fallbacks_before = _fallback_ifs(module, removed)
        # A name nothing reads any more goes without libcst's scope analysis (most of a fixing
        # run's time): only where a name of that spelling is still read does it decide.
        unread = _unread_names(module, {_bound_name(imp) for imp in removes})
        if all(_bound_name(imp) in unread for imp in removes):
            module = module.visit(_comments_kept(_RemoveImports)(removes))
        else:
            module = _comments_kept(RemoveImportsVisitor)(context).transform_module(module)
            module = module.visit(_DeadGlobals({_bound_name(imp) for imp in removes}))
        if _fallback_ifs(module, removed) - fallbacks_before:  # `if fp16: pass` / `else: amp = None`
            module = module.visit(_DropDeadFallbacks(removed, fallbacks_before))
        if _empty_ifs(module) - before:
            module = module.visit(_DropEmptyIfs(before))
    return module


def _above_relative_imports(module: cst.Module, added: list[ImportChange]) -> cst.Module:
    """isort's order for what libcst added: an absolute import it put below the file's relative
    imports (``from .models import Net``), in the same run of import lines, moves above the first
    of them: after the absolute imports there, or in the relative one's place, whose comment stays
    with it."""
    body = list(module.body)
    first = next((i for i, line in enumerate(body) if is_import_line(line) and _relative(line)), None)
    if first is None or not added:
        return module
    moved, index = [], first + 1
    while index < len(body) and is_import_line(body[index]):
        line = body[index]
        if len(line.body) == 1 and any(_makes(line.body[0], imp) for imp in added):
            moved.append(body.pop(index).with_changes(leading_lines=()))
        else:
            index += 1
    if not moved:
        return module
    relative = body[first]
    if not (first > 0 and is_import_line(body[first - 1]) and not _relative(body[first - 1])):
        # no absolute import just above: the first moved line takes the blank lines above the
        # relative import, which keeps its comments and is set apart by a blank line, as isort does
        blank = next((i for i, empty in enumerate(relative.leading_lines) if empty.comment), len(relative.leading_lines))
        moved[0] = moved[0].with_changes(leading_lines=relative.leading_lines[:blank])
        body[first] = relative.with_changes(leading_lines=(cst.EmptyLine(), *relative.leading_lines[blank:]))
    body[first:first] = moved
    return module.with_changes(body=body)


def _relative(line: cst.SimpleStatementLine) -> bool:
    return any(isinstance(small, cst.ImportFrom) and small.relative for small in line.body)


def _unread_names(module: cst.Module, names: set[str]) -> set[str]:
    """Those of ``names`` no statement reads: no name of that spelling outside the imports, but
    an attribute's (``x.amp``). A parameter or keyword of that spelling counts as a read: the
    scope analysis decides those."""
    read: set[str] = set()
    attributes: set[int] = set()  # the `.attr` of an attribute is not a read of the name
    for node in descendants(module, lambda node: type(node) not in (cst.Import, cst.ImportFrom, cst.Global)):
        if type(node) is cst.Attribute:
            attributes.add(id(node.attr))
        elif type(node) is cst.Name and node.value in names and id(node) not in attributes:
            read.add(node.value)
        elif type(node) is Unparsed:
            read.update(name for name in names if node.uses(name))
    return names - read


class _RemoveImports(cst.CSTTransformer):
    """Removes the given imports, whose names nothing reads (``_unread_names``), and the
    ``global`` declarations of those names (``global amp`` beside ``from apex import amp``)."""

    def __init__(self, removes: list[ImportChange]) -> None:
        super().__init__()
        self.removes = removes

    def leave_Global(self, original_node: cst.Global, updated_node: cst.Global):
        gone = {_bound_name(imp) for imp in self.removes}
        return _narrowed(updated_node, [item for item in updated_node.names if item.name.value not in gone])

    def _kept(self, node: cst.Import | cst.ImportFrom) -> list[cst.ImportAlias]:
        return [alias for alias in node.names if not any(_makes(node, imp, only=alias) for imp in self.removes)]

    def leave_Import(self, original_node: cst.Import, updated_node: cst.Import):
        return self._leave(updated_node)

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom):
        if isinstance(updated_node.names, cst.ImportStar):
            return updated_node
        return self._leave(updated_node)

    def _leave(self, node):
        return _narrowed(node, self._kept(node))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node


class _DeadGlobals(cst.CSTTransformer):
    """Drops ``global amp`` from a function that binds ``amp`` no more (its ``from apex import
    amp`` removed, the name read elsewhere): a declaration with nothing to bind says nothing."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names
        self.functions: list[cst.FunctionDef] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.functions.pop()
        return updated_node

    def leave_Global(self, original_node: cst.Global, updated_node: cst.Global):
        if not self.functions:
            return updated_node
        function = self.functions[-1]
        body = function.body.body if isinstance(function.body, cst.IndentedBlock) else ()
        if len(body) == 1:
            return updated_node  # the function's only statement: something must stay
        return _narrowed(updated_node, [item for item in updated_node.names
                                        if item.name.value not in self.names or _binds(function, item.name.value)])


def _binds(function: cst.FunctionDef, name: str) -> bool:
    """Whether ``function`` itself binds ``name``: an assignment or target, an import, a nested
    ``def``/``class`` of that name, or a ``del``."""
    if bindings(function, name):
        return True
    for node in descendants(function, lambda node: node is function or not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda))):
        if isinstance(node, (cst.Import, cst.ImportFrom)) and not isinstance(node.names, cst.ImportStar):
            if any(nodes.code((alias.asname.name if alias.asname else alias.name)).split(".")[0] == name for alias in node.names):
                return True
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node is not function and node.name.value == name:
            return True
        elif type(node) is cst.Del and name in nodes.bound_texts(node.target):
            return True
    return False


def _narrowed(node: cst.Import | cst.ImportFrom | cst.Global, kept: list):
    """``node`` with only the ``kept`` of its names; removed where none is kept."""
    if len(kept) == len(node.names):
        return node
    if not kept:
        return cst.RemoveFromParent()
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return node.with_changes(names=kept)


def without_leading_blank_lines(statement: cst.BaseStatement) -> cst.BaseStatement:
    """``statement`` with the blank lines before its first comment (or before it) dropped: the
    ones that stood between it and the statement a fix removed above it, first in its block, which
    would open the block now."""
    lines = list(statement.leading_lines)
    while lines and lines[0].comment is None:
        lines.pop(0)
    return statement.with_changes(leading_lines=lines)


def _comments_kept(remover: type[cst.CSTTransformer]) -> type[cst.CSTTransformer]:
    """``remover``, keeping the comments above an import line it removes: they go to the next
    statement (or the end of the block; a block left empty loses them). libcst drops them with
    the line, and they are the user's (often the native import, commented out:
    ``# from torch.nn.parallel import DDP``)."""

    class RemoveImportsKeepingComments(remover):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._removed: dict[int, Sequence[cst.EmptyLine]] = {}

        def leave_SimpleStatementLine(self, original_node, updated_node):
            if not updated_node.body:  # libcst removes the line
                comments = any(line.comment for line in original_node.leading_lines)
                self._removed[id(original_node)] = original_node.leading_lines if comments else ()
            return updated_node

        def _carried(self, original_node, updated_node, footer_field: str):
            removed = sum(id(s) in self._removed for s in original_node.body)
            if not removed or len(updated_node.body) != len(original_node.body) - removed:
                return updated_node  # nothing removed here, or not only removed: kept as libcst made it
            kept, carried, survivors = [], [], iter(updated_node.body)
            for statement in original_node.body:
                if id(statement) in self._removed:
                    carried += self._removed[id(statement)]
                    continue
                survivor = next(survivors)
                if not kept and statement is not original_node.body[0] and isinstance(original_node, cst.IndentedBlock):
                    survivor = without_leading_blank_lines(survivor)  # the block opens on it
                if carried:
                    survivor = survivor.with_changes(leading_lines=(*carried, *survivor.leading_lines))
                    carried = []
                kept.append(survivor)
            changes = {"body": kept}
            if carried:
                changes[footer_field] = (*carried, *getattr(updated_node, footer_field))
            return updated_node.with_changes(**changes)

        def leave_IndentedBlock(self, original_node, updated_node):
            if not updated_node.body:  # the block goes (its `if` with it): so do its comments
                return updated_node
            return self._carried(original_node, updated_node, "footer")

        def leave_Module(self, original_node, updated_node):
            return self._carried(original_node, super().leave_Module(original_node, updated_node), "footer")

    return RemoveImportsKeepingComments


def _bound_name(imp: ImportChange) -> str:
    return imp.asname or imp.obj or imp.module.split(".")[0]


def already_imported(module: cst.Module, imp: ImportChange) -> bool:
    """Whether ``module`` makes ``imp`` before anything uses its name: in the imports that open it
    (after a docstring), where libcst's ``AddImportsVisitor`` looks, or in a later import line of
    its top level that comes before any other mention of the name (``import os``,
    ``os.environ[...] = ...``, then ``import torch``: adding one above would run it first).
    One import per line, as libcst reads them."""
    body = module.body
    if body and is_docstring(body[0]):
        body = body[1:]
    name = _bound_name(imp)
    opening = True
    for statement in body:
        line = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
        if isinstance(line, (cst.Import, cst.ImportFrom)):
            if _makes(line, imp) or _binds_package(line, imp):
                return True
            if opening:
                continue
        opening = False
        if type(statement) is Unparsed:  # a definition kept as text (a word in a comment counts: the import is added, harmless)
            if statement.uses(name):
                return False
        elif any(type(node) is cst.Name and node.value == name for node in descendants(statement)):
            return False
    return False


def _binds_package(small: cst.Import | cst.ImportFrom, imp: ImportChange) -> bool:
    """Whether ``small`` binds the package ``imp`` imports plainly: ``import torch.utils.data``
    binds ``torch``, as ``import torch`` does (``import torch.nn as nn`` does not)."""
    plain = imp.obj is None and imp.asname is None and "." not in imp.module
    return plain and isinstance(small, cst.Import) and any(
        alias.asname is None and _code(alias.name).split(".")[0] == imp.module for alias in small.names)


def _makes(small: cst.Import | cst.ImportFrom, imp: ImportChange, only: cst.ImportAlias | None = None) -> bool:
    """Whether the import ``small`` (its name ``only``, if given) binds ``imp``."""
    if isinstance(small, cst.ImportFrom):
        if imp.obj is None or len(small.relative) != imp.relative or small.module is None or isinstance(small.names, cst.ImportStar):
            return False
        if _code(small.module) != imp.module:
            return False
    elif imp.obj is not None:
        return False
    names = {(_code(alias.name), alias.asname and _code(alias.asname.name)) for alias in ([only] if only else small.names)}
    return (imp.obj or imp.module, imp.asname) in names


def _named_outside_imports(module: cst.Module, name: str) -> bool:
    """Whether ``name`` appears as a word (not an attribute) in a top-level statement that is not
    only imports; comments and strings count too, so this may say yes where nothing uses it."""
    word = re.compile(rf"(?<![\w.]){re.escape(name)}\b")
    for statement in module.body:
        if not is_import_line(statement) and word.search(module.code_for_node(statement)):
            return True
    return False


def _empty_ifs(module: cst.Module) -> set[str]:
    """The code of each ``if <test>: pass`` (no else) in ``module``."""
    found: set[str] = set()

    class _Find(cst.CSTVisitor):
        def visit_If(self, node: cst.If) -> None:
            if _only_pass(node):
                found.add(_code(node))

    walk(module, _Find())
    return found


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node).strip()


def _only_pass(node: cst.CSTNode) -> bool:
    if not isinstance(node, cst.If) or node.orelse is not None or not isinstance(node.body, cst.IndentedBlock):
        return False
    lines = node.body.body
    return (
        all(isinstance(line, cst.SimpleStatementLine) and all(isinstance(s, cst.Pass) for s in line.body) for line in lines)
        and not any(line.comment for line in node.body.footer)
        # a fix's TODO above the `pass` (or any comment in the block) says what changed: it stays
        and not any(empty.comment for line in lines for empty in line.leading_lines)
        and not any(line.trailing_whitespace.comment for line in lines)
        and is_pure(node.test)
    )


class _DropEmptyIfs(cst.CSTTransformer):
    """Removes an ``if flag: pass`` that an import removal left (``if fp16: from apex import amp``):
    its test has no effect. One the user wrote is kept, and so is a block's last statement, but
    for an ``else:`` arm's, which goes with it."""

    def __init__(self, kept: set[str]) -> None:
        super().__init__()
        self.kept = kept

    def _filter(self, body):
        left = [s for s in body if not (_only_pass(s) and _code(s) not in self.kept)]
        return left if left else body

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._filter(updated_node.body))

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        # `else:` holding only such an `if` (`else: if fp16: model = amp.initialize(model)`): it goes too
        orelse = updated_node.orelse
        if isinstance(orelse, cst.Else) and isinstance(orelse.body, cst.IndentedBlock) and all(
                _only_pass(s) and _code(s) not in self.kept for s in orelse.body.body) and not any(
                line.comment for line in (*orelse.leading_lines, *orelse.body.footer)):
            return updated_node.with_changes(orelse=None)
        return updated_node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._filter(updated_node.body))


def _fallback_ifs(module: cst.Module, names: set[str]) -> set[str]:
    """The code of each ``if <test>: pass`` whose ``else`` only gives ``None`` to some of ``names``."""
    return {_code(node) for node in descendants(module) if type(node) is cst.If and given_none(node.orelse) & names
            and _only_pass(node.with_changes(orelse=None))}


class _DropDeadFallbacks(cst.CSTTransformer):
    """Drops the ``else: amp = None`` of an ``if fp16: pass`` that an import's removal left in a
    function (``if fp16: from apex import amp`` / ``else: amp = None``), where nothing in the
    function reads the names it gives ``None`` any more: dead stores, beside an arm of no effect, which
    ``_DropEmptyIfs`` then removes. One written so before the removal, or an ``else`` with a
    comment, is kept; so is a module's (another file may import the name)."""

    def __init__(self, names: set[str], kept: set[str]) -> None:
        super().__init__()
        self.names, self.kept = names, kept
        self.functions: list[tuple[cst.FunctionDef, dict[cst.CSTNode, cst.CSTNode]]] = []  # each enclosing one, with its parents

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append((node, parents(node)))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.functions.pop()
        return updated_node

    def _read(self, names: set[str]) -> bool:
        function, parent = self.functions[-1]
        return read_in(function, names, parent.get)

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        names, orelse = given_none(updated_node.orelse), updated_node.orelse
        if (not self.functions or not names & self.names or _code(original_node) in self.kept
                or not _only_pass(updated_node.with_changes(orelse=None)) or self._read(names)):
            return updated_node
        return updated_node if commented(orelse) else updated_node.with_changes(orelse=None)


def _unique(imports) -> list[ImportChange]:
    return list(dict.fromkeys(imports))
