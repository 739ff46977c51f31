"""The walk: one function (or the module's top level) in execution order, into events.

Calls of the file's own functions and of methods of the same class are entered (up to a few
levels), so a step split into helpers (``self.backward(loss)``, ``self.optimizer_step()``) reads as
one; the events found there carry the call as a ``Via`` frame and point at the helper's code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import libcst as cst

from migrate import apex_nodes as nodes
from migrate import grad_readers, tree_walk
from migrate.flow.bindings import bound_names
from migrate.step_model import shapes
from migrate.step_model.imported_helpers import ImportedHelpers
from migrate.step_model import vocabulary as words
from migrate.step_model.events import Arm, Backward, Event, Handler, Kind, Loop, Region, Via
from migrate.step_model.values import return_target

_MAX_DEPTH = 4
_ASSIGNMENTS = (cst.Assign, cst.AnnAssign, cst.AugAssign)  # compared by exact type


class Assignment(NamedTuple):
    targets: tuple[str, ...]
    value: cst.BaseExpression
    order: int
    on_host: bool = False  # the value was pulled to the host: `loss_value = loss.item()`
    node: cst.CSTNode | None = None
    frames: tuple = ()
    statements: tuple = ()
    written: bool = True  # an assignment statement, not a loop target, a helper's parameter or its return
    tick: int = 0  # when, among every binding and event of the walk: a read sees the bindings before it


@dataclass
class FileFacts:
    """What the walk of each function needs to know about the whole file."""

    scalers: set[str] = field(default_factory=set)  # source text of every GradScaler: "scaler", "self.scaler"
    optimizers: set[str] = field(default_factory=set)  # what scaler.step / unscale_ are given
    models: set[str] = field(default_factory=set)  # whose .parameters() / .train() are used
    engines: set[str] = field(default_factory=set)  # what runs the backward pass itself: `model_engine.backward(loss)`
    functions: dict[str, cst.FunctionDef] = field(default_factory=dict)  # module level, by name
    methods: dict[int, dict[str, cst.FunctionDef]] = field(default_factory=dict)  # class id -> name -> method
    owner: dict[int, cst.ClassDef] = field(default_factory=dict)  # method id -> its class
    nested: dict[int, dict[str, cst.FunctionDef]] = field(default_factory=dict)  # function id -> local defs
    classes: dict[str, cst.ClassDef] = field(default_factory=dict)  # module level, by name
    instances: dict[str, str] = field(default_factory=dict)  # `metric = Metric()` -> "metric": "Metric"
    imported: ImportedHelpers | None = None  # what the helpers of the project's other files read


class Walk:
    """The events of one root (a function, or the module's top level), in execution order."""

    def __init__(self, visitor: cst.MetadataDependent, facts: FileFacts, root: cst.CSTNode) -> None:
        self.visitor = visitor
        self.facts = facts
        self.root = root
        self.events: list[Event] = []
        self.assignments: list[Assignment] = []
        self._values_of: dict[str, list[cst.BaseExpression]] = {}  # what each name was assigned so far
        self.scaled_names: dict[str, str] = {}  # `scaled = scaler.scale(loss)` -> scaled: scaler
        self.scaled_under: dict[str, tuple] = {}  # -> the `if` arms it was scaled under (`if scaler is not None:`)
        self.managed_names: set[str] = set()  # `with amp.scale_loss(...) as scaled_loss`
        self.host_names: set[str] = set()  # bound to a value already on the host: `loss = loss.cpu().numpy()`
        self._entered: list[cst.CSTNode] = [root]
        self._own_tensors: dict[int, frozenset[str]] = {}  # per function: `own_leaf_tensors`
        self._calls: list[cst.Call] = []  # the calls through which the walk entered the helpers it is in
        self.helpers_entered: set[int] = set()  # ids of the file's functions this walk entered
        self.entered_by: dict[int, cst.FunctionDef] = {}  # the call that entered a helper -> that helper
        # per function entered through a call: its parameters that call leaves off (`if verbose:`
        # does not run there); none in the root, whose callers are not known
        self._off: list[frozenset[str]] = [frozenset()]
        self._ticks = 0
        self._round_trips: set[int] = set()  # calls that are part of a larger one: `.half().float()`, `.cpu().numpy()`

    def run(self) -> "Walk":
        body = self.root.body.body if isinstance(self.root, cst.FunctionDef) else self.root.body
        if isinstance(self.root, cst.FunctionDef) and isinstance(self.root.body, cst.SimpleStatementSuite):
            body = [self.root.body]
        self._block(body, (), ())
        self._bind_losses()
        return self

    def _bind_losses(self) -> None:
        """A ``LOSS`` event where each loss a backward pass uses is assigned, in its place."""
        losses = {event.subject for event in self.events if event.kind is Kind.BACKWARD and event.subject}
        found = [a for a in self.assignments if a.written and losses & set(a.targets)]
        for assignment in reversed(found):  # from the end, so earlier positions hold
            subject = next(t for t in assignment.targets if t in losses)
            self.events.insert(assignment.order, Event(Kind.LOSS, assignment.node, assignment.frames,
                                                       assignment.statements, subject=subject))

    # statements

    def _block(self, body, frames: tuple, statements: tuple) -> None:
        for statement in body:
            self._statement(statement, frames, statements + (statement,))

    def _statement(self, node: cst.CSTNode, frames: tuple, statements: tuple) -> None:
        if type(node) is cst.FunctionDef or type(node) is cst.ClassDef:  # exact types: isinstance of a libcst node is slow
            return
        if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            for small in node.body:
                self._small(small, frames, statements)
        elif isinstance(node, (cst.For, cst.While)):
            head = node.iter if isinstance(node, cst.For) else node.test
            self._expression(head, frames, statements)
            if isinstance(node, cst.For):
                self.bind(bound_names(node), node.iter, node, frames, statements)
            # A retry loop (`while True: try: ...; break / except OutOfMemoryError: ...`) runs its
            # body once when nothing fails: it is part of the iteration around it, not one of its own.
            inner = frames if shapes.retries(node) else frames + (Loop(node),)
            self._block(_body(node.body), inner, statements)
            if node.orelse is not None:
                self._block(_body(node.orelse.body), frames, statements)
        elif isinstance(node, cst.If):
            self._if(node, frames, statements)
        elif isinstance(node, cst.With):
            self._with(node, frames, statements)
        elif isinstance(node, cst.Try) or type(node).__name__ == "TryStar":
            self._block(_body(node.body), frames + (Handler(node),), statements)
            for handler in node.handlers:
                self._block(_body(handler.body), frames + (Handler(handler),), statements)
            if node.orelse is not None:
                self._block(_body(node.orelse.body), frames, statements)
            if node.finalbody is not None:
                self._block(_body(node.finalbody.body), frames + (Handler(node.finalbody),), statements)
        elif isinstance(node, cst.Match):
            for case in node.cases:
                self._block(_body(case.body), frames, statements)

    def _if(self, node: cst.If, frames: tuple, statements: tuple) -> None:
        self._expression(node.test, frames, statements)
        self._pull(node.test, frames, statements, node.test, form="if")  # `if torch.isnan(loss):` waits for the loss
        test, polarity = words.normalised_test(node.test)
        flags = _plain_names(node.test)
        modulo = words.has_modulo(node.test) or any(
            words.has_modulo(value) for name in flags for value in self._values_of.get(name, ()))
        timed = words.compares_time(node.test)
        leaves = shapes.leaves(node.body)
        once = words.holds_on_one_step(node.test)
        if not (type(node.test) is cst.Name and node.test.value in self._off[-1]):  # an opt-in not taken: no body
            self._block(_body(node.body), frames + (Arm(node, True, test, polarity, modulo, timed, leaves, once),), statements)
        other = frames + (Arm(node, False, test, not polarity, modulo, timed,
                              node.orelse is not None and not isinstance(node.orelse, cst.If) and shapes.leaves(node.orelse.body)),)
        if isinstance(node.orelse, cst.If):
            self._if(node.orelse, other, statements + (node.orelse,))
        elif node.orelse is not None:
            self._block(_body(node.orelse.body), other, statements)

    def _with(self, node: cst.With, frames: tuple, statements: tuple) -> None:
        inner = frames
        for item in node.items:
            self._expression(item.item, frames, statements)
            call = item.item
            if isinstance(call, cst.Call):
                found = words.autocast_call(self.visitor, call)
                if found is not None:
                    region = Region(node, *found)
                    inner = inner + (region,)
                    self._add(Kind.AUTOCAST, call, frames, statements, detail={"dtype": found[0], "enabled": found[1]})
                elif nodes.call_name(call) == "scale_loss" and item.asname is not None:
                    self.managed_names.add(nodes.code(item.asname.name))
        self._block(_body(node.body), inner, statements)

    def _small(self, small: cst.BaseSmallStatement, frames: tuple, statements: tuple) -> None:
        value = getattr(small, "value", None)
        if type(small) in _ASSIGNMENTS and value is not None:
            targets = bound_names(small)
            self._expression(value, frames, statements)
            on_host = shapes.on_the_host(value) or self._returns_host(value)
            self.assignments.append(Assignment(targets, value, len(self.events), on_host, small, frames, statements,
                                               tick=self._tick()))
            for target in targets:
                self._values_of.setdefault(target, []).append(value)
            if type(small) is not cst.AugAssign:
                self.host_names.difference_update(targets)
                if on_host:
                    self.host_names.update(targets)
            made = value.body if type(value) is cst.IfExp else value  # `scaler = NativeScaler() if amp else None`
            if type(made) is cst.Call and type(small) is not cst.AugAssign and words.made_by_a_factory(self.visitor, made, self.facts.scalers):
                # a scaler made by a factory or another class (timm's `NativeScaler()`, `get_grad_scaler(cfg)`)
                self._add(Kind.SCALER_NEW, made, frames, statements,
                          detail={"enabled": words.made_scaler_enabled(made), "factory": True})
            if isinstance(value, cst.Call) and nodes.call_name(value) == "scale":
                scaler = _receiver_text(value)
                for target in targets:
                    self.scaled_names[target] = scaler
                    self.scaled_under[target] = tuple(frame for frame in frames if isinstance(frame, Arm))
        elif isinstance(small, (cst.Expr, cst.Return)) and value is not None:
            self._expression(value, frames, statements)
            if type(small) is cst.Return and self._calls:
                returned = return_target(self._calls[-1])
                self.bind((returned,), value, small, frames, statements)
                if type(value) is cst.Tuple:  # `return loss, logs`: each element for `loss, logs = helper()`
                    for k, element in enumerate(value.elements):
                        self.bind((f"{returned}#{k}",), element.value, small, frames, statements)
        elif isinstance(small, cst.Assert):
            self._expression(small.test, frames, statements)

    def own_leaf_tensors(self, function: cst.CSTNode) -> frozenset[str]:
        """``grad_readers.own_leaf_tensors`` of a function the walk is in, worked out once."""
        if id(function) not in self._own_tensors:
            self._own_tensors[id(function)] = grad_readers.own_leaf_tensors(function)
        return self._own_tensors[id(function)]

    def _tick(self) -> int:
        self._ticks += 1
        return self._ticks

    def bind(self, targets: tuple[str, ...], value: cst.BaseExpression, node: cst.CSTNode, frames: tuple,
             statements: tuple) -> None:
        """Record that ``targets`` take ``value`` here (a loop target, a helper's parameter or return)."""
        self.assignments.append(Assignment(targets, value, len(self.events), shapes.on_the_host(value), node, frames, statements,
                                           written=False, tick=self._tick()))

    # expressions

    def _expression(self, expression: cst.CSTNode, frames: tuple, statements: tuple) -> None:
        tree_walk.walk(expression, _Events(self, frames, statements))

    def _call(self, call: cst.Call, frames: tuple, statements: tuple) -> None:
        name = nodes.call_name(call)
        func = call.func
        receiver = _receiver_text(call)
        first = call.args[0].value if call.args else None
        if words.calls_a_loss_scaler(call, self.facts.scalers):
            # timm's NativeScaler: `loss_scaler(loss, optimizer, clip_grad=..., parameters=...)` scales
            # the loss, runs backward, unscales before its clip, steps and updates
            loss = call.args[0].value
            self._add(Kind.BACKWARD, call, frames, statements, subject=_text(loss), how=Backward.MANAGED,
                      detail={"loss": loss, "framework": "NativeScaler"})
            optimizer = nodes.argument(call, 1, "optimizer")
            self._add(Kind.STEP, call, frames, statements, subject=_text(optimizer.value) if optimizer else None,
                      detail={"framework": "NativeScaler"})
        if shapes.host_tensor(call):  # `torch.tensor(loss_list)`: a list of device tensors copied to the host
            self._pull(call, frames, statements, first, form="torch.tensor()")
        elif self.facts.imported is not None and self._helper(call) is None:
            reader = self.facts.imported.reader(call, self.facts.instances)  # a helper of another file
            for argument in reader.arguments(call) if reader is not None else ():
                self._pull(call, frames, statements, argument.value, form="imported helper", reader=reader,
                           spread=argument.star == "**")
            if reader is not None and reader.backward:
                self._add(Kind.BACKWARD_ELSEWHERE, call, frames, statements, detail={"reader": reader})
        if isinstance(func, cst.Attribute):
            if name == "backward":
                if self._helper(call) is None:  # the file's own `self.backward(loss)` is entered instead
                    self._backward(call, frames, statements)
            elif name == "manual_backward" and first is not None and self._helper(call) is None:  # Lightning
                self._add(Kind.BACKWARD, call, frames, statements, subject=_text(first), how=Backward.MANAGED,
                          detail={"loss": first, "runner": receiver})
            elif name == "step" and receiver in self.facts.engines:  # DeepSpeed: `model_engine.step()`
                self._add(Kind.STEP, call, frames, statements, subject=receiver)
            elif name == "train_batch" and receiver and words.runs_backward_itself(func.value):
                # DeepSpeed's pipeline engine: `loss = engine.train_batch(data_iter=it)` is a whole step
                self._add(Kind.BACKWARD, call, frames, statements, subject=receiver, how=Backward.MANAGED,
                          detail={"loss": call, "framework": "DeepSpeed"})
                self._add(Kind.STEP, call, frames, statements, subject=receiver, detail={"framework": "DeepSpeed"})
            elif name == "unscale_" and receiver in self.facts.scalers:
                self._add(Kind.UNSCALE, call, frames, statements, subject=_text(first), scaler=receiver)
            elif name == "step" and receiver in self.facts.scalers:
                self._add(Kind.SCALER_STEP, call, frames, statements, subject=_text(first), scaler=receiver)
            elif name == "step" and (receiver in self.facts.optimizers or words.optimizer_like(receiver)):
                self._add(Kind.STEP, call, frames, statements, subject=receiver)
            elif name == "update" and receiver in self.facts.scalers:
                self._add(Kind.UPDATE, call, frames, statements, scaler=receiver)
            elif name == "zero_grad" or (name in ("zero_", "fill_") and words.grad_attribute(func.value) is not None):
                self._add(Kind.ZERO_GRAD, call, frames, statements, subject=receiver)  # `img.grad.zero_()` too
            elif name in words.PULL_METHODS and not call.args and id(call) not in self._round_trips:
                inner = func.value  # `loss.detach().cpu().numpy()` is one pull: the outermost reports it
                while isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute):
                    self._round_trips.add(id(inner))
                    inner = inner.func.value
                self._pull(call, frames, statements, shapes.pulled_value(func.value), form=name)
            elif (name == "half" or (name == "to" and any(words.dtype_of(arg.value) == "float16" for arg in call.args))) \
                    and id(call) not in self._round_trips:
                self._add(Kind.HALF, call, frames, statements, subject=receiver)
            if name in ("float", "to") and isinstance(func.value, cst.Call):
                self._round_trips.add(id(func.value))  # `model.half().float()`: back to float32 at once
            elif name == "format":
                for value in shapes.formatted_values(call):  # `"{:.4f}".format(loss)`
                    self._pull(value, frames, statements, value, form="format()")
            elif name == "load_state_dict":
                self._add(Kind.LOAD, call, frames, statements, subject=receiver)
            elif name == "forward" and receiver in self.facts.models:
                self._add(Kind.FORWARD, call, frames, statements, subject=receiver)
        elif isinstance(func, cst.Name):
            if name == "float" and first is not None:
                self._pull(call, frames, statements, first, form="float()")
            elif name == "int" and first is not None and not shapes.keyed_item(first):  # `int(stats["batch size"])`: a count
                self._pull(call, frames, statements, first, form="int()")
            elif name == "print":
                for arg in call.args:
                    if arg.keyword is None and isinstance(arg.value, (cst.Name, cst.Attribute, cst.Subscript)):
                        self._pull(arg.value, frames, statements, arg.value, form="print()")
        if _code(func) and words.model_like(_code(func), self.facts.models):
            self._add(Kind.FORWARD, call, frames, statements, subject=_code(func))
        if words.reads_gradients(call):
            self._add(Kind.GRAD_READ, call, frames, statements, subject=_text(first))
        if "save" in name.lower() and call.args:
            self._add(Kind.SAVE, call, frames, statements)
        if words.is_grad_scaler(self.visitor, call):
            enabled = nodes.argument(call, None, "enabled")
            self._add(Kind.SCALER_NEW, call, frames, statements,
                      detail={"enabled": True if enabled is None else words.literal_bool(enabled.value)})
        elif (found := words.autocast_call(self.visitor, call)) is not None and not _in_with_item(call, statements):
            self._add(Kind.AUTOCAST, call, frames, statements, detail={"dtype": found[0], "enabled": found[1], "object": True})

    def _after_call(self, call: cst.Call, frames: tuple, statements: tuple) -> None:
        helper = self._helper(call)
        if helper is not None and helper not in self._entered and len(self._entered) <= _MAX_DEPTH:
            self._entered.append(helper)
            self._calls.append(call)
            self.helpers_entered.add(id(helper))
            self.entered_by[id(call)] = helper
            self._off.append(shapes.flags_off(helper, call))
            for parameter, argument in shapes.parameters_given(helper, call):
                self.bind((parameter,), argument, call, frames, statements)
                if isinstance(argument, cst.Call) and nodes.call_name(argument) == "scale" and _receiver_text(argument) in self.facts.scalers:
                    self.scaled_names[parameter] = _receiver_text(argument)  # `self._backward(scaler.scale(loss))`
                elif _code(argument) in self.scaled_names:  # `scaled = scaler.scale(loss)`, then `self._backward(scaled)`
                    self.scaled_names[parameter] = self.scaled_names[_code(argument)]
            body = helper.body.body if isinstance(helper.body, cst.IndentedBlock) else [helper.body]
            self._block(body, frames + (Via(call, shapes.evaluates(helper)),), ())
            self._calls.pop()
            self._entered.pop()
            self._off.pop()

    def _backward(self, call: cst.Call, frames: tuple, statements: tuple) -> None:
        target = call.func.value
        scaler, scaled_under = None, ()
        first = call.args[0].value if call.args else None
        if isinstance(target, cst.Call) and nodes.call_name(target) == "scale" and _receiver_text(target) in self.facts.scalers:
            taken = target.args[0].value if target.args else None
            how, scaler, loss = Backward.SCALED, _receiver_text(target), _text(taken)
        elif _code(target) in self.scaled_names:
            taken = target
            how, scaler, loss = Backward.SCALED, self.scaled_names[_code(target)], _code(target)
            scaled_under = tuple(arm for arm in self.scaled_under.get(_code(target), ()) if arm not in frames)
        elif isinstance(target, (cst.Name, cst.Attribute, cst.Subscript)) and not _manager(target, call, self):
            taken = target
            how, loss = Backward.PLAIN, words.root_text(target)
        else:
            taken = first
            how, loss = Backward.MANAGED, _text(first)
        # what runs a managed backward: `accelerator` in `accelerator.backward(loss)`
        runner = _code(target) if how is Backward.MANAGED else None
        self._add(Kind.BACKWARD, call, frames, statements, subject=loss, scaler=scaler, how=how,
                  detail={"loss": taken, "scaled_under": scaled_under, "runner": runner})

    def _returns_host(self, value: cst.BaseExpression) -> bool:
        """Whether ``value`` calls a function of the file whose every return is on the host
        (``loss = self.fit_batch(batch)``, which returns ``loss.detach().cpu()``)."""
        helper = self._helper(value) if type(value) is cst.Call else None
        return helper is not None and shapes.returns_only_host_values(helper)

    def _helper(self, call: cst.Call) -> cst.FunctionDef | None:
        found = self._callee(call)
        return None if found is not None and found.name.value.startswith(("test_", "_test")) else found  # a unit test

    def _callee(self, call: cst.Call) -> cst.FunctionDef | None:
        func = call.func
        facts = self.facts
        if type(func) is cst.Name:
            for entered in reversed(self._entered):
                local = facts.nested.get(id(entered), {}).get(func.value)
                if local is not None:
                    return local
            if func.value in facts.functions:
                return facts.functions[func.value]
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
            for entered in reversed(self._entered):
                owner = facts.owner.get(id(entered))
                if owner is not None:
                    found = facts.methods[id(owner)].get(func.attr.value)
                    if found is not None:
                        return found
        # an instance of a class of the file: `metric(preds)` runs its `__call__`, `metric.update(x)` its method
        text = _code(func)
        instance, method = (text, "__call__") if text in facts.instances else (_code(func.value), func.attr.value) \
            if isinstance(func, cst.Attribute) else ("", "")
        owner = facts.classes.get(facts.instances.get(instance, ""))
        return facts.methods[id(owner)].get(method) if owner is not None else None

    def _pull(self, node: cst.CSTNode, frames: tuple, statements: tuple, pulled: cst.BaseExpression, **detail) -> None:
        """A read on the host of ``pulled``; ``host``: what it reads through holds a value already there."""
        if getattr(pulled, "lpar", None):
            pulled = pulled.with_changes(lpar=(), rpar=())  # `(self.losses)` reads `self.losses`
        subject = words.root_text(pulled)
        self._add(Kind.HOST_PULL, node, frames, statements, subject=subject,
                  detail={**detail, "pulled": pulled, "host": subject in self.host_names, "tick": self._tick()})

    def _add(self, kind: Kind, node: cst.CSTNode, frames: tuple, statements: tuple, **fields) -> None:
        self.events.append(Event(kind, node, frames, statements, **fields))


