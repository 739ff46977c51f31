"""Where statements sit: blocks, functions, classes, loops and branches."""
from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
from libcst.metadata import PositionProvider

from migrate import apex_nodes as nodes
from migrate.apex_plan.syntax import SUSPENDS, contains, defines, read_names
from migrate.tree_walk import descendants


class TreeQueries:
    """Where statements sit: blocks, functions, classes, loops and branches.

    A part of ``Planner``: its methods read and fill the planner's state.
    """

    def _statement(self, node: cst.CSTNode) -> cst.CSTNode:
        while not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            node = self.parent[id(node)]
        return node

    def _function(self, node: cst.CSTNode | None) -> cst.FunctionDef | None:
        while node is not None and not isinstance(node, cst.FunctionDef):
            node = self.parent.get(id(node))
        return node

    def _class(self, function: cst.FunctionDef | None) -> cst.ClassDef | None:
        block = self.parent.get(id(function)) if function is not None else None
        owner = self.parent.get(id(block))
        return owner if isinstance(owner, cst.ClassDef) else None

    @staticmethod
    def _first_param(function: cst.FunctionDef | None) -> str | None:
        params = function.params.params if function is not None else ()
        return params[0].name.value if params else None

    def _inside(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        while node is not None:
            if node is container:
                return True
            node = self.parent.get(id(node))
        return False

    def _inside_any(self, node: cst.CSTNode, containers: frozenset[int]) -> bool:
        """Whether ``node`` is one of, or inside one of, the nodes whose ids are ``containers``."""
        while node is not None:
            if id(node) in containers:
                return True
            node = self.parent.get(id(node))
        return False

    def _ancestors(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        found = []
        node = self.parent.get(id(node))
        while node is not None:
            found.append(node)
            node = self.parent.get(id(node))
        return found

    def _enclosing_blocks(self, statement: cst.CSTNode) -> list[cst.CSTNode]:
        """The blocks holding ``statement``, innermost first, up to its function's body."""
        blocks, node = [], self.parent.get(id(statement))
        while node is not None and not isinstance(node, cst.FunctionDef):
            if isinstance(node, (cst.IndentedBlock, cst.Module)):
                blocks.append(node)
            node = self.parent.get(id(node))
        return blocks

    def _line(self, node: cst.CSTNode) -> int | None:
        where = self.provider.get_metadata(PositionProvider, node, None)
        return where.start.line if where is not None else None

    def _line_indent(self, node: cst.CSTNode) -> int:
        """The column ``node`` starts at (0 where it has no position)."""
        where = self.provider.get_metadata(PositionProvider, node, None)
        return where.start.column if where is not None else 0

    def _in_loop(self, node: cst.CSTNode) -> bool:
        node = self.parent.get(id(node))
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            if isinstance(node, (cst.For, cst.While)):
                return True
            node = self.parent.get(id(node))
        return False

    @staticmethod
    def _changes_its_test(branch: cst.If, after: Sequence[cst.CSTNode] = ()) -> bool:
        """``if not self.initialized: ...; self.initialized = True``: a run-once guard; ``after``:
        statements that must not change the test either."""
        assigned: set[str] = set()
        for statement in (branch.body, *after):
            for node in descendants(statement):
                if type(node) is cst.AssignTarget or type(node) is cst.AugAssign:
                    assigned.update(nodes.bound_texts(node.target))
        return bool(read_names(branch.test) & assigned)

    def _in_test(self, node: cst.CSTNode) -> bool:
        """``if amp:``, ``amp is not None``, ``not amp``: an availability check, not a use."""
        parent = self.parent.get(id(node))
        if isinstance(parent, (cst.If, cst.While, cst.Assert)) and parent.test is node:
            return True
        if isinstance(parent, cst.IfExp) and parent.test is node:
            return True
        return isinstance(parent, (cst.Comparison, cst.ComparisonTarget, cst.UnaryOperation, cst.BooleanOperation))

    def _touched(self, statement: cst.CSTNode) -> bool:
        targets = self.replacements
        return any(id(node) in targets for node in descendants(statement))

    def _window(self, block: cst.CSTNode, current: cst.CSTNode) -> list[cst.BaseStatement]:
        body = list(block.body)
        end = body.index(current)
        start = end
        while start > 0 and not self._touched(body[start - 1]) and not defines(body[start - 1]) and not contains(body[start - 1], SUSPENDS):
            start -= 1
        return body[start:end]

    def _helper(self, call: cst.Call) -> cst.FunctionDef | None:
        """The file's own function (``f(x)``) or method of the caller's class (``self.f(x)``) called."""
        func = call.func
        if isinstance(func, cst.Name):
            return next((s for s in self.module.body if isinstance(s, cst.FunctionDef) and s.name.value == func.value), None)
        caller = self._function(call)
        owner = self._class(caller)
        if owner is None or not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == self._first_param(caller)):
            return None
        return next((s for s in owner.body.body if isinstance(s, cst.FunctionDef) and s.name.value == func.attr.value), None)

    def _models_seen_from(self, statement: cst.CSTNode) -> set[str]:
        """The model codes, and the names the function around ``statement`` gives them in its
        own top-level lines (``model = self.model``)."""
        models = set(self.model_codes)
        function = self._function(statement)
        for line in function.body.body if function is not None else ():
            for small in line.body if isinstance(line, cst.SimpleStatementLine) else ():
                if (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)
                        and nodes.code(small.value) in self.model_codes):
                    models.add(small.targets[0].target.value)
        return models

    def _calls_model(self, statement: cst.CSTNode, models: set[str], depth: int = 0) -> bool:
        """Whether ``statement`` runs the model: a call of it, of a helper of the file (a
        function, or a method of the same class) that calls it (``loss = self.run_batch(b)``), or
        of anything it is handed to."""
        calls = [
            node for node in descendants(statement, lambda node: type(node) is not cst.FunctionDef or node is statement)
            if type(node) is cst.Call
        ]
        for call in calls:
            func = call.func
            if nodes.code(func) in models or (isinstance(func, cst.Attribute) and func.attr.value == "forward" and nodes.code(func.value) in models):
                return True
            if any(nodes.code(arg.value) in models for arg in call.args) and not any(call in found for found in self.sites.values()):
                return True  # handed to what runs it: `loss, out = self.compute_loss(batch, self.model)`
            helper = self._helper(call) if depth < 2 else None
            if helper is not None and self._calls_model(helper, models, depth + 1):
                return True
        return False

    def _exclusive(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        """Whether the two sit in different branches of one ``if``, so never run in the same pass."""
        child, node = first, self.parent.get(id(first))
        while node is not None:
            if isinstance(node, cst.If) and self._inside(second, node) and not self._inside(second, child):
                return child is node.body or child is node.orelse
            child, node = node, self.parent.get(id(node))
        return False

    def _in_handler(self, line: cst.CSTNode, scaled: cst.CSTNode) -> bool:
        node = self.parent.get(id(line))
        while node is not None and not isinstance(node, cst.FunctionDef):
            if isinstance(node, (cst.Finally, cst.ExceptHandler, cst.ExceptStarHandler)) and not self._inside(scaled, node):
                return True
            node = self.parent.get(id(node))
        return False
