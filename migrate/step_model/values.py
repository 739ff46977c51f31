"""Which values are the training step's tensors: a def-use pass over the bindings of one walk.

A value is a *step tensor* when it is computed from what the step computes on the device: the
model's output, the loss, the parameters or their gradients. Indices, shapes, lengths, tensors
made from host values (``torch.tensor([len(x)])``, ``(schedule == t).nonzero()`` on sampled
inputs), host scalars and values already pulled (``loss.item()``) are not.

The bindings are those the walk records in execution order: assignments, ``for`` and
comprehension targets, a helper's parameters bound to the arguments of the call that entered
it, and what the helper returns, bound to that call (``return@<call>``). What a statement binds
and what each part of it gives (``a, b = x, y``) is read by ``flow.bindings``, and which of a
function's bindings reach a read by ``flow.reaching``, as the migration reads them. The answer is a fixed
point over them, seeded with what backward passes take (the loss) and what the model returns.
"""
from __future__ import annotations

import re

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.flow.bindings import plain_sequence
from migrate.flow.reaching import reaching
from migrate.step_model import vocabulary as words
from migrate.step_model.events import Via
from migrate.step_model.shapes import host_tensor
from migrate.tree_walk import descendants
from migrate.step_model.value_syntax import (HOST_BUILTINS, HOST_METHODS, HOST_MODULES, Bound, computes, container_of,
                                             loops_of, loss_names, named_a_loss, names_a_measure, pairs_bound)

# Attributes of a tensor that are host values.
_HOST_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_leaf", "grad_fn",
                              "training", "param_groups", "__class__", "__name__"})
# Predicates on a tensor's values, as torch functions or methods: `torch.isnan(x)`, `x.any()`.
# Collectives across processes, which take and give tensors: `reduce_dict`, `all_gather`, `gather_for_metrics`.
_COLLECTIVE = re.compile(r"^(all_)?(reduce|gather)(_dict|_tensor|_mean|_loss\w*|_for_metrics)?$")
# What computes the norm of the step's gradients, on the device: `clip_grad_norm_`, `fsdp2_clip_grad_norm_`.
_GRADIENT_NORM = re.compile(r"clip_grad_norm_?$")
# A key that names an index: `optim_idx`, `indices`.
_INDEX_KEY = re.compile(r"(^|_)(idx|index|indices)$")
_PREDICATES = frozenset({"isnan", "isinf", "isfinite", "any", "all", "equal", "allclose", "is_nonzero"})
_RUNS_THE_MODEL = re.compile(r"(loss|criterion|forward|step|predict|infer|evaluate)", re.IGNORECASE)
# A function named for what it does: `build_model`, `load_models`, `get_model_config`.
_VERB = re.compile(r"(load|build|get|create|make|init|setup|prepare|save|count|print|log|wrap|unwrap|set|convert|"
                   r"freeze|copy|update|sync|average|export)_")
# Names of what a step is given, not what it computes.
_INPUT_LIKE = re.compile(r"(batch|input|data|target|tgt|label|^gts?_|_gts?$|^gts?$|mask|len|idx|index|size|token|ids$|^x$|^y$)",
                         re.IGNORECASE)
_PARAMETERS = frozenset({"parameters", "named_parameters", "buffers"})
_PARAMETER_ATTRIBUTES = frozenset({"weight", "bias", "grad"})


_ANY = object()  # no one function's names: `StepValues._scope` outside `_holds_in`


def _target_scope(assignment) -> object:
    """The function whose name an assignment binds: a helper's parameter is bound at the call
    (in the caller's frames), in the helper, whose scope is that call."""
    return id(assignment.node) if type(assignment.node) is cst.Call and not assignment.written else scope_of(assignment.frames)


def scope_of(frames: tuple) -> object:
    """Which function a walk's record is in: the call that entered the helper (None: the root)."""
    entered = [frame.node for frame in frames if type(frame) is Via]
    return id(entered[-1]) if entered else None


def return_target(call: cst.Call) -> str:
    """The name a helper's ``return`` value is bound to, for the call that entered it."""
    return f"return@{id(call)}"