class _Events(words.GradientUses):
    """The events of one expression, in the order they happen, added to ``walk``."""

    def __init__(self, walk: Walk, frames: tuple, statements: tuple) -> None:
        super().__init__()
        self.walk, self.frames, self.statements = walk, frames, statements

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Call(self, node: cst.Call) -> bool:
        super().visit_Call(node)
        self.walk._call(node, self.frames, self.statements)
        return True

    def leave_Call(self, node: cst.Call) -> None:
        self.walk._after_call(node, self.frames, self.statements)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        super().visit_Attribute(node)
        if node.attr.value == "grad" and id(node) not in self.unread:  # `.grad` only moved, averaged, cleared or tested
            if type(node.value) is cst.Name and node.value.value in self.walk.own_leaf_tensors(self.walk._entered[-1]):
                return  # an input perturbation's gradient: no optimizer's, so no `unscale_` of one unscales it
            self.walk._add(Kind.GRAD_READ, node, self.frames, self.statements, subject=nodes.code(node.value))

    def visit_FormattedStringExpression(self, node: cst.FormattedStringExpression) -> None:
        self.walk._pull(node, self.frames, self.statements, node.expression, form="f-string")

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        for value in shapes.formatted_values(node):  # `"%.4f" % loss`
            self.walk._pull(value, self.frames, self.statements, value, form="%-format")

    def _comprehension(self, node) -> None:
        """Its targets bound before its element is walked: a read there sees them."""
        compfor = node.for_in
        while compfor is not None:
            self.walk.bind(bound_names(compfor), compfor.iter, compfor, self.frames, self.statements)
            compfor = compfor.inner_for_in

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._comprehension(node)

    def visit_SetComp(self, node: cst.SetComp) -> None:
        self._comprehension(node)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        self._comprehension(node)

    def visit_DictComp(self, node: cst.DictComp) -> None:
        self._comprehension(node)


