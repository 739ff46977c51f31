"""The metadata the rules of a run declare, resolved once for all of them, as libcst's
``MetadataWrapper`` would, with the costly providers computed here at a fraction of its cost."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Collection, Iterator, Mapping, Sequence
from types import MappingProxyType

import libcst as cst
from libcst.metadata import (
    BatchableMetadataProvider,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)
from libcst.metadata.expression_context_provider import ExpressionContextVisitor
from libcst.metadata.scope_provider import ScopeVisitor

from migrate.positions import Positions
from migrate.rule import Rule, visitor_names
from migrate.tree_walk import children, walk

__all__ = ["parents", "resolve"]


def resolve(wrapper: MetadataWrapper, visitors: Sequence[Rule], settings: Mapping) -> dict[type, Mapping]:
    """The metadata the visitors declare, resolved once for all of them, as ``MetadataWrapper`` would.

    Some providers are run here, at a fraction of the wrapper's cost:

    - ``ParentNodeProvider``: read from the nodes' fields. libcst's rebuilds each node's
      children to list them, a tenth of a one-file run.
    - ``QualifiedNameProvider``: each node's names are worked out when first asked for; libcst's
      walks the tree to attach a lazy value to every node.
    - ``PositionProvider``: ``migrate.positions``, in half the time, and only once asked for
      (the findings need it; a file with none never does).
    - other providers that only visit the ``Module`` (scopes, the apex plan): called on the
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
    parent_of = parents(module) if ours & {ParentNodeProvider, QualifiedNameProvider} else {}
    while ours:
        ready = [provider for provider in ours if provider.get_inherited_dependencies() <= metadata.keys()]
        if not ready:
            raise RuntimeError(f"circular metadata dependencies among {', '.join(p.__name__ for p in ours)}")
        for provider in ready:
            if provider is ParentNodeProvider:
                metadata[provider] = MappingProxyType(parent_of)
            elif provider is QualifiedNameProvider:
                metadata[provider] = _QualifiedNames(module, parent_of, metadata[ScopeProvider])
            elif provider is PositionProvider:
                metadata[provider] = Positions(module)
            else:
                metadata[provider] = _run_on_module(provider, module, metadata, settings)
        ours.difference_update(ready)
    return metadata


_COMPUTED_HERE = (ParentNodeProvider, QualifiedNameProvider, PositionProvider)


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


# libcst's visitors behind ScopeProvider and ExpressionContextProvider: they only read the tree.
_READ_ONLY_VISITORS = (ScopeVisitor, ExpressionContextVisitor)


@contextlib.contextmanager
def _read_only_visits() -> Iterator[None]:
    """While it lasts, ``node.visit(visitor)`` for libcst's scope and expression-context visitors
    walks the tree (``tree_walk.walk``) instead of rebuilding every node it passes: they call it on
    the module and again on children in their own methods, and rebuilding was most of their time.
    What they record is the same, but for punctuation and whitespace, which no rule asks a scope of."""
    rebuilding = cst.CSTNode.visit

    def visit(node: cst.CSTNode, visitor: cst.CSTVisitor) -> cst.CSTNode:
        if type(visitor) in _READ_ONLY_VISITORS:
            walk(node, visitor)
            return node
        return rebuilding(node, visitor)

    cst.CSTNode.visit = visit
    try:
        yield
    finally:
        cst.CSTNode.visit = rebuilding


class _QualifiedNames(Mapping):
    """``QualifiedNameProvider``'s metadata: every node of the tree, with its scope's names for it.

    As libcst's provider has it: ``scope.get_qualified_names_for(node)``, an empty set for a node
    without a scope, worked out once, when first asked for.
    """

    def __init__(self, module: cst.Module, parents: Mapping, scopes: Mapping) -> None:
        self._module = module
        self._parents = parents  # every node but the module
        self._scopes = scopes
        self._names: dict[cst.CSTNode, object] = {}

    def __getitem__(self, node: cst.CSTNode) -> object:
        names = self._names.get(node)
        if names is None:
            if node is not self._module and node not in self._parents:
                raise KeyError(node)
            scope = self._scopes.get(node)
            names = self._names[node] = scope.get_qualified_names_for(node) if scope else set()
        return names

    def __iter__(self):
        yield self._module
        yield from self._parents

    def __len__(self) -> int:
        return len(self._parents) + 1


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
