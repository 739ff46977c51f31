"""Small questions the plan asks of a statement or an expression, on its syntax alone."""
from __future__ import annotations

import re

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Replacement
from migrate.tree_walk import descendants


class ReplaceByIdentity(cst.CSTTransformer):
    """Swaps the given nodes (by identity) for their replacements."""

    def __init__(self, replacements: dict[int, Replacement]) -> None:
        super().__init__()
        self.replacements = replacements
        self.swapped: set[int] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) not in self.replacements

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Replacement:
        if id(original_node) in self.replacements:
            self.swapped.add(id(original_node))
            return self.replacements[id(original_node)]
        return updated_node


def backward_calls(statement: cst.CSTNode, nested: bool = False) -> list[cst.Call]:
    """``x.backward(...)`` calls (a project's own ``backward(loss, opt)`` helper is not one)."""
    return [call for call in calls(statement, lambda name: name == "backward", nested=nested) if isinstance(call.func, cst.Attribute)]


def calls(statement: cst.CSTNode, wanted, *, nested: bool = False) -> list[cst.Call]:
    """The calls in ``statement`` of something whose last name part satisfies ``wanted``; those in
    nested definitions only with ``nested``."""

    def enter(node: cst.CSTNode) -> bool:
        kind = type(node)
        return nested or not (kind is cst.Lambda or (kind is cst.FunctionDef and node is not statement))

    return [node for node in descendants(statement, enter) if type(node) is cst.Call and wanted(_last_name(node.func))]


def _last_name(func: cst.BaseExpression) -> str:
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""


def is_step(small: cst.BaseSmallStatement, optimizer: str) -> bool:
    if not isinstance(small, cst.Expr) or not isinstance(small.value, cst.Call):
        return False
    func = small.value.func
    return isinstance(func, cst.Attribute) and func.attr.value == "step" and nodes.code(func.value) == optimizer


def assigns(statement: cst.CSTNode, name: str) -> bool:
    """Whether ``statement`` binds ``name``: alone, in a tuple (``loss, aux = ...``), or in an arm
    of a compound statement; not in nested definitions."""
    return any(
        name in nodes.bound_texts(node.target)
        for node in descendants(statement, lambda node: type(node) is not cst.FunctionDef and type(node) is not cst.ClassDef)
        if type(node) in (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)
    )


def assigned_names(statement: cst.CSTNode) -> set[str]:
    """The names ``statement`` binds (as ``assigns`` counts them)."""
    return {
        name
        for node in descendants(statement, lambda node: type(node) is not cst.FunctionDef and type(node) is not cst.ClassDef)
        if type(node) in (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)
        for name in nodes.bound_texts(node.target)
    }


def reads_any(scope: cst.CSTNode, names: set[str], parent: dict[int, cst.CSTNode]) -> bool:
    """Whether code in ``scope`` reads one of ``names`` (a name bound there, ``_, results = ...``,
    an attribute's or a keyword's name, is not a read); ``parent``: each node's, by its id."""
    for node in descendants(scope):
        if type(node) is cst.Name and node.value in names:
            above = parent.get(id(node))
            if not (in_assignment_target(above, parent) or isinstance(above, cst.Param)
                    or isinstance(above, cst.Attribute) and above.attr is node or isinstance(above, cst.Arg) and above.keyword is node):
                return True
    return False


