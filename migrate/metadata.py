"""The metadata the rules of a run declare, resolved once for all of them, as libcst's
``MetadataWrapper`` would, with the costly providers computed here at a fraction of its cost."""
from __future__ import annotations

import builtins
import contextlib
import functools
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from types import MappingProxyType

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import (
    BatchableMetadataProvider,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)
from libcst.metadata.expression_context_provider import ExpressionContextVisitor
from libcst.metadata.scope_provider import _ASSIGNMENT_LIKE_NODES, ImportAssignment, LocalScope, ScopeVisitor

from migrate.positions import positions
from migrate.rule import Rule, visitor_names
from migrate.tree_walk import children, descendants, walk

__all__ = ["FILE_SETTING", "Parents", "WhenAsked", "parents", "positions_when_asked", "release", "resolve"]


FILE_SETTING = "file"  # the name of the file, among the settings providers are handed

def resolve(
    wrapper: MetadataWrapper, visitors: Sequence[Rule], settings: Mapping, positions: Mapping | None = None
) -> dict[type, Mapping]:
    """The metadata the visitors declare, resolved once for all of them, as ``MetadataWrapper`` would.

    Some providers are run here, at a fraction of the wrapper's cost:

    - ``ParentNodeProvider``: read from the walk that visits the rules where it can (``Parents``),
      and from the nodes' fields otherwise. libcst's rebuilds each node's children to list them,
      a tenth of a one-file run.
    - ``QualifiedNameProvider``: each node's names are worked out when first asked for; libcst's
      walks the tree to attach a lazy value to every node. A name no import binds and no builtin
      has resolves to nothing, and is answered without a scope lookup (``resolved_names``).
    - ``PositionProvider``: ``positions`` when given (``migrate.positions.positions_by_statement``),
      else ``migrate.positions``, in half the time, and only once asked for (the findings need it;
      a file with none never does).
    - ``ScopeProvider``: libcst's scope analysis, but for the name lookups no rule needs
      (``_LeanScopeVisitor``), called on the module alone as below.
    - other providers that only visit the ``Module`` (the apex plan, the step model): called on the
      module alone. The wrapper walks the whole tree once for each of them, in vain. libcst's
      scope and expression-context analyses then read the tree without rebuilding it
      (``_read_only_visits``).

    The wrapper resolves the rest, and keeps what one of those depends on (it would compute it again).
    """
    wanted = _with_dependencies(frozenset().union(*(visitor.get_inherited_dependencies() for visitor in visitors)))
    ours = {provider for provider in wanted if provider in _COMPUTED_HERE or _visits_only_the_module(provider)}
    ours -= _with_dependencies(wanted - ours)
    metadata = dict(wrapper.resolve_many(wanted - ours))
    module = wrapper.module
    while ours:
        ready = [provider for provider in ours if provider.get_inherited_dependencies() <= metadata.keys()]
        if not ready:
            raise RuntimeError(f"circular metadata dependencies among {', '.join(p.__name__ for p in ours)}")
        for provider in ready:
            if provider is ParentNodeProvider:
                metadata[provider] = Parents(module)
            elif provider is QualifiedNameProvider:
                metadata[provider] = _QualifiedNames(module, metadata[ScopeProvider])
            elif provider is PositionProvider:
                metadata[provider] = positions if positions is not None else positions_when_asked(module)
            elif provider is ScopeProvider:
                metadata[provider] = _run_on_module(_LeanScopes, module, metadata, settings)
            else:
                metadata[provider] = _run_on_module(provider, module, metadata, settings)
        ours.difference_update(ready)
    return metadata


_COMPUTED_HERE = (ParentNodeProvider, QualifiedNameProvider, PositionProvider, ScopeProvider)


