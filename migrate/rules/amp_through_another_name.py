"""AMP016: apex's amp reached through a name the codemod cannot resolve (``self.amp``, a parameter): reported."""
from __future__ import annotations

from collections.abc import Mapping

import libcst as cst
from libcst.metadata import (
    GlobalScope,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
    ScopeProvider,
)

from migrate import apex_nodes as nodes
from migrate.amp_reexports import SETTING as REEXPORTED
from migrate.apex_plan import CORE, ApexPlanProvider, plan_of
from migrate.names import may_resolve_within, qualified_names
from migrate.prefilter import AMP_API
from migrate.rule import Invalid, Rule, Valid


# Where a value is handed on: stored (``x.amp = amp``), passed (``f(amp=amp)``), put in a
# container or returned. Each holds it as ``value``.
_HANDING_ON = (cst.Assign, cst.AnnAssign, cst.Arg, cst.Element, cst.DictElement, cst.Return)


class AmpThroughAnotherName(Rule):
    """What it does:
    Reports calls of apex's amp API made through something that is not an import: ``self.amp.scale_loss(...)``,
    ``trainer.amp.initialize(...)``, an ``amp`` parameter (``def train(..., amp=None)``), or the handle
    returned by the legacy ``amp.init()`` (``amp_handle.scale_loss(...)``). In a file that calls none
    of amp's API itself, it also reports where the module is handed on (``model.amp = amp``,
    ``Trainer(amp=amp)``, ``return amp``): the other end of such calls, in code elsewhere.

    Why is this bad?
    These are apex calls the codemod cannot follow to their import, so it cannot rewrite them
    consistently with the ``amp.initialize`` they depend on. Left alone, they keep the file on apex.

    ``state_dict()``/``load_state_dict()``/``initialize()`` through such a name are reported only
    in a file that still shows apex (an import, or another call only apex has): a GradScaler
    handed over in the module's place answers the first two, and ``cfg.amp.initialize()`` may be
    a project's own (one given an ``opt_level`` is apex's). Calls that the AMP002-AMP005 rewrite handles (the file hands the
    module on, and the receiver has its name) are left to it, and so is an ``amp`` that no binding
    reaches (its import local to another function, or commented out) where the file calls
    ``scale_loss`` or ``master_params`` through it: ``--unsafe-fixes`` reads that one as apex's.

    It reports too every use of apex amp's API through an import from a module of the project that
    hands out apex's amp (``from utils.amp_compat import amp``, where ``utils/amp_compat.py`` does
    ``from apex import amp``, often in a ``try`` with a stand-in for machines without apex): the
    codemod rewrites only an amp imported from apex.

    Fix safety:
    No fix. Migrate them together with the place ``amp`` comes from (pass a ``GradScaler`` instead
    of the amp module), or keep the file running on ampshim.

    Options:
    None.
    """

    CODE = "AMP016"
    MESSAGE = "apex amp reached through a name that cannot be resolved to its import"
    TRIGGERS = ("amp", "apex")
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ScopeProvider, ApexPlanProvider, ParentNodeProvider)
    VALID = [
        Valid("from torch.cuda import amp\nscaler = amp.GradScaler()\n"),
        Valid("model_ref.amp_scale_loss(loss, optimizer)\n"),
        Valid("def scale_loss(loss, optimizer):\n    return loss\n\nscale_loss(loss, optimizer)\n"),
        Valid("cfg.amp.initialize(model)\n"),
        Valid("from torch.cuda import amp\n\ntrainer = Trainer(amp=amp)\n"),
        Valid("from apex import amp\n\nif amp is not None:\n    print('apex found')\n"),
    ]
    INVALID = [
        Invalid("def setup(trainer, model, optimizer):\n    return trainer.amp.initialize(model, optimizer, opt_level='O1')\n"),
        Invalid("class Hook:\n    def after_train_iter(self, runner):\n        with self.amp.scale_loss(runner.outputs['loss'], runner.optimizer) as scaled:\n            scaled.backward()\n"),
        Invalid("def train(model, optimizer, loss, amp=None):\n    if amp:\n        with amp.scale_loss(loss, optimizer) as scaled:\n            scaled.backward()\n"),
        Invalid("from apex import amp\n\nhandle = amp.init(enabled=True)\nwith handle.scale_loss(loss, optimizer) as scaled:\n    scaled.backward()\n"),
        Invalid("def initialize_amp(model):\n    from apex import amp\n    model.amp = amp\n"),
        Invalid("from apex import amp\n\ndef build(args):\n    return Trainer(args, amp=amp if args.fp16 else None)\n"),
        Invalid("import apex\n\nclass Runner:\n    def __init__(self):\n        self.amp = apex.amp\n"),
    ]

    def __init__(self, context=None) -> None:
        super().__init__(context)
        self._handles: set[str] = set()
        self._handled: frozenset[int] = frozenset()
        self._apex_seen = False  # an apex import, or an apex-only call (`scale_loss`) through a name
        self._state_calls: list[tuple[cst.Call, str]] = []
        self._handed_on: list[cst.CSTNode] = []
        self._apex_names: Mapping[str, object] = {}
        self._reexported: Mapping[str, str] = {}  # a dotted name meaning apex's amp here -> the module handing it out

    def visit_Module(self, node: cst.Module) -> None:
        self._handled = plan_of(self, node).handled  # the apex rewrite hands a GradScaler to these
        self._apex_names = nodes.apex_imports(node)  # the names apex imports bind: `amp`, `apex`
        self._apex_seen = bool(self._apex_names)
        self._reexported = dict(self.context.settings.get(REEXPORTED, ()))

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        if (isinstance(value, cst.Call) and may_resolve_within(self, value.func, ("apex",))
                and "apex.amp.init" in qualified_names(self, value.func)):
            self._handles.update(t.target.value for t in node.targets if isinstance(t.target, cst.Name))

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self._apex_names:
            self._may_hand_on(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "amp":
            self._may_hand_on(node)
        if self._reexported and node.attr.value in AMP_API:
            module = next((self._reexported[name] for name in qualified_names(self, node.value) if name in self._reexported), None)
            if module is not None:
                self.report(node, f"apex amp reached through a module of this project: `{nodes.code(node.value)}` is apex's "
                            f"amp, handed out by `{module}` (which imports it from apex); the codemod rewrites only an amp "
                            "imported from apex: import it from apex here and run ampmigrate again, or keep the file "
                            "running on ampshim")

    def _may_hand_on(self, node: cst.Name | cst.Attribute) -> None:
        """Collects ``amp`` (or ``apex.amp``) handed on as a value: stored, passed, returned."""
        if not may_resolve_within(self, node, ("apex",)) or "apex.amp" not in qualified_names(self, node):
            return
        value, parent = node, self.get_metadata(ParentNodeProvider, node, None)
        if type(parent) is cst.IfExp and parent.test is not node:  # `amp if fp16 else None`
            value, parent = parent, self.get_metadata(ParentNodeProvider, parent, None)
        if isinstance(parent, _HANDING_ON) and getattr(parent, "value", None) is value:
            self._handed_on.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute):
            return
        receiver = func.value
        if isinstance(receiver, cst.Name) and receiver.value in self._handles:
            self.report(node, f"{self.MESSAGE}: `{receiver.value}` is the legacy `amp.init()` handle; "
                        "replace it with `torch.amp.GradScaler` and `torch.autocast` by hand")
            return
        if func.attr.value not in CORE or id(node) in self._handled:
            return
        if isinstance(receiver, cst.Attribute) and receiver.attr.value == "amp":
            if self._imported_elsewhere(receiver) or "apex.amp" in qualified_names(self, receiver):
                return  # `mylib.amp`: a module of its own; `apex.amp` after `import apex`: resolved
            where = "an attribute here"
        elif isinstance(receiver, cst.Name) and receiver.value == "amp" and not self._imported(receiver):
            where = self._binding_of(receiver)
        else:
            return
        apex_shaped = func.attr.value == "initialize" and "opt_level" in nodes.keyword_names(node)
        if func.attr.value in ("state_dict", "load_state_dict", "initialize") and not apex_shaped:
            # GradScaler has the first two: once apex is gone, a scaler handed over in its place
            # answers them; and many a config has an `amp.initialize`. They are apex's only in a
            # file that still shows apex.
            self._state_calls.append((node, where))
            return
        self._apex_seen = True
        self._report_through(node, where)

    def leave_Module(self, original_node: cst.Module) -> None:
        if self._apex_seen:
            for node, where in self._state_calls:
                self._report_through(node, where)
        if not plan_of(self, original_node).findings:  # the file calls no amp API: nothing is rewritten
            for node in self._handed_on:
                self.report(node, "apex's `amp` module is handed on here, so the calls made through it elsewhere stay "
                            "on apex; migrate them together (hand a GradScaler over instead), or keep that code "
                            "running on ampshim")

    def _report_through(self, node: cst.Call, where: str) -> None:
        self.report(node, f"{self.MESSAGE}: `amp` is {where}; migrate this call together with where `amp` "
                    "comes from (hand a GradScaler over instead), or keep the file running on ampshim")

    def _binding_of(self, name: cst.Name) -> str:
        """What binds ``name`` where it is read, as the finding says it."""
        scope = self.get_metadata(ScopeProvider, name, None)
        assignments = scope[name.value] if scope is not None else ()
        if scope is not None and not assignments:
            return "bound by nothing in this file where it is read (no import reaches it; a star import may bring it)"
        if assignments and all(isinstance(assignment.scope, GlobalScope) for assignment in assignments):
            return "a module-level name set at run time, not by an import"
        return "a parameter or local variable here"

    def _imported_elsewhere(self, node: cst.BaseExpression) -> bool:
        found = self.get_metadata(QualifiedNameProvider, node, set())
        return any(q.source is QualifiedNameSource.IMPORT and q.name.split(".")[0] != "apex" for q in found)

    def _imported(self, name: cst.Name) -> bool:
        found = self.get_metadata(QualifiedNameProvider, name, set())
        return any(q.source is QualifiedNameSource.IMPORT for q in found)
