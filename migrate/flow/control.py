"""The control-flow graph of one function's statements, and what the rewrites and the rules ask of it.

A node is a statement: a line of simple statements, or the header of a compound one (an ``if``'s
test, a loop's next iteration, a ``with``'s entry, a ``try``'s entry), plus an ``except``
handler's entry and the end of a ``finally``. Nested functions and classes are one node each:
their bodies do not run where they stand. An edge is one of:

- ``NORMAL``: the next statement, a branch taken, a loop entered, repeated or left;
- ``JUMP``: a ``break``, ``continue`` or ``return``;
- ``EXCEPTION``: an exception raised in a ``try`` body (any statement there may raise) caught by
  one of its handlers or run through its ``finally``, or an explicit ``raise``.

The graph over-approximates: every handler may catch (a catch-all one always does), ``finally``
may go on to any of the places its ``try`` could leave for, a ``while True:`` never ends but by a
jump. So "every path" answers err towards "no", which is the safe side for a rewrite.

The questions are asked within one iteration of a loop (``within``): a path that goes round that
loop again, or leaves it, has left the iteration; an exception that ends the loop (caught by a
handler outside it, or by none) ends the training there, so it is not a path that goes on.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple, Union

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.tree_walk import children, descendants

__all__ = ["Edge", "Graph"]

_LOOPS = (cst.For, cst.While)
_CATCH_ALL = ("Exception", "BaseException")


class Edge(str, enum.Enum):
    NORMAL = "normal"
    JUMP = "jump"
    EXCEPTION = "exception"


class _Sentinel(NamedTuple):
    name: str


END = _Sentinel("end of the function")  # fallen off the end, or returned
RAISED = _Sentinel("raised out of the function")


@dataclass(eq=False)
class _FinallyEnd:
    """Where a ``finally`` body ends: it goes on wherever its ``try`` was going."""

    node: cst.Try | cst.TryStar


Node = Union[cst.CSTNode, _Sentinel, _FinallyEnd]


class _Context(NamedTuple):
    """Where the jumps of the statements being built lead, and the loops around them."""

    breaks: Node | None
    continues: Node | None
    returns: Node
    raises: tuple[Node, ...]  # where an exception goes: handlers, a finally, or RAISED
    in_try: bool  # whether any statement may jump to ``raises`` by raising (within a try body)
    loops: tuple[cst.CSTNode, ...]


@dataclass
class Graph:
    """The control-flow graph of ``root``'s body (a function, or a module's top level).

    ``exceptions``: whether a statement in a ``try`` body may jump to its handlers. Without them,
    only an explicit ``raise`` does: the paths a program takes when nothing fails.
    """

    root: cst.CSTNode
    exceptions: bool = True
    _edges: dict[int, list[tuple[Node, Edge]]] = field(default_factory=dict, init=False, repr=False)
    _loops: dict[int, tuple[cst.CSTNode, ...]] = field(default_factory=dict, init=False, repr=False)
    _nodes: dict[int, Node] = field(default_factory=dict, init=False, repr=False)
    _ends: dict[int, _FinallyEnd] = field(default_factory=dict, init=False, repr=False)
    _sources: dict[int, list[tuple[Node, Edge]]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        body = self.root.body
        statements = list(body.body) if isinstance(body, cst.IndentedBlock) else list(body) if isinstance(self.root, cst.Module) else []
        context = _Context(None, None, END, (RAISED,), False, ())
        self.entry = self._block(statements, END, context)

    # questions

    def holds(self, statement: cst.CSTNode) -> bool:
        """Whether ``statement`` is a node of this graph (a statement of the body, not of a nested function)."""
        return id(statement) in self._nodes

    def successors(self, node: Node) -> list[tuple[Node, Edge]]:
        return list(self._edges.get(id(node), ()))

    def predecessors(self, node: Node) -> list[tuple[Node, Edge]]:
        """The nodes with an edge to ``node``, each with that edge: the ways into it."""
        if self._sources is None:
            self._sources = {}
            known = {**self._nodes, **self._ends}
            for source, edges in self._edges.items():
                for target, edge in edges:
                    self._sources.setdefault(id(target), []).append((known[source], edge))
        return list(self._sources.get(id(node), ()))

    def loops_around(self, statement: cst.CSTNode) -> tuple[cst.CSTNode, ...]:
        """The loops whose body holds ``statement``, outermost first."""
        return self._loops.get(id(statement), ())

    def way_out(self, source: cst.CSTNode, targets: Iterable[cst.CSTNode], within: cst.CSTNode | None = None
                ) -> tuple[Node, Edge] | None:
        """A way from ``source`` that ends the iteration of ``within`` (the function, for None)
        before reaching one of ``targets``: the last node on it and the edge that leaves; None
        where every way from ``source`` reaches one of them first (they post-dominate it within
        the iteration). An exception that ends the loop is no way on (see the module)."""
        return next(self.ways_out(source, targets, within), None)

    def ways_out(self, source: cst.CSTNode, targets: Iterable[cst.CSTNode], within: cst.CSTNode | None = None):
        """Each place where a way from ``source`` ends the iteration before one of ``targets``
        (see ``way_out``), once: the last node and the edge that leaves."""
        stop = {id(target) for target in targets}
        if id(source) in stop:
            return
        seen: set[int] = set()
        pending = [(source, next_node, edge) for next_node, edge in self.successors(source)]
        while pending:
            last, node, edge = pending.pop()
            if node is RAISED:
                continue
            if node is END or not self._inside(node, within):
                if edge is not Edge.EXCEPTION:
                    yield last, edge
                continue
            if id(node) in stop or id(node) in seen:
                continue
            seen.add(id(node))
            pending += [(node, next_node, next_edge) for next_node, next_edge in self.successors(node)]

    def always_reaches(self, source: cst.CSTNode, targets: Iterable[cst.CSTNode], within: cst.CSTNode | None = None) -> bool:
        """Whether every way from ``source`` within the iteration of ``within`` reaches one of ``targets``."""
        return self.way_out(source, targets, within) is None

    def reached(self, source: cst.CSTNode, targets: Iterable[cst.CSTNode], within: cst.CSTNode | None = None) -> list[cst.CSTNode]:
        """The statements that run after ``source`` and before one of ``targets`` on some way
        within the iteration of ``within``, in no particular order (``targets`` not included)."""
        stop = {id(target) for target in targets}
        return [node for node, _ in self._onward(source, within, stop) if id(node) not in stop and isinstance(node, cst.CSTNode)]

    def can_reach(self, source: cst.CSTNode, target: cst.CSTNode, within: cst.CSTNode | None = None) -> bool:
        """Whether some way from ``source`` runs ``target`` within the iteration of ``within``."""
        return any(node is target for node, _ in self._onward(source, within, {id(target)}))

    def shared_loop(self, first: cst.CSTNode, second: cst.CSTNode) -> cst.CSTNode | None:
        """The innermost loop around both statements (None: the function): the iteration they share."""
        around = self.loops_around(second)
        shared = [loop for loop in self.loops_around(first) if any(loop is other for other in around)]
        return shared[-1] if shared else None

    def may_pass(self, source: cst.CSTNode, targets: Iterable[cst.CSTNode], through: Callable[[cst.CSTNode], bool],
                 within: cst.CSTNode | None = None) -> bool:
        """Whether some way from ``source`` to one of ``targets``, within the iteration, runs a
        statement for which ``through`` holds on its way (a second backward pass before the step)."""
        targets = list(targets)
        stop = {id(target) for target in targets}
        return any(through(node) and any(id(n) in stop for n, _ in self._onward(node, within, stop))
                   for node in self.reached(source, targets, within))

    def _onward(self, source: cst.CSTNode, within: cst.CSTNode | None, stop: set[int]):
        """The nodes reachable from ``source`` within the iteration, stopping at ``stop``."""
        seen: set[int] = set()
        pending = self.successors(source)
        while pending:
            node, edge = pending.pop()
            if isinstance(node, _Sentinel) or not self._inside(node, within) or id(node) in seen:
                continue
            seen.add(id(node))
            yield node, edge
            if id(node) not in stop:
                pending += self.successors(node)

    def _inside(self, node: Node, within: cst.CSTNode | None) -> bool:
        if within is None:
            return True
        key = id(node.node) if isinstance(node, _FinallyEnd) else id(node)  # a finally ends where its try stands
        return any(loop is within for loop in self._loops.get(key, ()))

    # building

    def _add(self, node: Node, context: _Context, *successors: tuple[Node, Edge]) -> None:
        if isinstance(node, cst.CSTNode):
            self._nodes[id(node)] = node
            self._loops[id(node)] = context.loops
        edges = self._edges.setdefault(id(node), [])
        edges += [(target, edge) for target, edge in successors if target is not None]
        if context.in_try and self.exceptions:
            edges += [(target, Edge.EXCEPTION) for target in context.raises]

    def _block(self, statements: list[cst.BaseStatement], follow: Node, context: _Context) -> Node:
        """Adds the statements of a block, each leading to the next and the last to ``follow``; its entry."""
        entry = follow
        for statement in reversed(statements):
            self._statement(statement, entry, context)
            entry = statement
        return entry

    def _body(self, block: cst.BaseSuite, follow: Node, context: _Context) -> Node:
        if isinstance(block, cst.IndentedBlock):
            return self._block(list(block.body), follow, context)
        self._line(block, block.body, follow, context)  # `if x: a(); b()` on one line
        return block

    def _statement(self, statement: cst.BaseStatement, follow: Node, context: _Context) -> None:
        kind = type(statement)
        if kind is cst.SimpleStatementLine:
            self._line(statement, statement.body, follow, context)
        elif kind is cst.If:
            self._if(statement, follow, context)
        elif kind in _LOOPS:
            self._loop(statement, follow, context)
        elif kind is cst.With:
            self._add(statement, context, (self._body(statement.body, follow, context), Edge.NORMAL))
        elif kind in (cst.Try, cst.TryStar):
            self._try(statement, follow, context)
        elif kind is cst.Match:
            self._match(statement, follow, context)
        else:  # a nested function or class: defined here, run elsewhere
            self._add(statement, context, (follow, Edge.NORMAL))

    def _line(self, node: cst.CSTNode, smalls, follow: Node, context: _Context) -> None:
        """A line of simple statements: it goes on to ``follow`` unless one of them jumps."""
        for small in smalls:
            kind = type(small)
            if kind is cst.Return:
                return self._add(node, context, (context.returns, Edge.JUMP))
            if kind is cst.Break:
                return self._add(node, context, (context.breaks, Edge.JUMP))
            if kind is cst.Continue:
                return self._add(node, context, (context.continues, Edge.JUMP))
            if kind is cst.Raise:
                return self._add(node, context, *((target, Edge.EXCEPTION) for target in context.raises))
        self._add(node, context, (follow, Edge.NORMAL))

    def _if(self, statement: cst.If, follow: Node, context: _Context) -> None:
        body = self._body(statement.body, follow, context)
        orelse = statement.orelse
        if isinstance(orelse, cst.If):
            self._if(orelse, follow, context)
            other: Node = orelse
        elif isinstance(orelse, cst.Else):
            other = self._body(orelse.body, follow, context)
        else:
            other = follow
        self._add(statement, context, (body, Edge.NORMAL), (other, Edge.NORMAL))

    def _loop(self, loop: cst.For | cst.While, follow: Node, context: _Context) -> None:
        """The loop's node is its next iteration: into the body, or out (through ``else:``)."""
        inner = context._replace(breaks=follow, continues=loop, loops=(*context.loops, loop))
        body = self._body(loop.body, loop, inner)
        done = self._body(loop.orelse.body, follow, context) if loop.orelse is not None else follow
        endless = isinstance(loop, cst.While) and nodes.code(loop.test).strip() in ("True", "1")
        self._add(loop, context, (body, Edge.NORMAL), *(() if endless else ((done, Edge.NORMAL),)))

    def _try(self, statement: cst.Try | cst.TryStar, follow: Node, context: _Context) -> None:
        after = follow
        outer = context
        if statement.finalbody is not None:
            end = _FinallyEnd(statement)
            self._ends[id(end)] = end
            # the end of `finally` goes on to the statement after, or where a jump made within the
            # try or an exception was going
            jumps = _jumps_within(statement)
            onward = [(follow, Edge.NORMAL), *((target, Edge.EXCEPTION) for target in context.raises),
                      *((target, Edge.JUMP) for kind, target in ((cst.Return, context.returns), (cst.Break, context.breaks),
                                                                 (cst.Continue, context.continues)) if kind in jumps)]
            self._edges[id(end)] = [(target, edge) for target, edge in onward if target is not None]
            after = self._body(statement.finalbody.body, end, context)
            # within the try, every jump and every exception passes through `finally`
            outer = context._replace(returns=after, breaks=after if context.breaks is not None else None,
                                     continues=after if context.continues is not None else None, raises=(after,), in_try=True)
        handlers = []
        for handler in statement.handlers:  # taking the exception raises nothing more
            self._add(handler, outer._replace(in_try=False), (self._body(handler.body, after, outer), Edge.NORMAL))
            handlers.append(handler)
        catches_all = any(h.type is None or nodes.code(h.type).strip() in _CATCH_ALL for h in statement.handlers)
        raises = (*handlers, *(() if catches_all else outer.raises))
        rest = self._body(statement.orelse.body, after, outer) if statement.orelse is not None else after
        body = self._body(statement.body, rest, outer._replace(raises=raises, in_try=True))
        self._add(statement, context, (body, Edge.NORMAL))

    def _match(self, statement: cst.Match, follow: Node, context: _Context) -> None:
        cases = [(self._body(case.body, follow, context), Edge.NORMAL) for case in statement.cases]
        self._add(statement, context, *cases, (follow, Edge.NORMAL))


def _jumps_within(statement: cst.Try | cst.TryStar) -> set[type]:
    """The kinds of jump (``return``, ``break``, ``continue``) in a ``try`` that leave it: a
    ``break`` or ``continue`` in the body of a loop within it does not (one in its ``else:`` does)."""
    found: set[type] = set()
    pending: list[cst.CSTNode] = [statement.body, *statement.handlers, *([statement.orelse] if statement.orelse else [])]
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind in (cst.Return, cst.Break, cst.Continue):
            found.add(kind)
        elif kind in _LOOPS:
            # its body's `break` and `continue` are its own; a `return` there, and its else's jumps, leave the try
            found |= {cst.Return for inner in descendants(node.body, nodes.not_a_definition) if type(inner) is cst.Return}
            pending += [node.orelse] if node.orelse is not None else []
        elif nodes.not_a_definition(node):
            pending += children(node, tokens=False)
    return found