def release(metadata: dict[type, Mapping]) -> None:
    """Unlink libcst's scope analysis once the rules have read it. Scopes, their assignments and
    the accesses to those all hold one another: cycles through which the file's nodes were held
    until the cycle collector scanned them all, a tenth of a run over a tree. Unlinked, the tree
    is freed as soon as its analysis drops it. The metadata is of no use afterwards."""
    scopes = metadata.get(ScopeProvider)
    for scope in set(scopes.values()) if scopes else ():
        if scope is not None:
            for assignment in scope.assignments:  # an access holds its assignments, and they it
                vars(assignment).clear()
            vars(scope).clear()
    metadata.clear()


def _with_dependencies(providers: Collection[type]) -> set[type]:
    found: set[type] = set()
    pending = list(providers)
    while pending:
        provider = pending.pop()
        if provider not in found:
            found.add(provider)
            pending.extend(provider.get_inherited_dependencies())
    return found


@functools.lru_cache(maxsize=None)
def _visits_only_the_module(provider: type) -> bool:
    return (
        issubclass(provider, BatchableMetadataProvider)
        and not provider.gen_cache
        and provider.get_visitors is BatchableMetadataProvider.get_visitors
        and set(visitor_names(provider)) <= {"visit_Module", "leave_Module"}
    )


def _run_on_module(provider_class: type, module: cst.Module, metadata: Mapping[type, Mapping], settings: Mapping) -> Mapping:
    """What a batched visit gives a provider that only visits the module; the run's settings come
    in as libcst's provider ``cache`` (what a provider knows from outside the module)."""
    provider = provider_class(cache=MappingProxyType(dict(settings)))
    provider.metadata = {key: metadata[key] for key in provider.get_inherited_dependencies()}
    methods = visitor_names(provider_class)
    with _read_only_visits():
        if "visit_Module" in methods:
            provider.visit_Module(module)
        if "leave_Module" in methods:
            provider.leave_Module(module)
    provider.metadata = {}
    return MappingProxyType(dict(provider._computed))  # as MetadataWrapper copies it