def in_assignment_target(node: cst.CSTNode | None, parent: dict[int, cst.CSTNode]) -> bool:
    """Whether ``node`` is an assignment's target, or an item of one (``model, optimizer = ...``)."""
    while isinstance(node, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
        node = parent.get(id(node))
    return isinstance(node, cst.AssignTarget)


def read_names(expression: cst.CSTNode) -> set[str]:
    """The names and dotted attributes ``expression`` reads (``has_apex``, ``args.amp``, ``args``)."""
    found: set[str] = set()
    for node in descendants(expression):
        if type(node) is cst.Name:
            found.add(node.value)
        elif type(node) is cst.Attribute:
            found.add(nodes.code(node))
    return found


def defines(statement: cst.CSTNode) -> bool:
    """Statements autocast must not swallow: definitions, imports and scope declarations."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return True
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(s, (cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal)) for s in statement.body
    )


SUSPENDS = (cst.Yield, cst.Await)  # other code runs meanwhile: autocast must not stay on across them


def contains(statement: cst.CSTNode, kinds: tuple[type, ...]) -> bool:
    """Whether ``statement`` holds a node of ``kinds`` outside nested definitions."""
    return any(isinstance(node, kinds) for node in descendants(statement, nodes.not_a_definition))


def loop_exit(statement: cst.CSTNode) -> cst.CSTNode | None:
    """The first ``return`` in ``statement``, or ``break`` or ``continue`` of a loop around it (not of
    a loop within it): where the iteration around ``statement`` may end early."""
    inner_loop = (cst.For, cst.While)
    for node in descendants(statement, nodes.not_a_definition):
        if type(node) is cst.Return:
            return node
    return next((node for node in descendants(statement, lambda n: nodes.not_a_definition(n) and type(n) not in inner_loop)
                 if type(node) in (cst.Break, cst.Continue)), None)


def arms(branch: cst.If) -> list[cst.BaseSuite]:
    """The blocks of an ``if``/``elif``/``else`` chain, in order."""
    blocks = [branch.body]
    while isinstance(branch.orelse, cst.If):
        branch = branch.orelse
        blocks.append(branch.body)
    return blocks + [branch.orelse.body] if isinstance(branch.orelse, cst.Else) else blocks


def final_exits(branch: cst.If) -> list[cst.SimpleStatementLine] | None:
    """The statements that end the iteration (``return False``, ``continue``), where each is the
    last statement of its arm of ``branch`` and no other way out is in it; None where one is
    nested deeper or comes before the end of its arm."""
    found = []
    for block in arms(branch):
        body = list(block.body) if isinstance(block, cst.IndentedBlock) else []
        if not isinstance(block, cst.IndentedBlock) and loop_exit(block) is not None:
            return None  # `else: return False` on the header's line
        last = body[-1] if body else None
        ends = isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 and isinstance(last.body[0], (cst.Return, cst.Continue, cst.Break))
        if any(loop_exit(statement) is not None for statement in (body[:-1] if ends else body)):
            return None
        if ends:
            found.append(last)
    return found


def ends_every_way(branch: cst.If) -> bool:
    """Whether each way through ``branch`` ends the iteration at the end of its arm (an ``else``
    too: without one, the test's failing way goes on after it)."""
    last = branch
    while isinstance(last.orelse, cst.If):
        last = last.orelse
    exits = final_exits(branch)
    return isinstance(last.orelse, cst.Else) and exits is not None and len(exits) == len(arms(branch))


def before_each(branch: cst.If, exits: list[cst.SimpleStatementLine], make) -> cst.If:
    """``branch`` with the statements ``make()`` gives before each of ``exits`` (the last
    statements of its arms); the statements it held stay the same objects."""
    def block(suite: cst.BaseSuite) -> cst.BaseSuite:
        if not isinstance(suite, cst.IndentedBlock) or not suite.body or not any(suite.body[-1] is end for end in exits):
            return suite
        return suite.with_changes(body=[*suite.body[:-1], *make(), suite.body[-1]])

    orelse = branch.orelse
    if isinstance(orelse, cst.If):
        orelse = before_each(orelse, exits, make)
    elif isinstance(orelse, cst.Else):
        orelse = orelse.with_changes(body=block(orelse.body))
    return branch.with_changes(body=block(branch.body), orelse=orelse)


def with_first_line_comment(statement: cst.BaseStatement, text: str, keep: frozenset[int] = frozenset()) -> cst.BaseStatement:
    """``statement`` with ``text`` (a ``# ...`` comment) at the end of its first line, after any
    comment already there: where a ``# noqa`` for a finding on the statement goes; the reason
    after a ``# noqa: CODE`` goes on a comment line of its own above, so the line stays as long
    as it was. Nodes whose id is in ``keep`` stay the same objects (a rewrite planned for them
    finds them)."""
    noqa = re.fullmatch(r"(# noqa: [A-Z]+[0-9]+) (.+)", text)
    if noqa is not None:
        text = noqa.group(1)
        above = cst.EmptyLine(comment=cst.Comment(f"# {noqa.group(2)}"))
        statement = statement.with_changes(leading_lines=[*statement.leading_lines, above])

    def joined(trailing: cst.TrailingWhitespace) -> cst.TrailingWhitespace:
        comment = f"{trailing.comment.value}  {text}" if trailing.comment else text
        return trailing.with_changes(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(comment))

    if isinstance(statement, cst.SimpleStatementLine):

        class _FirstBreak(cst.CSTTransformer):  # the first line break inside brackets ends the first line
            done = False

            def on_visit(self, node: cst.CSTNode) -> bool:
                return not self.done and id(node) not in keep

            def leave_ParenthesizedWhitespace(self, original, updated):
                if self.done:
                    return updated
                self.done = True
                return updated.with_changes(first_line=joined(updated.first_line))

        marker = _FirstBreak()
        marked = statement.visit(marker)
        return marked if marker.done else statement.with_changes(trailing_whitespace=joined(statement.trailing_whitespace))
    body = getattr(statement, "body", None)
    if isinstance(body, cst.IndentedBlock):  # a compound statement: its header line
        return statement.with_changes(body=body.with_changes(header=joined(body.header)))
    return statement


def with_inner_line_comment(statement: cst.BaseStatement, text: str, holds, keep: frozenset[int] = frozenset(),
                            itself: bool = False) -> cst.BaseStatement:
    """``with_first_line_comment`` on the innermost statement inside ``statement``'s blocks (or
    ``statement`` itself, if ``itself``) whose own line ``holds`` is first true of, in source
    order: a finding reported at an expression inside a block is on that statement's line, not on
    its block's header. Unchanged where ``statement``'s own line holds it and not ``itself``; a
    kept node is not entered (a rewrite planned for it finds it)."""
    if isinstance(statement, cst.SimpleStatementLine) or any(holds(part) for part in _header_of(statement)):
        return with_first_line_comment(statement, text, keep) if itself else statement
    for name in ("body", "handlers", "orelse", "finalbody"):  # the first block holding it
        block = getattr(statement, name, None)
        parts = block if isinstance(block, (tuple, list)) else [block]  # the `except` clauses, or one block
        first = next((i for i, part in enumerate(parts) if part is not None and holds(part)), None)
        if first is None:
            continue
        if isinstance(block, (cst.If, tuple, list)):  # an `elif`, or a clause
            if id(parts[first]) in keep:
                return statement
            marked = with_inner_line_comment(parts[first], text, holds, keep, itself=True)
            return statement.with_changes(**{name: marked if isinstance(block, cst.If) else [*parts[:first], marked, *parts[first + 1:]]})
        suite = block.body if isinstance(block, (cst.Else, cst.Finally)) else block
        inner = next((i for i, part in enumerate(suite.body) if holds(part)), None)
        if inner is None or id(suite.body[inner]) in keep or not isinstance(suite, cst.IndentedBlock):
            return statement
        marked = [*suite.body[:inner], with_inner_line_comment(suite.body[inner], text, holds, keep, itself=True), *suite.body[inner + 1:]]
        suite = suite.with_changes(body=marked)
        return statement.with_changes(**{name: block.with_changes(body=suite) if isinstance(block, (cst.Else, cst.Finally)) else suite})
    return statement


def _header_of(statement: cst.BaseStatement) -> list[cst.CSTNode]:
    """The parts of a compound statement on its first line: its test, target, iterable or items."""
    blocks = (cst.BaseSuite, cst.Else, cst.Finally, cst.If, cst.ExceptHandler, cst.ExceptStarHandler)
    return [child for child in statement.children if not isinstance(child, blocks)]


def imports_apex(small: cst.BaseSmallStatement) -> bool:
    if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
        return nodes.code(small.module).split(".")[0] == "apex"
    return isinstance(small, cst.Import) and any(alias.evaluated_name.split(".")[0] == "apex" for alias in small.names)


def subscript_key(subscript: cst.Subscript) -> str | None:
    """The string key of ``x["key"]``, else None."""
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    return nodes.literal_string(subscript.slice[0].slice.value)


def body_through_withs(parent: dict[int, cst.CSTNode], statement: cst.CSTNode) -> cst.CSTNode | None:
    """The function or module whose body runs ``statement`` whenever it gets that far: the one
    holding it, through ``with`` blocks only (``with Timer("building"):``); None where an ``if``,
    a loop or a ``try`` is on the way."""
    block = parent.get(id(statement))
    owner = parent.get(id(block))
    while isinstance(block, cst.IndentedBlock) and isinstance(owner, cst.With):
        block = parent.get(id(owner))
        owner = parent.get(id(block))
    if isinstance(block, cst.Module):
        return block
    return owner if isinstance(block, cst.IndentedBlock) and isinstance(owner, cst.FunctionDef) else None
