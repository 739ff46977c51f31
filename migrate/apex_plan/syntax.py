"""Syntax the plan reads: one walk collecting parents, names and apex references, and small
queries on statements."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.names import qualified_names
from migrate.rule import Replacement
from migrate.tree_walk import descendants, is_node_type

if TYPE_CHECKING:
    from migrate.apex_plan.planner import Planner


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


_IMPORT, _STATEMENT = "import", "statement"


@functools.lru_cache(maxsize=None)
def _kind(node_type: type) -> str | None:
    """An import, a statement or neither: asked of every node, so worked out once per node type
    (``isinstance`` on libcst's abstract base classes is slow)."""
    if node_type is cst.Import or node_type is cst.ImportFrom:
        return _IMPORT
    if node_type is cst.SimpleStatementLine or is_node_type(node_type, cst.BaseCompoundStatement):
        return _STATEMENT
    return None


class Collect(cst.CSTVisitor):
    """One walk: parents, every identifier (to pick free names), and every reference to apex.amp."""

    def __init__(self, planner: Planner) -> None:
        super().__init__()
        self.planner = planner
        self.stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        planner = self.planner
        if self.stack:
            planner.parent[id(node)] = self.stack[-1]
        self.stack.append(node)
        node_type = type(node)  # compared by identity: isinstance on libcst's classes is slow
        kind = _kind(node_type)
        if kind is _IMPORT:
            return False
        if kind is _STATEMENT:
            planner.order[id(node)] = len(planner.order)
        if node_type is cst.Try:
            self._import_fallback(node)
        if node_type is cst.Name:
            planner.names.add(node.value)
            if node.value == "torch" and isinstance(self.stack[-2], (cst.Param, cst.AssignTarget)):
                # A parameter or local named `torch`: the rewrite's `torch.autocast` would read it.
                scope = next((n for n in reversed(self.stack) if isinstance(n, (cst.FunctionDef, cst.Lambda))), None)
                if scope is not None:
                    planner.torch_shadowed.append((node, scope))
        elif node_type is cst.Attribute:
            planner.attributes.add(node.attr.value)
        elif node_type is cst.Assign:
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    planner.assigned.setdefault(target.target.value, []).append(node.value)
        elif node_type is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value == "add_argument":
            self._argument(node)
        # only a name an apex import binds resolves to apex.amp: the others need no scope lookup
        if (node_type is cst.Name or node_type is cst.Attribute) and nodes.root_name(node) in planner.imports \
                and not self._binding(node):
            found = sorted(q for q in qualified_names(planner.provider, node) if q == "apex.amp" or q.startswith("apex.amp."))
            if found:
                planner.refs.append((node, found[0]))
                return False
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()

    def _argument(self, call: cst.Call) -> None:
        """``parser.add_argument("--opt-level", choices=[...])``: the values ``args.opt_level`` can take."""
        flags = [nodes.literal_string(arg.value) for arg in call.args if arg.keyword is None]
        dest = nodes.literal_string(getattr(nodes.argument(call, None, "dest"), "value", None))
        long = next((flag for flag in flags if flag and flag.startswith("--")), None)
        name = dest or (long[2:].replace("-", "_") if long else None)
        if name is None:
            return
        choices = nodes.argument(call, None, "choices")
        values = None
        if choices is not None and isinstance(choices.value, (cst.List, cst.Tuple, cst.Set)):
            values = [nodes.literal_string(element.value) for element in choices.value.elements]
        self.planner.choices[name] = values if values and None not in values else None
        self.planner.defaults[name] = nodes.literal_string(getattr(nodes.argument(call, None, "default"), "value", None))

    def _import_fallback(self, node: cst.Try) -> None:
        """``try: from apex import amp`` / ``except ImportError: use_amp = False``: without the apex
        import, that branch never runs again; the fixes say so."""
        imports = [s for line in node.body.body if isinstance(line, cst.SimpleStatementLine) for s in line.body]
        if not any(imports_apex(small) for small in imports):
            return
        fallback = nodes.import_error_fallback(node)
        if fallback is not None:
            self.planner.notes.append(
                f"behaviour change: where apex was not installed, `{fallback}` turned mixed precision off; "
                "native torch.amp needs no install, so those runs now use it"
            )

    def _binding(self, node: cst.CSTNode) -> bool:
        """``amp = None`` in an ``except``: a new binding of the name, not a use of apex."""
        parent = self.stack[-2] if len(self.stack) > 1 else None
        if isinstance(parent, cst.AssignTarget) and parent.target is node:
            return True
        if isinstance(parent, (cst.AnnAssign, cst.AugAssign)) and parent.target is node:
            return True
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            return True
        return isinstance(parent, (cst.Param, cst.NameItem, cst.AsName, cst.Del, cst.FunctionDef, cst.ClassDef))


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


def with_first_line_comment(statement: cst.BaseStatement, text: str, keep: frozenset[int] = frozenset()) -> cst.BaseStatement:
    """``statement`` with ``text`` (a ``# ...`` comment) at the end of its first line, after any
    comment already there: where a ``# noqa`` for a finding on the statement goes. Nodes whose
    id is in ``keep`` stay the same objects (a rewrite planned for them finds them)."""

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


def imports_apex(small: cst.BaseSmallStatement) -> bool:
    if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
        return nodes.code(small.module).split(".")[0] == "apex"
    return isinstance(small, cst.Import) and any(alias.evaluated_name.split(".")[0] == "apex" for alias in small.names)


def subscript_key(subscript: cst.Subscript) -> str | None:
    """The string key of ``x["key"]``, else None."""
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    return nodes.literal_string(subscript.slice[0].slice.value)