class _LeanScopeVisitor(ScopeVisitor):
    """libcst's scope analysis without two lookups of every name, each through every assignment of
    that name in its scope: a top level that assigns ``model`` and ``loss`` once per cell (a
    notebook exported as a script) made the analysis quadratic in the file's size.

    - An access is linked to its assignments only when an import binds its name somewhere in the
      file or a builtin has it: the only names that resolve to a qualified name a rule asks about
      (``resolved_names``). Any other is still answered by its scope, from all its assignments there.
    - A call is looked up (for ``typing.cast``, ``NewType``, ``TypeVar``) only when an import from
      ``typing`` seen so far binds the root of its name: none other can resolve into ``typing``.
    """

    _STACKS = ("_ScopeVisitor__top_level_attribute_stack", "_ScopeVisitor__in_type_hint_stack")

    def __init__(self, provider: ScopeProvider) -> None:
        super().__init__(provider)
        self.imported: set[str] = set()  # the names imports bind, as the visit reaches them
        self._from_typing: set[str] = set()  # those of imports from typing
        self._stacks = [getattr(self, name, None) for name in self._STACKS]  # what visit_Call keeps

    def visit_Import(self, node: cst.Import) -> bool | None:
        self._record(node)
        return super().visit_Import(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool | None:
        self._record(node)
        return super().visit_ImportFrom(node)

    def _record(self, statement: cst.Import | cst.ImportFrom) -> None:
        declared_global = _globals_declared_in(self.scope.node) if isinstance(self.scope, LocalScope) else ()
        for name, package in _bound_by(statement):
            self.imported.add(name)
            if package == "typing":
                self._from_typing.add(name)
            if name in declared_global:
                # `from apex import amp` then `global amp`: the declaration holds for the whole
                # function, as Python has it; libcst's order-bound visit would bind a local
                self.scope.record_global_overwrite(name)

    def visit_Call(self, node: cst.Call) -> bool | None:
        root = _root_name(node.func)
        if root is None or root in self._from_typing or None in self._stacks:
            return super().visit_Call(node)
        for stack, top in zip(self._stacks, (None, False)):  # what libcst's visit_Call does for other calls
            stack.append(top)
        return True

    def infer_accesses(self) -> None:
        deferred = getattr(self, "_ScopeVisitor__deferred_accesses", None)
        if deferred:
            self._ScopeVisitor__deferred_accesses = [
                pending for pending in deferred
                if (name := pending.access.node.value) in self.imported or hasattr(builtins, name)]
        super().infer_accesses()


class _LeanScopes(ScopeProvider):
    """``ScopeProvider``'s metadata, from ``_LeanScopeVisitor``."""

    def visit_Module(self, node: cst.Module) -> bool | None:
        visitor = _LeanScopeVisitor(self)
        node.visit(visitor)
        visitor.infer_accesses()
        return None


def _globals_declared_in(function: cst.CSTNode) -> frozenset[str]:
    """The names a ``global`` statement of ``function``'s own body declares (not a nested
    function's or class's)."""
    if not isinstance(function, cst.FunctionDef):
        return frozenset()
    own = descendants(function.body, lambda node: type(node) not in (cst.FunctionDef, cst.ClassDef, cst.Lambda))
    return frozenset(item.name.value for node in own if type(node) is cst.Global for item in node.names)


def _bound_by(statement: cst.Import | cst.ImportFrom) -> Iterator[tuple[str, str]]:
    """The names an import statement binds, each with the package it comes from: ``("a", "a")``
    for ``import a.b``, ``("c", "a")`` for ``from a.x import b as c`` ("" for a relative import)."""
    if isinstance(statement.names, cst.ImportStar):
        return
    for alias in statement.names:
        name = alias.evaluated_alias or alias.evaluated_name.split(".")[0]
        if isinstance(statement, cst.Import):
            yield name, alias.evaluated_name.split(".")[0]
        else:
            (package,) = _packages(statement)  # a from-import names one module
            yield name, package


# libcst's visitors behind ScopeProvider and ExpressionContextProvider: they only read the tree.
_READ_ONLY_VISITORS = (_LeanScopeVisitor, ExpressionContextVisitor)


# The node types ScopeVisitor counts as assignments: concrete classes, which no node type extends.
_ASSIGNMENT_LIKE = frozenset(_ASSIGNMENT_LIKE_NODES)


def _leaving_a_scope(visitor: ScopeVisitor, node: cst.CSTNode) -> None:
    """What ``ScopeVisitor.on_leave`` does but call ``leave_<type>``: record the node's scope and
    count the scope's assignments. Its ``isinstance`` against eighteen node classes, each a call
    into ``ABCMeta``, was about a quarter of the scope analysis."""
    scope = visitor.scope
    visitor.provider._computed[node] = scope
    if type(node) in _ASSIGNMENT_LIKE:
        scope._assignment_count += 1


@contextlib.contextmanager
def _read_only_visits() -> Iterator[None]:
    """While it lasts, ``node.visit(visitor)`` for libcst's scope and expression-context visitors
    walks the tree (``tree_walk.walk``) instead of rebuilding every node it passes: they call it on
    the module and again on children in their own methods, and rebuilding was most of their time.
    What they record is the same, but for punctuation and whitespace, which no rule asks a scope of."""
    rebuilding = cst.CSTNode.visit

    def visit(node: cst.CSTNode, visitor: cst.CSTVisitor) -> cst.CSTNode:
        if type(visitor) is _LeanScopeVisitor:
            walk(node, visitor, functools.partial(_leaving_a_scope, visitor))
            return node
        if type(visitor) in _READ_ONLY_VISITORS:
            walk(node, visitor)
            return node
        return rebuilding(node, visitor)

    cst.CSTNode.visit = visit
    try:
        yield
    finally:
        cst.CSTNode.visit = rebuilding


class WhenAsked(Mapping):
    """The mapping ``compute()`` returns, worked out when first read: metadata a file's rules never
    read (the positions of a file with nothing to report, most files' parents) is never paid for."""

    def __init__(self, compute: Callable[[], Mapping]) -> None:
        self._compute = compute
        self._found: Mapping | None = None

    def _all(self) -> Mapping:
        if self._found is None:
            self._found = self._compute()
        return self._found

    def __getitem__(self, node: cst.CSTNode) -> object:
        return self._all()[node]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


class Parents(Mapping):
    """``ParentNodeProvider``'s metadata. The rules ask for the parent of a node near the one they
    are visiting: above it (the statement around a call, the ``if`` around a statement) or just
    below it (a call's function). Those are read from ``path``, the nodes from the module to the
    one being visited, which the engine's walk keeps (``walk_batched(..., path=parents.path)``),
    and from the visited node's own nodes. Any other node's parent comes from ``parents(module)``,
    worked out when first needed."""

    def __init__(self, module: cst.Module) -> None:
        self.path: list[cst.CSTNode] = []
        self._all = WhenAsked(functools.partial(parents, module))

    def __getitem__(self, node: cst.CSTNode) -> cst.CSTNode:
        path = self.path
        for index in range(len(path) - 1, 0, -1):
            if path[index] is node:
                return path[index - 1]
        if len(path) > 1:  # below a statement or an expression: its own nodes are few
            parent = _parent_below(path[-1], node)
            if parent is not None:
                return parent
        return self._all[node]

    def __iter__(self):
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)


