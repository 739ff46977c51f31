"""AMP011: ``convert_syncbn_model`` / ``apex.parallel.SyncBatchNorm`` -> ``torch.nn.SyncBatchNorm``."""
from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider

from migrate import apex_nodes as nodes
from migrate import quiet
from migrate.rule import Invalid, Valid
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix, without_native
from migrate.files import first_in_project
from migrate.frozen_parameters import freezing_line, freezing_line_elsewhere, frozen_in_imports
from migrate.step_model.shapes import parameters_of
from migrate.tree_walk import descendants
from migrate.types import FixSafety, Safety

_CONVERT = "apex.parallel.convert_syncbn_model"
_CLASS = "apex.parallel.SyncBatchNorm"


class ApexSyncBatchNorm(ApexRename):
    """What it does:
    Replaces ``apex.parallel.convert_syncbn_model(model)`` with
    ``torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)`` (``process_group`` carried over) and
    ``apex.parallel.SyncBatchNorm(...)`` with ``torch.nn.SyncBatchNorm(...)``.

    Why is this bad?
    ``apex.parallel`` was removed from apex; the native SyncBatchNorm computes the same
    cross-process batch statistics.

    Fix safety:
    Safe for the standard arguments. apex's ``convert_syncbn_model`` gave the converted layers new
    parameters (requiring gradients), torch's keeps the layers' own: the conversion is unsafe
    where an optimizer is made before it in its function or handed to that function (a parameter
    named for one, not for its settings: ``optimizer_name``), where that function converts the model
    it is handed and a caller hands it an optimizer or made one before the call, or the object holds one before the
    converting method runs (``self.optimizer`` read there before anything assigns it, as one a base
    class's ``__init__`` made): under apex that optimizer held the old parameters and never updated
    the new BatchNorm weights; natively it does. Unsafe also where the
    file, a module of the project it imports, or any other file of the project (a model built
    through a registry) freezes parameters (``requires_grad = False``: a frozen BatchNorm weight
    trained under apex, and stays frozen natively; a freeze after the conversion in its own function
    froze the converted layer under apex too, and another script converting a model of its own is
    not this one's model); such a fix leaves a
    ``TODO(ampmigrate)`` marker above its line saying so. Reported with ``channel_last`` or
    ``fuse_relu`` (apex-only layouts and fusions) and for ``create_syncbn_process_group`` (use
    ``torch.distributed.new_group`` with the ranks of each group).

    Options:
    None.
    """

    CODE = "AMP011"
    MARK_UNSAFE = True  # new parameters or the layers' own: the BatchNorm weights train differently
    FIX = 'apex SyncBatchNorm / convert_syncbn_model -> torch.nn.SyncBatchNorm'
    FIX_SAFETY = FixSafety.SOMETIMES
    MESSAGE = "apex's SyncBatchNorm was removed from apex"
    TARGETS = (_CONVERT, _CLASS, "apex.parallel.create_syncbn_process_group")
    REFERENCES = {_CLASS: "torch.nn.SyncBatchNorm"}
    VALID = [Valid("import torch\nmodel = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n")]
    INVALID = [
        Invalid(
            "from apex.parallel import convert_syncbn_model\n\nmodel = convert_syncbn_model(model)\n",
            "import torch\n\nmodel = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n",
        ),
        Invalid(
            "import apex\nbn = apex.parallel.SyncBatchNorm(64, eps=1e-3)\n",
            "import torch\n\nbn = torch.nn.SyncBatchNorm(64, eps=1e-3)\n",
        ),
        Invalid(  # the optimizer made first held the old parameters: under apex it never updated the new ones
            "import torch\nfrom apex.parallel import convert_syncbn_model\n\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel = convert_syncbn_model(model)\n",
            "import torch\n\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "# TODO(ampmigrate): review, this rewrite is unsafe: the optimizer made at line\n"
            "#   4, before the conversion, held the old BatchNorm parameters: apex's\n"
            "#   converted layers got new ones it never updated, torch's keeps the old ones,\n"
            "#   which it updates\n"
            "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n",
            unsafe_fixes=True,
        ),
        Invalid("from apex.parallel import create_syncbn_process_group\ngroup = create_syncbn_process_group(8)\n"),
    ]

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        if target.endswith("create_syncbn_process_group"):
            return NoFix("build the groups with `torch.distributed.new_group(ranks)`")
        if nodes.has_star(call):
            return NoFix("its arguments are passed through `*args`/`**kwargs`")
        apex_only = nodes.keyword_names(call) & {"channel_last", "fuse_relu"}
        if apex_only:
            return without_native(apex_only)
        if target == _CONVERT:
            if len([a for a in call.args if a.keyword is None]) > 2:
                return NoFix("`channel_last` is passed positionally")
            native = self.rebuild("torch.nn.SyncBatchNorm.convert_sync_batchnorm", call)
            why = self._new_parameters_mattered(call)
            return NativeCall(native, Safety.UNSAFE, why) if why else NativeCall(native)
        if len([a for a in call.args if a.keyword is None]) > 6:
            return NoFix("apex-only arguments are passed positionally")
        return NativeCall(self.rebuild("torch.nn.SyncBatchNorm", call))

    def _new_parameters_mattered(self, call: cst.Call) -> str:
        """Why apex's new BatchNorm parameters made training differ from torch's kept ones here
        (empty where nothing shows they did)."""
        line = self.get_metadata(PositionProvider, call).start.line
        function = self._enclosing_function(call)
        scope = function or self._module
        # a method converting the model after its class's `__init__` made the optimizer runs later
        init = self._init_before(function)
        makers = self._makers()

        def runs_there(node: cst.CSTNode) -> bool:  # not the body of a function defined there
            return node is scope or node is init or nodes.not_a_definition(node)

        for node in [*descendants(scope, runs_there), *(descendants(init, runs_there) if init is not None else ())]:
            if isinstance(node, cst.Call) and (_makes_an_optimizer(node) or nodes.call_name(node) in makers) and (
                    self.get_metadata(PositionProvider, node).start.line < line or init is not None and self._inside(node, init)):
                made = self.get_metadata(PositionProvider, node).start.line
                return f"the optimizer made at line {made}, before the conversion, held the old BatchNorm parameters: {_APEX_NEW_PARAMETERS}"
        handed = self._optimizer_handed_before(function, call)
        if handed:
            return handed
        held = _optimizer_held_before(self._module.code_for_node(function)) if function is not None else None
        if held is not None:
            return (f"`self.{held}`, held before this method runs (made by `__init__` or a base class), held the old "
                    f"BatchNorm parameters: {_APEX_NEW_PARAMETERS}")
        if Path(self.context.filename).is_file():
            # the file itself first, then what it imports, then any file of the project: a model
            # registered by a decorator is built from a module the converting file never imports
            frozen = frozen_in_imports(self.context.filename, line) or first_in_project(
                self.context.filename, (b"requires_grad",), freezing_line_elsewhere)
        else:  # source given without a file (stdin, the API): only its own lines are known
            own = freezing_line(quiet.parse(self._module.code), line)
            frozen = f"line {own}" if own is not None else None
        if frozen is not None:
            return (f"parameters are frozen ({frozen}): apex's converted BatchNorm layers got new parameters that "
                    "require gradients, so a frozen BatchNorm weight trained under apex; torch's keeps it frozen")
        return ""

    def _makers(self) -> set[str]:
        """The file's functions making an optimizer when called (``def build(model): return
        optim.SGD(...)``, or through a helper defined in it), by name."""
        return {statement.name.value for statement in self._module.body if isinstance(statement, cst.FunctionDef)
                and any(isinstance(node, cst.Call) and _makes_an_optimizer(node) for node in descendants(statement.body))}

    def _optimizer_handed_before(self, function: cst.FunctionDef | None, call: cst.Call) -> str:
        """Why an optimizer existed before the conversion, handed in: a parameter of the converting
        function (``def wrap(model, optimizer)``), or, where it converts a model it is handed, a
        parameter of a function calling it, or an optimizer that function made before the call
        (``set_up(self, model, optimizer)`` running ``self.to_sync(model)``). Empty where none."""
        if function is None:
            return ""
        own = _optimizer_parameter(function)
        if own is not None:
            return (f"the optimizer `{own}` handed to `{function.name.value}` was made before the conversion and held "
                    f"the old BatchNorm parameters: {_APEX_NEW_PARAMETERS}")
        converted = call.args[0].value if call.args else None
        if not (isinstance(converted, cst.Name) and converted.value in {param.name.value for param in parameters_of(function)}):
            return ""
        for other in descendants(self._module):
            if not (isinstance(other, cst.Call) and _calls(other, function.name.value)):
                continue
            caller = self._enclosing_function(other)
            if caller is None or caller is function:
                continue
            at = self.get_metadata(PositionProvider, other).start.line
            name = _optimizer_parameter(caller)
            made = name is None and next((self.get_metadata(PositionProvider, node).start.line for node in descendants(caller)
                                          if isinstance(node, cst.Call) and _makes_an_optimizer(node)
                                          and self.get_metadata(PositionProvider, node).start.line < at), None)
            if name is not None or made:
                what = f"the optimizer `{name}` handed to `{caller.name.value}`" if name else f"the optimizer made at line {made}"
                return (f"{what}, before `{caller.name.value}` converts the model through `{function.name.value}` "
                        f"(line {at}), held the old BatchNorm parameters: {_APEX_NEW_PARAMETERS}")
        return ""

    def _init_before(self, function: cst.FunctionDef | None) -> cst.FunctionDef | None:
        """The ``__init__`` of the class ``function`` is a method of (not itself): it ran first."""
        owner = self.get_metadata(ParentNodeProvider, function, None) if function is not None else None
        owner = self.get_metadata(ParentNodeProvider, owner, None) if isinstance(owner, cst.IndentedBlock) else None
        if not isinstance(owner, cst.ClassDef) or function.name.value == "__init__":
            return None
        return next((s for s in owner.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)

    def _inside(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        while node is not None and node is not container:
            node = self.get_metadata(ParentNodeProvider, node, None)
        return node is container

    def _enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        while node is not None and not isinstance(node, cst.FunctionDef):
            node = self.get_metadata(ParentNodeProvider, node, None)
        return node


_APEX_NEW_PARAMETERS = "apex's converted layers got new ones it never updated, torch's keeps the old ones, which it updates"
# a parameter naming an optimizer's settings or maker, not an optimizer
_NOT_AN_OPTIMIZER = ("cfg", "config", "name", "type", "class", "cls", "fn", "factory", "builder", "args", "kwargs", "kind")


def _optimizer_parameter(function: cst.FunctionDef) -> str | None:
    """The first parameter of ``function`` that is an optimizer by its name (``optimizer``,
    ``g_optim``), not its settings (``optimizer_cfg``) nor a string (``optimizer: str``)."""
    for param in parameters_of(function):
        name = param.name.value.lower()
        if "optim" not in name or any(word in name for word in _NOT_AN_OPTIMIZER):
            continue
        if param.annotation is not None and nodes.code(param.annotation.annotation) in ("str", "dict", "type"):
            continue
        return param.name.value
    return None


def _calls(call: cst.Call, name: str) -> bool:
    """``name(...)`` or ``<anything>.name(...)``."""
    func = call.func
    return (isinstance(func, cst.Name) and func.value == name) or (isinstance(func, cst.Attribute) and func.attr.value == name)


def _optimizer_held_before(method: str) -> str | None:
    """The attribute of ``self`` naming an optimizer (``self.optimizer``) that ``method``'s code reads
    before it assigns it and before any call could have made it (a method of ``self``, a call handed
    ``self``): the object held it when the method began. None where there is none."""
    try:
        function = quiet.parse(textwrap.dedent(method)).body[0]
    except (SyntaxError, ValueError, IndexError):
        return None
    for kind, name in _self_events(function, top=True):
        if kind == "call":
            return None
        if "optim" in name.lower():
            return name if kind == "read" else None
    return None


def _self_events(node: ast.AST, top: bool = False) -> Iterator[tuple[str, str]]:
    """``("read" | "write", attribute)`` for each ``self.<attribute>``, and ``("call", "")`` for
    each call that may set attributes of ``self``, in the order they run (an assignment's value
    before its targets; a call after its arguments); nested definitions run later."""
    if not top and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        return
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for child in ([node.value] if node.value is not None else []) + targets:
            yield from _self_events(child)
        return
    if _on_self(node):
        yield ("read" if isinstance(node.ctx, ast.Load) else "write"), node.attr
        return
    own_method = isinstance(node, ast.Call) and _on_self(node.func)  # `self.build_optimizer()` reads no optimizer
    for child in ast.iter_child_nodes(node):
        if not (own_method and child is node.func):
            yield from _self_events(child)
    if isinstance(node, ast.Call) and (
            own_method or any(isinstance(arg, ast.Name) and arg.id == "self" for arg in (*node.args, *(k.value for k in node.keywords)))
            or (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call)
                and isinstance(node.func.value.func, ast.Name) and node.func.value.func.id == "super")):
        yield "call", ""


def _on_self(node: ast.AST) -> bool:
    """``self.<attribute>``."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _makes_an_optimizer(call: cst.Call) -> bool:
    """``torch.optim.SGD(...)``, ``optim.Adam(...)``, ``apex.optimizers.FusedAdam(...)``,
    ``create_optimizer(cfg, model)``: a class of an optimizer module, or a function named for
    making one; not ``model.get_optim_policies()``, a scheduler, nor a method of an optimizer."""
    *path, last = nodes.code(call.func).split(".")
    path, lowered = [part.lower() for part in path], last.lower()
    if "sched" in lowered or any("sched" in part for part in path):
        return False
    if any(part in ("optim", "optimizer", "optimizers") for part in path):
        # a class (SGD, FusedAdam) or a maker (optimizer.get_optimizer: a module of that name); not
        # a method of an optimizer (optimizer.first_step, optimizer.step)
        return last[:1].isupper() or "optim" in lowered and "state" not in lowered
    return "optimizer" in lowered and "state" not in lowered
