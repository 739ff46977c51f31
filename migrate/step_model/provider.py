"""The model as libcst metadata: ``StepModelProvider`` attaches the file's ``StepModel`` to the module."""
from __future__ import annotations

import libcst as cst
from libcst.metadata import BatchableMetadataProvider, QualifiedNameProvider

from migrate import apex_nodes as nodes
from migrate import tree_walk
from migrate.metadata import FILE_SETTING
from migrate.step_model import vocabulary as words
from migrate.step_model.build import FileFacts, Walk
from migrate.step_model.imported_helpers import ImportedHelpers
from migrate.step_model.model import StepModel, Steps


class StepModelProvider(BatchableMetadataProvider[StepModel]):
    """Attaches the file's ``StepModel`` to the ``Module`` node."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def visit_Module(self, node: cst.Module) -> bool:
        self.set_metadata(node, build_model(self, node))
        return False


def model_of(visitor: cst.MetadataDependent, module: cst.Module) -> StepModel:
    return visitor.get_metadata(StepModelProvider, module)


def build_model(visitor: cst.MetadataDependent, module: cst.Module) -> StepModel:
    filename = (getattr(visitor, "cache", None) or {}).get(FILE_SETTING)  # where the project's other files are
    facts = FileFacts(imported=ImportedHelpers(filename, module))
    functions: list[cst.FunctionDef] = []
    found = _Facts(visitor, facts, functions)
    found.collect(module)
    walks = [Walk(visitor, facts, root).run() for root in found.may_hold_a_step(module) if not _is_a_test(root)]
    # a function another walk enters is judged in its caller's steps, where it runs (a walk never
    # enters its own root)
    entered = {helper for walk in walks for helper in walk.helpers_entered}
    roots = [Steps(walk.root, walk.events, walk.assignments, entered=id(walk.root) in entered, entered_by=walk.entered_by) for walk in walks if walk.events]
    return StepModel(module, facts, roots)


def _is_a_test(root: cst.CSTNode) -> bool:
    """A ``test_...`` function (a unit test: its backward passes and reads are what it checks;
    one that puts inf or NaN into a scaler's step does so on purpose), not a training step."""
    return type(root) is cst.FunctionDef and root.name.value.startswith(("test_", "_test"))


# The calls whose receiver (and first argument) name a scaler, an optimizer or a model.
_READ_RECEIVER = frozenset({"unscale_", "step", "parameters", "named_parameters", "train", "eval"})
# The methods whose calls make the events every rule starts from: a backward pass, a step, a
# scaler's update, a cast of the model (``_is_step_call`` adds saves, scalers and autocast).
_STEP_CALLS = frozenset({"backward", "step", "update", "half", "train_batch"})


class _Facts(cst.CSTVisitor):
    """One walk over the file: its functions and classes, the names of its scalers, optimizers and
    models, and which functions may hold a training step."""

    def __init__(self, visitor: cst.MetadataDependent, facts: FileFacts, functions: list) -> None:
        super().__init__()
        self.visitor = visitor
        self.facts = facts
        self.functions = functions
        self.stack: list[cst.CSTNode] = []
        self.aliases: list[tuple[tuple[str, ...], str]] = []  # `scaler = self.scaler`
        self.stepping: set[int] = set()  # functions (by id; 0: the module) making one of a step's calls
        self.callees: dict[int, set[str]] = {}  # what each function calls by name: `f()`, `self.f()`

    def may_hold_a_step(self, module: cst.Module) -> list[cst.CSTNode]:
        """The module and the functions whose walk may meet an event a rule starts from: those
        calling one of its calls, or calling (by name, through any number of calls) a function
        that does. A walk of any other function finds nothing a rule reports: most of a file's."""
        named = [(id(function), function.name.value) for function in self.functions]
        # a LightningModule's training_step is one step, the backward pass Lightning's own
        stepping = set(self.stepping) | {key for key, name in named if name == "training_step"}
        while True:
            names = {name for key, name in named if key in stepping}
            more = {key for key, callees in self.callees.items() if key not in stepping and callees & names}
            if not more:
                break
            stepping |= more
        return [root for key, root in ((0, module), *((id(f), f) for f in self.functions)) if key in stepping]

    def collect(self, module: cst.Module) -> None:
        tree_walk.walk(module, self)
        facts = self.facts
        for targets, value in self.aliases:
            if value in facts.scalers:
                facts.scalers.update(targets)
        facts.models -= facts.optimizers | facts.scalers

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.facts.methods[id(node)] = {}
        if not self.stack:
            self.facts.classes.setdefault(node.name.value, node)
        self.stack.append(node)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.stack.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        facts = self.facts
        owner = self.stack[-1] if self.stack else None
        if owner is None:
            facts.functions.setdefault(node.name.value, node)
        elif isinstance(owner, cst.ClassDef):
            facts.methods[id(owner)].setdefault(node.name.value, node)
            facts.owner[id(node)] = owner
        else:
            facts.nested.setdefault(id(owner), {}).setdefault(node.name.value, node)
            if id(owner) in facts.owner:  # a function inside a method still sees `self`
                facts.owner[id(node)] = facts.owner[id(owner)]
        self.functions.append(node)
        self.stack.append(node)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.stack.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        if isinstance(value, cst.IfExp):  # `scaler = GradScaler() if amp else None`
            value = value.body
        if isinstance(value, cst.Call) and (words.is_grad_scaler(self.visitor, value) or words.makes_a_scaler(value)):
            self.facts.scalers.update(nodes.code(t.target) for t in node.targets)
        elif isinstance(value, (cst.Name, cst.Attribute)):
            self.aliases.append((tuple(nodes.code(t.target) for t in node.targets), nodes.code(value)))
        elif isinstance(value, cst.Call) and type(value.func) is cst.Name and value.func.value[:1].isupper():
            for target in node.targets:  # `metric = Metric()`: its methods are the file's, if the class is
                self.facts.instances.setdefault(nodes.code(target.target), value.func.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None and isinstance(node.value, cst.Call) and words.is_grad_scaler(self.visitor, node.value):
            self.facts.scalers.add(nodes.code(node.target))

    def visit_Call(self, node: cst.Call) -> None:
        self._note_step_call(node)
        func = node.func
        if not isinstance(func, cst.Attribute):
            return
        name = func.attr.value
        if name == "backward" and isinstance(func.value, cst.Call) and nodes.call_name(func.value) == "scale":
            inner = func.value.func
            if isinstance(inner, cst.Attribute):
                self.facts.scalers.add(nodes.code(inner.value))
            return
        if name == "backward" and any(arg.keyword is None for arg in node.args) and words.runs_backward_itself(func.value):
            self.facts.engines.add(nodes.code(func.value))
            return
        if name not in _READ_RECEIVER:
            return  # nearly every call: its receiver's text is not worked out
        receiver = nodes.code(func.value)
        first = nodes.code(node.args[0].value) if node.args else None
        if name == "unscale_":
            self.facts.scalers.add(receiver)
            if first:
                self.facts.optimizers.add(first)
        elif name == "step" and first and (receiver in self.facts.scalers or words.scaler_like(receiver)):
            # `scaler.step(optimizer)` on a scaler handed in as a parameter
            self.facts.scalers.add(receiver)
            self.facts.optimizers.add(first)
        elif name in ("parameters", "named_parameters", "train", "eval") and not words.optimizer_like(receiver):
            self.facts.models.add(receiver)

    def _note_step_call(self, node: cst.Call) -> None:
        """Note, for the function holding ``node``, whether it makes one of a step's calls and
        what it calls by name: a superset of what ``Walk`` makes those events of, and enters."""
        func, name = node.func, nodes.call_name(node)
        owner = next((id(n) for n in reversed(self.stack) if type(n) is cst.FunctionDef), 0)
        if type(func) is cst.Name or (type(func) is cst.Attribute and type(func.value) is cst.Name and func.value.value == "self"):
            self.callees.setdefault(owner, set()).add(name)
        if owner not in self.stepping and _is_step_call(self.visitor, node, name):
            self.stepping.add(owner)


def _is_step_call(visitor: cst.MetadataDependent, call: cst.Call, name: str) -> bool:
    if name == "manual_backward" or words.calls_a_loss_scaler(call):
        return True
    if type(call.func) is cst.Attribute and (name in _STEP_CALLS or (
            name == "to" and any(words.dtype_of(arg.value) == "float16" for arg in call.args))):
        return True
    if "save" in name.lower() and call.args:
        return True
    return words.is_grad_scaler(visitor, call) or words.autocast_call(visitor, call) is not None