def _parent_below(top: cst.CSTNode, node: cst.CSTNode) -> cst.CSTNode | None:
    """``node``'s parent, when ``node`` is below ``top``."""
    pending = [top]
    while pending:
        parent = pending.pop()
        for child in children(parent):
            if child is node:
                return parent
            pending.append(child)
    return None


def positions_when_asked(module: cst.Module) -> WhenAsked:
    """``positions(module)``, worked out when first asked for: a file with nothing to report never needs them."""
    return WhenAsked(functools.partial(positions, module))


class _QualifiedNames(Mapping):
    """``QualifiedNameProvider``'s metadata: every node of the tree, with its scope's names for it.

    As libcst's provider has it: ``scope.get_qualified_names_for(node)``, worked out once, when
    first asked for. Punctuation and whitespace, which have no scope here, are not in it.
    """

    def __init__(self, module: cst.Module, scopes: Mapping) -> None:
        self._module = module
        self._scopes = scopes  # every node but punctuation and whitespace
        self._names: dict[cst.CSTNode, object] = {}
        self._of_assignment: dict[object, set] = {}  # an assignment's qualified names
        self._by_full_name: dict[tuple[int, str], set] = {}  # a dotted name's, by scope
        self._bound: set[int] | None = None
        self._import_roots: dict[str, frozenset[str]] | None = None

    def __getitem__(self, node: cst.CSTNode) -> object:
        names = self._names.get(node)
        if names is None:
            scope = self._scopes.get(node)
            if scope is None and node is not self._module:
                raise KeyError(node)
            names = self._names[node] = self._qualified(scope, node) if scope else set()
        return names

    def _qualified(self, scope, node: cst.CSTNode) -> set:
        """``scope.get_qualified_names_for(node)``, with what it works out from each assignment the
        node may see computed once: a scope that imports ``torch`` in each of its hundreds of cells
        has every ``torch.…`` see all those imports, and libcst asks each of them every time."""
        accesses = getattr(scope, "_accesses_by_node", {}).get(node)
        if accesses:  # a use libcst linked to the assignments it may see
            found = set()
            for access in accesses:
                for assignment in access.referents:
                    names = self._of_assignment.get(assignment)
                    if names is None:
                        names = self._of_assignment[assignment] = assignment.get_qualified_names_for(assignment.name)
                    found |= names
            return found
        if id(node) in self._bound_nodes():  # a name being bound: its own assignment answers
            return scope.get_qualified_names_for(node)
        full_name = get_full_name_for_node(node)
        if full_name is None:
            return set()
        key = (id(scope), full_name)
        found = self._by_full_name.get(key)
        if found is None:  # every assignment of the name in scope: what libcst answers for any other node
            found = self._by_full_name[key] = scope.get_qualified_names_for(full_name)
        return found

    def _bound_nodes(self) -> set[int]:
        """The nodes an assignment binds (``x`` of ``x = 1``, ``b`` of ``import a as b``), by id."""
        if self._bound is None:
            self._bound = set()
            for scope in {id(scope): scope for scope in self._scopes.values()}.values():
                for assignment in scope.assignments if scope is not None else ():
                    bound = getattr(assignment, "node", None)
                    self._bound.add(id(bound))
                    if isinstance(bound, (cst.Import, cst.ImportFrom)) and not isinstance(bound.names, cst.ImportStar):
                        for alias in bound.names:
                            self._bound.add(id(alias.name))
                            if alias.asname is not None:
                                self._bound.add(id(alias.asname.name))
        return self._bound

    def __iter__(self):
        yield self._module
        yield from (node for node in self._scopes if node is not self._module)

    def __len__(self) -> int:
        return len(self._scopes) + (self._module not in self._scopes)

    def resolved_names(self, node: cst.CSTNode, sources: Collection) -> frozenset[str]:
        """The names of ``node`` that come from one of ``sources`` (an import, a builtin).

        A name resolves through an import or to a builtin only if its root (``a`` of ``a.b(c)[d]``)
        is bound by an import somewhere in the file or is a builtin: any other is answered without
        asking its scope, which is most of the cost on a real file. KeyError for another node
        not in the tree.
        """
        root = _root_name(node)
        if root is not None and not hasattr(builtins, root) and root not in self._roots_bound_by_imports():
            return frozenset()
        return frozenset(name.name for name in self[node] if name.source in sources)

    def may_come_from(self, node: cst.CSTNode, packages: Collection[str]) -> bool:
        """Whether ``node`` may resolve to a name in one of ``packages`` (``apex``, ``torch``): not
        when its root is bound by no import of one of them (a builtin's package is ``builtins``)."""
        root = _root_name(node)
        if root is None:
            return True
        imported = self._roots_bound_by_imports().get(root)
        if imported is None:
            return "builtins" in packages and hasattr(builtins, root)
        return not imported.isdisjoint(packages)

    def _roots_bound_by_imports(self) -> dict[str, frozenset[str]]:
        """Each name an import binds, anywhere in the file, with the packages its imports come
        from (all those of an ``import a, b`` statement; "" for a relative import)."""
        if self._import_roots is None:
            scopes = {id(scope): scope for scope in self._scopes.values()}.values()
            found: dict[str, set[str]] = {}
            for scope in scopes:
                for assignment in scope.assignments:
                    if isinstance(assignment, ImportAssignment):
                        found.setdefault(assignment.name.split(".")[0], set()).update(_packages(assignment.node))
            self._import_roots = {root: frozenset(packages) for root, packages in found.items()}
        return self._import_roots


