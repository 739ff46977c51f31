"""The file as the plan sees it: one walk collects each node's parent, the statements' order,
the names, argparse options and references to apex.amp; then queries on where a statement sits
(its block, function, class, loop, branch) and whether it runs the model.

A ``FileTree`` is built once per file and only read after that: every planning step asks it.
"""
from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Sequence

import libcst as cst
from libcst.metadata import PositionProvider, ScopeProvider

from migrate import apex_nodes as nodes, import_fallbacks
from migrate.apex_plan import model_names
from migrate.apex_plan.switches import boolean_names, boolean_options
from migrate.apex_plan.syntax import imports_apex, read_names
from migrate.apex_plan.unbound import unbound_reads
from migrate.flow.control import Graph
from migrate.grad_norms import defined_norms
from migrate.names import qualified_names
from migrate.step_model.shapes import parameters_given
from migrate.tree_walk import descendants, is_node_type, walk

# What only a network is asked (`teacher.eval()`): a name used so is an `nn.Module`.
MODULE_METHODS = frozenset({"eval", "train", "parameters", "named_parameters", "modules", "children",
                             "requires_grad_", "load_state_dict", "apply"})


class FileTree:
    """One file's syntax tree, walked once: parents, order, names and apex.amp references."""

    def __init__(self, provider: cst.MetadataDependent, module: cst.Module) -> None:
        self.provider = provider
        self.module = module
        self.imports = nodes.apex_imports(module)
        self.parent: dict[int, cst.CSTNode] = {}
        self.order: dict[int, int] = {}  # statement ids in source order
        self.names: set[str] = set()  # every identifier: free names are picked outside it
        self.attributes: set[str] = set()
        self.assigned: dict[str, list[cst.BaseExpression]] = {}  # name -> every value assigned to it
        self.choices: dict[str, list[str] | None] = {}  # argparse dest -> its choices, if restricted
        self.defaults: dict[str, str | None] = {}  # argparse dest -> its default, if a string
        self.switches: set[str] = set()  # argparse dests of `action="store_true"` (or "store_false")
        self.refs: list[tuple[cst.CSTNode, str]] = []  # each reference to apex.amp, and its qualified name
        self.torch_shadowed: list[tuple[cst.Name, cst.CSTNode]] = []  # `torch` bound in a function, and that function
        self.fallback_notes: list[str] = []  # `except ImportError: use_amp = False`: what the rewrite changes there
        # `amp.scale_loss` where no import of `amp` reaches (NameError): read as apex's
        self.unbound = unbound_reads(provider.metadata[ScopeProvider], module)
        self._answers: dict[tuple, object] = {}
        walk(module, _Collect(self))

    @functools.cached_property
    def gradient_norms(self) -> frozenset[str]:
        """The file's own functions returning a gradient norm (``migrate.grad_norms``): read
        only where a gradient is read at a micro-batch."""
        try:
            return defined_norms(ast.parse(self.module.code))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return frozenset()

    @functools.cached_property
    def unbound_note(self) -> str | None:
        """Why a rewrite reading an unbound ``amp`` as apex's is unsafe; None where none is read."""
        first = min(self.unbound.values(), key=lambda name: self.line(name), default=None)
        if first is None:
            return None
        imported = [self.line(statement) for statement in nodes.apex_imports_binding(self.module, first.value)]
        where = (f"apex's import at line {imported[0]} is local to another function" if imported
                 else "the file imports it nowhere")
        return (f"`{first.value}` is read at line {self.line(first)} where no import of it reaches ({where}): that raised "
                "NameError, and the rewrite takes it as apex's amp")

    @functools.cached_property
    def boolean_options(self) -> frozenset[str]:
        """``migrate.apex_plan.switches.boolean_options`` and ``boolean_names`` of this file (``args.fp16``)."""
        return boolean_options(self.module, frozenset(self.switches)) | boolean_names(self.module)

    @functools.cached_property
    def networks(self) -> frozenset[str]:
        """What the file treats as a network (``teacher.eval()``, ``args.flownet.parameters()``),
        as written: a call of one is a forward pass, whatever its name."""
        return frozenset(nodes.code(node.func.value) for node in descendants(self.module)
                         if type(node) is cst.Call and isinstance(node.func, cst.Attribute)
                         and node.func.attr.value in MODULE_METHODS
                         and isinstance(node.func.value, (cst.Name, cst.Attribute)))

    @functools.cached_property
    def line_limit(self) -> int:
        """How long a line the rewrite may write: the file's longest, or 88 if that is shorter."""
        return nodes.line_limit(self.module)

    @functools.cached_property
    def source_lines(self) -> list[str]:
        """The file's lines as written (``module.code`` renders the whole tree at each ask)."""
        return self.module.code.splitlines()

    def per_scope(self, key: tuple, compute: Callable[[], object]):
        """``compute()``, worked out once per ``key``: every site of a function (or of the module,
        where a notebook's top level may hold hundreds) asks the same questions of it."""
        if key not in self._answers:
            self._answers[key] = compute()
        return self._answers[key]

    def calls_of(self, function: cst.FunctionDef) -> list[cst.Call]:
        """The file's calls of ``function`` (as ``helper`` resolves them), in the file's order;
        the calls of every function are gathered in one walk, the first time one is asked."""
        def gather() -> dict[int, list[cst.Call]]:
            found: dict[int, list[cst.Call]] = {}
            for node in descendants(self.module):
                if type(node) is cst.Call and (called := self.helper(node)) is not None:
                    found.setdefault(id(called), []).append(node)
            return found
        return self.per_scope(("calls by function",), gather).get(id(function), [])

    def import_anchor(self) -> cst.SimpleStatementLine | None:
        """The last top-level import line: module-level definitions of the rewrite go after it."""
        anchor = None
        for statement in self.module.body:
            if nodes.is_import_line(statement):
                anchor = statement
        return anchor

    def statement(self, node: cst.CSTNode) -> cst.CSTNode:
        while not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            node = self.parent[id(node)]
        return node

    def control_flow(self, node: cst.CSTNode, exceptions: bool) -> Graph:
        """The control-flow graph of the function holding ``node`` (of the module's top level outside one)."""
        root = self.function(self.parent.get(id(node))) or self.module
        return self.per_scope(("control flow", id(root), exceptions), lambda: Graph(root, exceptions=exceptions))

    def function(self, node: cst.CSTNode | None) -> cst.FunctionDef | None:
        while node is not None and not isinstance(node, cst.FunctionDef):
            node = self.parent.get(id(node))
        return node

    def owner_class(self, function: cst.FunctionDef | None) -> cst.ClassDef | None:
        block = self.parent.get(id(function)) if function is not None else None
        owner = self.parent.get(id(block))
        return owner if isinstance(owner, cst.ClassDef) else None

    @staticmethod
    def first_param(function: cst.FunctionDef | None) -> str | None:
        params = function.params.params if function is not None else ()
        return params[0].name.value if params else None

    def inside(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        while node is not None:
            if node is container:
                return True
            node = self.parent.get(id(node))
        return False

    def inside_any(self, node: cst.CSTNode, containers: frozenset[int]) -> bool:
        """Whether ``node`` is one of, or inside one of, the nodes whose ids are ``containers``."""
        while node is not None:
            if id(node) in containers:
                return True
            node = self.parent.get(id(node))
        return False

    def ancestors(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        found = []
        node = self.parent.get(id(node))
        while node is not None:
            found.append(node)
            node = self.parent.get(id(node))
        return found

    def enclosing_blocks(self, statement: cst.CSTNode) -> list[cst.CSTNode]:
        """The blocks holding ``statement``, innermost first, up to its function's body."""
        blocks, node = [], self.parent.get(id(statement))
        while node is not None and not isinstance(node, cst.FunctionDef):
            if isinstance(node, (cst.IndentedBlock, cst.Module)):
                blocks.append(node)
            node = self.parent.get(id(node))
        return blocks

    def line(self, node: cst.CSTNode) -> int | None:
        where = self.provider.get_metadata(PositionProvider, node, None)
        return where.start.line if where is not None else None

    def line_indent(self, node: cst.CSTNode) -> int:
        """The column ``node`` starts at (0 where it has no position)."""
        where = self.provider.get_metadata(PositionProvider, node, None)
        return where.start.column if where is not None else 0

    def indent_unit(self, node: cst.CSTNode) -> str:
        """The indentation of the block ``node`` is in: new code there is indented by it."""
        block = next((a for a in self.ancestors(node) if isinstance(a, cst.IndentedBlock)), None)
        return block.indent if block is not None and block.indent is not None else self.module.default_indent

    def in_loop(self, node: cst.CSTNode) -> bool:
        return self.outermost_loop(node) is not None

    def outermost_loop(self, node: cst.CSTNode) -> cst.For | cst.While | None:
        """The outermost loop around ``node`` in its function (or class body, or module)."""
        found, node = None, self.parent.get(id(node))
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            if isinstance(node, (cst.For, cst.While)):
                found = node
            node = self.parent.get(id(node))
        return found

    @staticmethod
    def changes_its_test(branch: cst.If, after: Sequence[cst.CSTNode] = ()) -> bool:
        """``if not self.initialized: ...; self.initialized = True``: a run-once guard; ``after``:
        statements that must not change the test either."""
        assigned: set[str] = set()
        for statement in (branch.body, *after):
            for node in descendants(statement):
                if type(node) is cst.AssignTarget or type(node) is cst.AugAssign:
                    assigned.update(nodes.bound_texts(node.target))
        return bool(read_names(branch.test) & assigned)

    def in_test(self, node: cst.CSTNode) -> bool:
        """``if amp:``, ``amp is not None``, ``not amp``: an availability check, not a use."""
        parent = self.parent.get(id(node))
        if isinstance(parent, (cst.If, cst.While, cst.Assert)) and parent.test is node:
            return True
        if isinstance(parent, cst.IfExp) and parent.test is node:
            return True
        return isinstance(parent, (cst.Comparison, cst.ComparisonTarget, cst.UnaryOperation, cst.BooleanOperation))

    def helper(self, call: cst.Call) -> cst.FunctionDef | None:
        """The file's own function (``f(x)``, a closure too) or method of the caller's class
        (``self.f(x)``) called, directly or through a ``partial`` of it (``backwards(loss, opt)``
        after ``backwards = partial(loss_backwards, fp16)``)."""
        bound = self.partial_bound(call)
        if bound is not None:
            return self._function_named(bound.args[0].value, self.function(bound))
        return self._function_named(call.func, self.function(call))

    def _function_named(self, func: cst.BaseExpression, caller: cst.FunctionDef | None) -> cst.FunctionDef | None:
        """The file's function or method of ``caller``'s class that ``func``, written in ``caller``, names."""
        if isinstance(func, cst.Name):
            # a function defined in the caller or a function around it (a closure), else in the module
            enclosing = caller
            while enclosing is not None:
                if (found := self._functions_defined(enclosing).get(func.value)) is not None:
                    return found
                enclosing = self.function(self.parent.get(id(enclosing)))
            return self._functions_defined(self.module).get(func.value)
        owner = self.owner_class(caller)
        if owner is None or not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == self.first_param(caller)):
            return None
        return self._method(owner, func.attr.value)

    def _functions_defined(self, scope: cst.CSTNode) -> dict[str, cst.FunctionDef]:
        """The functions ``scope``'s own code defines (under an ``if``, a loop, a ``with`` too), by name."""
        def gather() -> dict[str, cst.FunctionDef]:
            own = nodes.own_code(scope)
            return {node.name.value: node for node in reversed(list(own)) if type(node) is cst.FunctionDef and node is not scope}
        return self.per_scope(("functions defined", id(scope)), gather)

    def lineage(self, owner: cst.ClassDef) -> list[cst.ClassDef]:
        """``owner`` and the bases of it defined at the top of the file, nearest first (what
        ``self.x`` may have been set in: ``class Trainer(BaseTrainer)``)."""
        classes = self.per_scope(("top-level classes",), lambda: {s.name.value: s for s in self.module.body if isinstance(s, cst.ClassDef)})
        found, pending = [], [owner]
        while pending:
            current = pending.pop(0)
            if current not in found:
                found.append(current)
                pending += [classes[base.value.value] for base in current.bases
                            if isinstance(base.value, cst.Name) and base.value.value in classes and base.keyword is None]
        return found

    def _method(self, owner: cst.ClassDef, name: str) -> cst.FunctionDef | None:
        """The method ``self.<name>`` calls in ``owner``: its own, else that of its bases defined at
        the top of the file, nearest first (``class EncDecTrainer(Trainer)`` calling ``self.optimize``)."""
        return next((s for cls in self.lineage(owner) for s in cls.body.body
                     if isinstance(s, cst.FunctionDef) and s.name.value == name), None)

    def partial_bound(self, call: cst.Call) -> cst.Call | None:
        """``partial(f, a)`` where ``call`` calls a name the file binds once, to that partial, in
        the function making the call or at the top level."""
        if type(call.func) is not cst.Name:
            return None
        values = self.assigned.get(call.func.value, ())
        if len(values) != 1 or type(values[0]) is not cst.Call or nodes.call_name(values[0]) != "partial":
            return None
        made = values[0]
        if not made.args or made.args[0].keyword is not None or any(arg.star for arg in made.args):
            return None
        where = self.function(made)
        if (where is not None and where is not self.function(call)) or "functools.partial" not in qualified_names(self.provider, made.func):
            return None
        return made

    def arguments(self, function: cst.FunctionDef, call: cst.Call) -> dict[str, cst.BaseExpression]:
        """What ``call`` gives each parameter of ``function``: through a ``partial``, the
        arguments it bound first, then the call's own."""
        bound = self.partial_bound(call)
        if bound is not None:
            given = [*bound.args[1:], *call.args]  # positional first, as a call must write them
            call = cst.Call(func=bound.args[0].value, args=[*(a for a in given if a.keyword is None), *(a for a in given if a.keyword)])
        return dict(parameters_given(function, call))

    def models_seen_from(self, statement: cst.CSTNode, model_codes: set[str]) -> set[str]:
        """``model_names.seen_from`` the function around ``statement``."""
        return model_names.seen_from(self.function(statement), model_codes)

    def models_wrapped(self, owner: cst.ClassDef | None, models: set[str]) -> set[str]:
        """``model_names.wrapped`` by the methods of ``owner``."""
        return model_names.wrapped(self.provider, owner, models)

    def calls_model(self, statement: cst.CSTNode, models: set[str], amp_calls: frozenset[int], depth: int = 0) -> bool:
        """Whether ``statement`` runs the model: a call of it, of a helper of the file (a
        function, or a method of the same class) that calls it (``loss = self.run_batch(b)``), or
        of anything it is handed to (but apex's own API: ``amp_calls``)."""
        calls = [
            node for node in descendants(statement, lambda node: type(node) is not cst.FunctionDef or node is statement)
            if type(node) is cst.Call
        ]
        for call in calls:
            func = call.func
            if nodes.code(func) in models or (isinstance(func, cst.Attribute) and func.attr.value == "forward" and nodes.code(func.value) in models):
                return True
            if any(nodes.code(arg.value) in models for arg in call.args) and id(call) not in amp_calls:
                return True  # handed to what runs it: `loss, out = self.compute_loss(batch, self.model)`
            helper = self.helper(call) if depth < 2 else None
            if helper is not None and self.calls_model(helper, models, amp_calls, depth + 1):
                return True
        return False

    def chain_top(self, arm: cst.If | cst.Else) -> cst.If:
        """The first ``if`` of the if/elif/else chain holding ``arm``."""
        top = arm
        while isinstance(top, cst.Else) or getattr(self.parent.get(id(top)), "orelse", None) is top:
            top = self.parent[id(top)]  # up from an else or an elif to the chain's first if
        return top

    def scaled_in_another_arm(self, plain: cst.Call, scale_calls: list[cst.Call]) -> cst.Call | None:
        """The ``amp.scale_loss`` of the loss ``plain`` backpropagates (``loss.backward()``) in another
        arm of an ``if`` around it: ``if apex: with amp.scale_loss(loss, opt_g, loss_id=1) ... else:``."""
        loss = nodes.code(plain.func.value) if isinstance(plain.func, cst.Attribute) else None
        node = self.parent.get(id(plain))
        while loss is not None and node is not None and not isinstance(node, cst.FunctionDef):
            if isinstance(node, (cst.If, cst.Else)):
                top = self.chain_top(node)
                for call in scale_calls:
                    if self.inside(call, top) and (arg := nodes.argument(call, 0, "loss")) is not None and nodes.code(arg.value) == loss:
                        return call
            node = self.parent.get(id(node))
        return None

    def exclusive(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        """Whether the two never run in the same pass: in one function, neither reaches the other
        within the iteration they share (different arms of an ``if``; an arm that ends the
        iteration, ``if warmup: loss.backward(); opt.step(); continue``, and what follows it);
        elsewhere, in different branches of one ``if``."""
        a, b = self.statement(first), self.statement(second)
        graph = self.control_flow(a, exceptions=True)
        if a is not b and graph.holds(a) and graph.holds(b):
            within = graph.shared_loop(a, b)
            return not graph.can_reach(a, b, within) and not graph.can_reach(b, a, within)
        child, node = first, self.parent.get(id(first))
        while node is not None:
            if isinstance(node, cst.If) and self.inside(second, node) and not self.inside(second, child):
                return child is node.body or child is node.orelse
            child, node = node, self.parent.get(id(node))
        return False

    def arm_tests(self, node: cst.CSTNode) -> frozenset[tuple[str, bool]]:
        """The tests of the ``if`` arms around ``node`` and the value each has there: ``("fp16", True)``
        in the body of ``if fp16:``, ``("fp16", False)`` in its ``elif`` and ``else`` arms. Only tests
        that read the same each time they are evaluated (no calls)."""
        found: set[tuple[str, bool]] = set()
        child, parent = node, self.parent.get(id(node))
        while parent is not None:
            if isinstance(parent, cst.If) and child is not parent.test:
                if nodes.is_pure(parent.test):
                    found.add((nodes.code(parent.test), child is parent.body))
            child, parent = parent, self.parent.get(id(parent))
        return frozenset(found)

    def never_together(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        """Whether an ``if`` test holds around one and fails around the other (``if fp16 and native:
        ...`` and a later ``if fp16 and native: ... elif fp16 and apex:``), or ``exclusive``."""
        tests = self.arm_tests(second)
        return any((test, not value) in tests for test, value in self.arm_tests(first)) or self.exclusive(first, second)

    def in_handler(self, line: cst.CSTNode, scaled: cst.CSTNode) -> bool:
        node = self.parent.get(id(line))
        while node is not None and not isinstance(node, cst.FunctionDef):
            if isinstance(node, (cst.Finally, cst.ExceptHandler, cst.ExceptStarHandler)) and not self.inside(scaled, node):
                return True
            node = self.parent.get(id(node))
        return False


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


class _Collect(cst.CSTVisitor):
    """One walk: parents, every identifier (to pick free names), and every reference to apex.amp."""

    def __init__(self, tree: FileTree) -> None:
        super().__init__()
        self.tree = tree
        self.stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        tree = self.tree
        if self.stack:
            tree.parent[id(node)] = self.stack[-1]
        self.stack.append(node)
        node_type = type(node)  # compared by identity: isinstance on libcst's classes is slow
        kind = _kind(node_type)
        if kind is _IMPORT:
            return False
        if kind is _STATEMENT:
            tree.order[id(node)] = len(tree.order)
        if node_type is cst.Try:
            self._import_fallback(node)
        if node_type is cst.Name:
            tree.names.add(node.value)
            if node.value == "torch" and isinstance(self.stack[-2], (cst.Param, cst.AssignTarget)):
                # A parameter or local named `torch`: the rewrite's `torch.autocast` would read it.
                scope = next((n for n in reversed(self.stack) if isinstance(n, (cst.FunctionDef, cst.Lambda))), None)
                if scope is not None:
                    tree.torch_shadowed.append((node, scope))
        elif node_type is cst.Attribute:
            tree.attributes.add(node.attr.value)
        elif node_type is cst.Assign:
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    tree.assigned.setdefault(target.target.value, []).append(node.value)
        elif node_type is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value == "add_argument":
            self._argument(node)
        if node_type is cst.Attribute and id(node.value) in tree.unbound:
            tree.refs.append((node, f"apex.amp.{node.attr.value}"))
            return False
        # only a name an apex import binds resolves to apex.amp: the others need no scope lookup
        if (node_type is cst.Name or node_type is cst.Attribute) and nodes.root_name(node) in tree.imports \
                and not self._binding(node):
            found = sorted(q for q in qualified_names(tree.provider, node) if q == "apex.amp" or q.startswith("apex.amp."))
            if found:
                tree.refs.append((node, found[0]))
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
        self.tree.choices[name] = values if values and None not in values else None
        self.tree.defaults[name] = nodes.literal_string(getattr(nodes.argument(call, None, "default"), "value", None))
        action = nodes.literal_string(getattr(nodes.argument(call, None, "action"), "value", None))
        default = nodes.argument(call, None, "default")
        if action in ("store_true", "store_false") and (default is None or nodes.code(default.value) in ("True", "False")):
            self.tree.switches.add(name)

    def _import_fallback(self, node: cst.Try) -> None:
        """``try: from apex import amp`` / ``except ImportError: use_amp = False``: without the apex
        import, that branch never runs again; the fixes say so."""
        imports = [s for line in node.body.body if isinstance(line, cst.SimpleStatementLine) for s in line.body]
        if not any(imports_apex(small) for small in imports):
            return
        change = import_fallbacks.fallback_change(self.tree.module, node)
        if change is not None:
            self.tree.fallback_notes.append(change)

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