class StepValues:
    """The names (``loss``, ``self.outputs``, ``return@...``) that hold step tensors in one walk.

    ``assignments``: ``(targets, value, on_host)`` in execution order; ``seeds``: the expressions
    backward passes take; ``models``: what the file calls ``parameters()`` or ``train()`` on.
    ``through_calls``: what a function not of the file computes from a step tensor is one too
    (``accuracy(out, y)``): true of what has a tensor's method (``.item()``), not known of what
    is only printed (``valid, message = check(loss)``).
    """

    def __init__(self, assignments: list, seeds: list[tuple[cst.BaseExpression, object]], models: set[str], *,
                 through_calls: bool, graph_of=None) -> None:
        self._models = models
        self._through_calls = through_calls
        self._graph_of = graph_of  # a walk record's frames -> the control-flow graph of its function
        self._tick: int | None = None  # while `holds_at` asks: the read's place in the walk
        self._at: tuple | None = None  # while `holds_at` asks: the read's frames and statement
        self._reaching_memo: dict[tuple[int, str, int], object] = {}
        self._scope: object = _ANY  # while a binding's value is asked about: the function it is read in
        self._by_target: dict[str, list] = {}
        for assignment in assignments:
            for target in assignment.targets:
                self._by_target.setdefault(target, []).append(assignment)
        # The plain names that hold a step tensor, each in the function (scope) binding it: a
        # setter's `loss` parameter (a loss function) is not the training step's `loss`.
        self.names: set[str] = set()
        seeded: dict[object, set[str]] = {}  # the loss's names in the function (scope) its backward pass is in
        self._scoped: set[tuple[object, str]] = set()
        for seed, scope in seeds:
            named = loss_names(seed) | self._loss_operands(seed)
            seeded.setdefault(scope, set()).update(named)
            self._scoped |= {(scope, name) for name in named}
            self.names |= named
        given = self._given_for(self.names)
        self.names |= given
        seeded.setdefault(None, set()).update(given)
        # a comprehension's targets are its own: they hold what its element reads (`holds`), no more
        computed = [(a, pair) for a in assignments if not a.on_host and type(a.node) is not cst.CompFor
                    for pair in self._pairs(a)]
        while True:
            size = len(self._scoped)
            for assignment, (targets, value) in computed:
                targets = set(targets) | {container_of(target) for target in targets}
                scope = _target_scope(assignment)
                if all((scope, target) in self._scoped for target in targets):
                    continue
                if self._holds_in(scope_of(assignment.frames), value):
                    self._note(scope, targets)
                elif self._beside_the_loss(assignment, targets, value, seeded):
                    # its loss-named companions too (`loss, loss_items = compute_loss(...)`), not
                    # what is logged beside it (`loss, stats = self.loss(batch)`: often floats)
                    self._note(scope, {target for target in targets if named_a_loss(target)})
            if len(self._scoped) == size:
                break
        # What each binding of a name gave it, in order, with the statement and the function it
        # stands in: a read sees the bindings that reach it (`_reaching`).
        self._given: dict[str, list[tuple[int, bool, cst.CSTNode | None, object]]] = {}
        for assignment in assignments:
            pairs = self._pairs(assignment) if not assignment.on_host else [(assignment.targets, None)]
            for targets, value in pairs:
                # a loss bound by a statement is one; a loop over logged floats that calls its item `loss` is not
                # (unless a helper of the file returns what is surely a host value: `total += loss.item()`)
                holds = value is not None and self._holds_in(scope_of(assignment.frames), value)
                beside = value is not None and self._beside_the_loss(assignment, set(targets), value, seeded)
                loss = seeded.get(scope_of(assignment.frames), set())
                for target in targets:  # the loss itself, or a loss-named companion of it; not `n_samples`
                    step = holds or (beside and (target in loss or named_a_loss(target)))
                    # a comprehension's target is the comprehension's own: its statement is not where it is bound
                    where = assignment.statements[-1] if assignment.statements and type(assignment.node) is not cst.CompFor else None
                    self._given.setdefault(target, []).append((assignment.tick, step, where, scope_of(assignment.frames)))
        # What each binding made of a name on the host: pulled there (`losses = torch.tensor(losses)`,
        # `loss = loss.item()`), or computed only from such values (`isnan = torch.isnan(losses).any()`),
        # worked out when a read asks (few do; most files pull nothing into a name).
        self._host_given: dict[str, list[tuple[int, bool, object]]] = {}
        for assignment in assignments:
            pairs = self._pairs(assignment) if not assignment.on_host else [(assignment.targets, None)]
            for targets, value in pairs:
                for target in targets:
                    self._host_given.setdefault(target, []).append((assignment.tick, assignment.on_host, value))
        self._pulled_somewhere = any(assignment.on_host for assignment in assignments)
        self._host_memo: dict[tuple[str, int], bool] = {}

    def _computed_on_the_host(self, value, tick: int) -> bool:
        """Whether the step's names ``value`` reads all hold, at ``tick``, what was pulled to the host."""
        if not isinstance(value, cst.CSTNode):  # an element a helper returns: `return@<call>#1`
            read = [value] if value in self.names else []
        else:
            read = [node.value for node in descendants(value) if type(node) is cst.Name and node.value in self.names]
        return bool(read) and all(self._on_the_host(name, tick) for name in read)

    def _on_the_host(self, name: str, tick: int) -> bool:
        if not self._pulled_somewhere:
            return False
        before = [binding for binding in self._host_given.get(name, ()) if binding[0] < tick]
        if not before:
            return False
        at, pulled, value = before[-1]
        if pulled or value is None:
            return pulled
        key = (name, at)
        if key not in self._host_memo:
            self._host_memo[key] = False  # a binding that reads itself (`x = f(x)`) is not pulled by that
            self._host_memo[key] = self._computed_on_the_host(value, at)
        return self._host_memo[key]

    def _beside_the_loss(self, assignment, targets: set[str], value, seeded: dict) -> bool:
        """Whether ``targets`` are bound with the loss a backward pass takes, by one statement:
        ``loss, loss_items = compute_loss(pred, targets)`` makes both on the device."""
        return assignment.written and bool(seeded.get(scope_of(assignment.frames), set()) & targets) \
            and not self._helper_returns_host(value)

    def decides(self, test: cst.BaseExpression, tick: int, at: tuple | None = None) -> bool:
        """Whether the ``if`` test ``test`` needs a step tensor's value on the host: it compares
        one (``grad_norm > max_norm``) or asks a predicate of it (``torch.isnan(loss)``,
        ``found_inf.any()``); not ``loss is None`` or a flag."""
        kind = type(test)
        if kind is cst.BooleanOperation:
            return self.decides(test.left, tick, at) or self.decides(test.right, tick, at)
        if kind is cst.UnaryOperation:
            return self.decides(test.expression, tick, at)
        if kind is cst.Comparison:
            # a loss or a norm compared (`if loss > 1e4`, `if grad_norm > max_norm`): a counter or a
            # key that a pass over the step's values binds is no tensor for all the model knows
            valued = [t for t in test.comparisons if not isinstance(t.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn))]
            sides = [test.left, *(t.comparator for t in valued)] if valued else []
            return any(names_a_measure(side) and self.holds_at(side, tick, at) for side in sides)
        if kind is cst.Call and nodes.call_name(test) in _PREDICATES and type(test.func) is cst.Attribute:
            receiver = test.func.value
            if type(receiver) in (cst.Name, cst.Attribute) and nodes.code(receiver).split(".")[0] in ("torch", "math"):
                return any(self.holds_at(arg.value, tick, at) for arg in test.args)  # `math.isfinite(loss)` makes it a float
            return self.holds_at(receiver, tick, at)
        return False

    def _helper_returns_host(self, value) -> bool:
        """Whether ``value`` calls a helper of the file whose every return is a host value: a
        constant, or a name bound only to constants and values pulled to the host."""
        if type(value) is not cst.Call or return_target(value) not in self._by_target:
            return False

        def host(expression) -> bool:
            if type(expression) in (cst.Integer, cst.Float):
                return True
            if type(expression) is not cst.Name:
                return False
            bound = self._by_target.get(expression.value, ())
            return bool(bound) and all(b.on_host or type(b.value) in (cst.Integer, cst.Float) for b in bound)

        return all(host(binding.value) for binding in self._by_target[return_target(value)])

    def holds_at(self, expression: cst.CSTNode, tick: int, at: tuple | None = None) -> bool:
        """Whether ``expression``, read at ``tick`` of the walk, is a step tensor. ``at``: the
        read's ``(frames, statement)``, where its function's bindings of a name that reach the
        statement (``flow.reaching``) are what it holds (``for i, x in enumerate(xs)`` makes ``i``
        an index, whatever ``i`` held before the loop; a binding later in the loop's body, what the
        top of its next pass reads); what reaches from outside the function (a helper's
        parameter, bound at its call; an attribute), and any name without ``at``, holds what its
        last binding before ``tick`` in the walk gave it, or where none, what any binding gives it."""
        self._tick, self._at = tick, at  # `_has` answers by the bindings that reach the read
        try:
            return self.holds(expression)
        finally:
            self._tick, self._at = None, None

    def _note(self, scope: object, targets: set[str]) -> None:
        self.names |= targets
        self._scoped |= {(scope, target) for target in targets}

    def _holds_in(self, scope: object, value) -> bool:
        """``holds(value)``, its plain names read as ``scope`` binds them (``self.criterion =
        loss or self.criterion`` in a setter whose ``loss`` is a loss function handed in, not
        the training step's loss); attributes (``self.x``) are the object's, in every method."""
        self._scope = scope
        try:
            return self.holds(value)
        finally:
            self._scope = _ANY

    def _has(self, name: str) -> bool:
        if self._scope is not _ANY and name.isidentifier():
            inside = (self._scope, name) in self._scoped
            return inside if self._tick is None else inside and not self._on_the_host(name, self._tick)
        if self._tick is None:
            return name in self.names
        return self._reaching(name, self._tick, name in self.names) and not self._on_the_host(name, self._tick)

    def _reaching(self, name: str, tick: int, otherwise: bool) -> bool:
        given = self._given.get(name, ())
        if self._at is not None and self._graph_of is not None:
            frames, statement = self._at
            graph, scope = self._graph_of(frames), scope_of(frames)
            local = any(where is None and at_scope == scope for _, _, where, at_scope in given)
            if graph.holds(statement) and not local:
                key = (id(graph), name, id(statement))
                if key not in self._reaching_memo:
                    self._reaching_memo[key] = reaching(graph, name, statement)
                found = self._reaching_memo[key]
                bound = {id(binding) for binding in found.bindings}
                if any(step and id(where) in bound and at_scope == scope for _, step, where, at_scope in given):
                    return True
                if not found.from_outside:
                    return False
                # what the function began with: a parameter bound at the call, an attribute, a global
                given = [binding for binding in given if not graph.holds(binding[2])]
        before = [step for at, step, _, _ in given if at < tick]
        return before[-1] if before else otherwise

    def holds(self, expression: cst.CSTNode) -> bool:
        """Whether ``expression`` evaluates to a step tensor (or a container of them)."""
        kind = type(expression)
        if expression is None:
            return False
        if type(expression) is str:  # an element a helper returns: `return@<call>#1`
            return self._has(expression)
        if kind is cst.Name:
            return self._has(expression.value)
        if kind is cst.Attribute:
            return self._attribute(expression)
        if kind is cst.Call:
            return self._call(expression)
        if kind is cst.Subscript:
            key = expression.slice[0].slice if len(expression.slice) == 1 else None
            if isinstance(key, cst.Index) and _INDEX_KEY.search(nodes.literal_string(key.value) or ""):
                return False  # `out["optim_idx"]`: which optimizer to step, an index
            return self.holds(expression.value)
        if kind in (cst.BinaryOperation, cst.BooleanOperation):
            return self.holds(expression.left) or self.holds(expression.right)
        if kind is cst.UnaryOperation:
            return not isinstance(expression.operator, cst.Not) and self.holds(expression.expression)
        if kind is cst.Comparison:
            return self.holds(expression.left) or any(self.holds(c.comparator) for c in expression.comparisons)
        if kind is cst.IfExp:
            return self.holds(expression.body) or self.holds(expression.orelse)
        if kind in (cst.Tuple, cst.List, cst.Set):
            return any(self.holds(element.value) for element in expression.elements)
        if kind is cst.Dict:
            return any(self.holds(element.value) for element in expression.elements if hasattr(element, "value"))
        if kind in (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp):
            return self._comprehension(expression)
        if kind in (cst.Await, cst.StarredElement):
            return self.holds(expression.value if kind is cst.StarredElement else expression.expression)
        return False  # constants, strings, lambdas

    def _comprehension(self, node) -> bool:
        """What a comprehension makes: its element, its targets holding what they iterate."""
        saved, saved_scoped = self.names, self._scoped
        compfor, names, scoped = node.for_in, set(saved), set(saved_scoped)
        while compfor is not None:
            for targets, value in pairs_bound(Bound(compfor)):
                names.difference_update(targets)
                scoped.difference_update((self._scope, target) for target in targets)
                if self.holds(value):
                    names.update(targets)
                    scoped.update((self._scope, target) for target in targets)
            compfor = compfor.inner_for_in
        self.names, self._scoped = names, scoped
        try:
            return self.holds(node.value if type(node) is cst.DictComp else node.elt)
        finally:
            self.names, self._scoped = saved, saved_scoped

    def _attribute(self, node: cst.Attribute) -> bool:
        text = nodes.code(node)
        if self._has(text):
            return True
        attr = node.attr.value
        if attr in _HOST_ATTRIBUTES:
            return False
        if attr in _PARAMETER_ATTRIBUTES and (attr == "grad" or self._is_model(node.value)):
            return True  # `p.grad`, `model.fc.weight`
        if isinstance(node.value, cst.Name) and node.value.value == "self":
            return False
        return self.holds(node.value)  # `outputs.logits`

    def _call(self, call: cst.Call) -> bool:
        func = call.func
        returned = return_target(call)
        if returned in self._by_target:  # a helper of the file the walk entered: what it returns
            return self._has(returned)
        name = nodes.call_name(call)
        if nodes.call_name(call)[:1].isupper():
            return False  # an object made: `Model(cfg)`, `torch.optim.AdamW(model.parameters())` hold no step tensor
        if self._calls_a_model(func):
            return True  # `model(x)`, `self.net(x)`, a LightningModule's `self(x)`
        arguments = [arg.value for arg in call.args]
        if _COLLECTIVE.search(name) and any(self.holds(arg) for arg in arguments):
            return True  # `reduce_dict(loss_dict)`, `accelerator.gather(loss)`: a collective gives tensors back
        if name == "get" and call.args and _INDEX_KEY.search(nodes.literal_string(call.args[0].value) or ""):
            return False  # `retval.get("optim_idx")`
        if _GRADIENT_NORM.search(name):
            return True  # `clip_grad_norm_(...)`, `self.fsdp_model.clip_grad_norm_(...)`: the norm of the step's gradients
        if type(func) is cst.Name:
            if name in HOST_BUILTINS:
                return False
            if not self._through_calls and name not in ("sum", "max", "min"):
                return False
            return any(self.holds(arg) or self._runs_the_model(name, arg) for arg in arguments)  # `criterion(out, y)`, `sum(losses)`
        if type(func) is cst.Attribute:
            if name in HOST_METHODS:
                return False
            receiver = func.value
            if name == "train_batch" and words.runs_backward_itself(receiver):
                return True  # DeepSpeed's pipeline engine returns the step's loss
            if name == "apply" and type(receiver) is cst.Name and receiver.value[:1].isupper():
                return any(self.holds(arg) for arg in arguments)  # `AllReduce.apply(acc)`: an autograd Function
            if name in _PARAMETERS:
                return self._is_model(receiver)
            if (name == "forward" or _RUNS_THE_MODEL.search(name) and not _VERB.match(name)) and self._is_model(receiver):
                return True  # `model.forward(x)`, `model.train_step(batch)`, `self.model.compute_loss(x)`
            if words.root_text(receiver) in HOST_MODULES or nodes.code(receiver).split(".")[0] in HOST_MODULES:
                return False
            if host_tensor(call):
                return False  # `torch.tensor(loss_list)`: on the host, where the read was
            if type(receiver) in (cst.Name, cst.Attribute) and nodes.code(receiver).split(".")[0] in ("torch", "F", "nn"):
                return any(self.holds(arg) for arg in arguments)  # `torch.stack(losses)`
            if self.holds(receiver):
                return True  # `loss.detach()`, `loss_dict.values()`
            return self._through_calls and any(self.holds(arg) or self._runs_the_model(name, arg) for arg in arguments)
        return False

    def _runs_the_model(self, name: str, argument: cst.CSTNode) -> bool:
        """Whether a call named ``name`` given ``argument`` runs the model: `compute_loss(model,
        batch)`; not `accelerator.prepare(model, optimizer, loader)`, which wraps it."""
        return bool(_RUNS_THE_MODEL.search(name)) and self._is_model(argument)

    def _calls_a_model(self, func: cst.BaseExpression) -> bool:
        """Whether calling ``func`` runs a model: ``model``, ``self.net``, ``ema_model``, ``self``
        in a LightningModule; not a function named for what it does to one (``build_model``,
        ``load_asr_models``)."""
        if type(func) is cst.Name and func.value == "self":
            return True
        if not self._is_model(func):
            return False
        last = nodes.code(func).rsplit(".", 1)[-1].lower()
        return nodes.code(func) in self._models or not _VERB.match(last)

    def _is_model(self, node: cst.CSTNode) -> bool:
        if type(node) is not cst.Name and type(node) is not cst.Attribute:
            return False
        text = nodes.code(node)
        if text == "self":
            return False  # `self(x)` is asked for in `_call`: `self` handed on is no model
        return text in self._models or words.model_like(text, self._models)

    def _read_names(self, expression: cst.CSTNode) -> set[str]:
        """The names and attributes ``expression`` reads a value through (``loss`` in ``loss / accum``)."""
        found: set[str] = set()
        stack = [expression]
        while stack:
            node = stack.pop()
            if type(node) is cst.Name:
                found.add(node.value)
            elif type(node) is cst.Attribute:
                found.add(nodes.code(node))
            elif type(node) is cst.Call:
                if type(node.func) is cst.Attribute:
                    stack.append(node.func.value)
                stack.extend(arg.value for arg in node.args)
            elif type(node) is cst.Subscript:
                stack.append(node.value)
            elif type(node) in (cst.BinaryOperation, cst.BooleanOperation):
                stack += [node.left, node.right]
            elif type(node) is cst.UnaryOperation:
                stack.append(node.expression)
        return found

    def _given_for(self, losses: set[str]) -> set[str]:
        """What the calls that entered the helpers gave their loss parameters: `lm_loss` for
        `backward_step(model, lm_loss)` whose `def backward_step(model, loss)` runs `loss.backward()`."""
        found: set[str] = set()
        pending = list(self._scoped)
        while pending:
            scope, name = pending.pop()
            for binding in self._by_target.get(name, ()):
                # a parameter of this helper, given at the call: the caller's names hold the loss
                if not binding.written and type(binding.node) is cst.Call and _target_scope(binding) == scope:
                    caller = scope_of(binding.frames)
                    for given in loss_names(binding.value):
                        if (caller, given) not in self._scoped:
                            self._scoped.add((caller, given))
                            pending.append((caller, given))
                            found.add(given)
        return found - losses

    def _loss_operands(self, loss: cst.CSTNode) -> set[str]:
        """What the loss is computed from by a call of its own (``pred`` in ``loss = criterion(pred,
        y)`` where ``pred = self.backbone(images)``): a model output, though its model's name says
        nothing; not what a batch is moved or indexed into (``y = batch["y"].cuda()``)."""
        found: set[str] = set()
        for name in self._read_names(loss):
            for assignment in self._by_target.get(name, ()):
                if assignment.on_host or not assignment.written:
                    continue
                loops = loops_of(assignment)
                if type(assignment.value) is cst.Call and any(self._is_model(arg.value) for arg in assignment.value.args):
                    continue  # `compute_loss(model, batch)` runs the model: what it is given is input
                for operand in self._read_names(assignment.value) - {name}:
                    if _INPUT_LIKE.search(operand.rsplit(".", 1)[-1]):
                        continue
                    # computed in the same pass as the loss: not `args = parser.parse_args()`
                    if named_a_loss(operand) or any(
                            a.written and loops_of(a) == loops and computes(a.value) for a in self._by_target.get(operand, ())):
                        found.add(operand)
                        self._scoped.add((scope_of(assignment.frames), operand))
        return found


    def _pairs(self, assignment) -> list[tuple[tuple[str, ...], cst.BaseExpression | str | None]]:
        """``pairs_bound``, and the elements of ``a, b = helper()`` where the helper returns a tuple."""
        node = assignment.node
        if type(node) is cst.Assign and len(node.targets) == 1 and type(node.value) is cst.Call \
                and plain_sequence(node.targets[0].target):
            elements = node.targets[0].target.elements
            returned = [f"{return_target(node.value)}#{k}" for k in range(len(elements))]
            if all(name in self._by_target for name in returned):
                return [(tuple(nodes.bound_texts(t.value)), name) for t, name in zip(elements, returned)]
        return pairs_bound(assignment)