def _packages(statement: cst.Import | cst.ImportFrom) -> set[str]:
    """The top-level packages ``statement`` imports from: ``torch`` for ``import torch.nn as nn``."""
    if isinstance(statement, cst.ImportFrom):
        return {"" if statement.relative or statement.module is None else get_full_name_for_node(statement.module).split(".")[0]}
    return {alias.evaluated_name.split(".")[0] for alias in statement.names}


def _root_name(node: cst.CSTNode) -> str | None:
    """The name ``get_full_name_for_node`` starts from: ``a`` for ``a.b(c)[d]``; None when there is none."""
    while True:
        kind = type(node)
        if kind is cst.Attribute or kind is cst.Subscript:
            node = node.value
        elif kind is cst.Call:
            node = node.func
        elif kind is cst.Decorator:
            node = node.decorator
        else:
            return node.value if kind is cst.Name else None


def parents(module: cst.Module) -> dict[cst.CSTNode, cst.CSTNode]:
    """Each node's parent: the node holding it in a field (alone or in a sequence), as in ``node.children``."""
    found: dict[cst.CSTNode, cst.CSTNode] = {}
    pending: list[cst.CSTNode] = [module]
    while pending:
        node = pending.pop()
        for child in children(node):
            found[child] = node
            pending.append(child)
    return found