def _manager(target: cst.BaseExpression, call: cst.Call, walk: Walk) -> bool:
    """``accelerator.backward(loss)``, ``self.backward(loss)``, ``model_engine.backward(loss)``,
    apex's ``scaled_loss.backward()``: a backward that is not ``tensor.backward()``."""
    text = nodes.code(target)
    if text in walk.managed_names or text in walk.facts.engines:
        return True
    return any(arg.keyword is None for arg in call.args) and words.runs_backward_itself(target)


def _plain_names(test: cst.BaseExpression) -> list[str]:
    """``log_now`` in ``if log_now:`` / ``if rank == 0 and log_now:``: flags a test reads directly."""
    if isinstance(test, cst.BooleanOperation):
        return _plain_names(test.left) + _plain_names(test.right)
    return [nodes.code(test)] if isinstance(test, (cst.Name, cst.Attribute)) else []


_body = shapes.body


def _receiver_text(call: cst.Call) -> str:
    return nodes.receiver(call) or ""


def _text(node: cst.CSTNode | None) -> str | None:
    return nodes.code(node) if node is not None else None


def _code(node: cst.CSTNode) -> str:
    return nodes.code(node) if type(node) is cst.Name or type(node) is cst.Attribute else ""


def _in_with_item(call: cst.Call, statements: tuple) -> bool:
    owner = statements[-1] if statements else None
    return isinstance(owner, cst.With) and any(item.item is call for item in owner.items)
