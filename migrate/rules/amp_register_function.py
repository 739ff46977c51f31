"""AMP007: ``amp.register_half_function(torch, "einsum")`` and ``amp.lists`` edits: dropped or reported."""
from __future__ import annotations

import libcst as cst
from libcst.metadata import ParentNodeProvider

from migrate import apex_nodes as nodes
from migrate.apex_kept import MIGRATED_SETTING
from migrate.apex_plan import ApexPlanProvider, plan_of
from migrate.names import may_resolve_within, qualified_names
from migrate.native_casts import REGISTER, TORCH_MODULES, registered_natively
from migrate.rule import Invalid, Valid
from migrate.rules._apex_planned import apex_casts_after_run
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix, marked
from migrate.types import FixSafety, Safety


class AmpRegisterFunction(ApexRename):
    """What it does:
    Removes ``amp.register_half_function(torch, "einsum")`` (and ``register_float_function``);
    reports registrations of functions outside ``torch`` and any change to ``amp.lists``.

    Why is this bad?
    Native autocast has no registry to add functions to; these calls only fed apex's patching.

    Fix safety:
    Safe when the function is on native autocast's own float16 (or float32) list: the behaviour
    is already there. Unsafe for another ``torch`` function: without the registration it runs in
    its inputs' dtype. Reported for functions of other modules (a project's own kernels): wrap
    the calls in ``with torch.autocast("cuda", enabled=False):`` and cast the inputs by hand.
    The registration goes only with the project's ``amp.initialize``, and is no safer than its
    rewrite: while apex still initializes, in this file or in another file of the project that
    the run leaves on apex, it still casts through the registry (without it an O1 einsum meets
    float16 and float32 inputs and raises), so the call is only reported. Where the file
    initializes nothing, apex amp starts in another file: removing it is as safe as above where
    that file is in the run and a safe run migrates it (the project's every ``amp.initialize``,
    in a project whose extent is known), and unsafe otherwise.

    Options:
    None.
    """

    CODE = "AMP007"
    FIX = 'drops register_*_function where autocast already casts it'
    FIX_SAFETY = FixSafety.SOMETIMES
    MESSAGE = "apex's cast registry does not exist in native autocast"
    TARGETS = tuple(REGISTER)
    METADATA_DEPENDENCIES = (*ApexRename.METADATA_DEPENDENCIES, ApexPlanProvider)

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        self._casts = apex_casts_after_run(plan_of(self, node), self.context.settings)
    VALID = [Valid("def register_half_function(module, name):\n    pass\nregister_half_function(torch, 'einsum')\n")]
    INVALID = [
        Invalid(
            "import torch\nfrom apex import amp\n\nif args.fp16:\n    amp.register_half_function(torch, 'einsum')\n"
            "model, optimizer = amp.initialize(model, optimizer, opt_level='O1')\nloss = model(x).sum()\n"
            "with amp.scale_loss(loss, optimizer) as scaled_loss:\n    scaled_loss.backward()\noptimizer.step()\n",
            "import torch\nscaler = torch.amp.GradScaler(\"cuda\")\nwith torch.autocast(\"cuda\", dtype=torch.float16):\n"
            "    loss = model(x).sum()\nscaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.update()\n",
        ),
        Invalid("import torch\nfrom apex import amp\namp.register_half_function(torch, 'einsum')\n",
                "import torch\n# TODO(ampmigrate): review, this rewrite is unsafe: removed\n"
                "#   `amp.register_half_function(torch, 'einsum')`: apex amp is initialized in\n"
                "#   another file, where apex still casts through the registry until that file is\n"
                "#   migrated\npass\n",
                unsafe_fixes=True),
        Invalid("import torch\nfrom apex import amp\namp.register_float_function(torch, 'sigmoid')\n"
                "model, optimizer = amp.initialize(model, optimizer, opt_level='O1')\nloss = model(x).sum()\n"
                "with amp.scale_loss(loss, optimizer) as scaled_loss:\n    scaled_loss.backward()\noptimizer.step()\n",
                "import torch\n# TODO(ampmigrate): review, this rewrite is unsafe: the file changes apex's cast lists\n"
                "#   (`amp.register_float_function`, line 3): native autocast does not read them, so the\n"
                "#   ops they name run in autocast's own precision\nscaler = torch.amp.GradScaler(\"cuda\")\n"
                "with torch.autocast(\"cuda\", dtype=torch.float16):\n    loss = model(x).sum()\n"
                "scaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.update()\n", unsafe_fixes=True),
        Invalid("from apex import amp\namp.register_half_function(my_ops, 'fused_gelu')\n"),
        Invalid("from apex import amp\namp.lists.functional_overrides.FP32_FUNCS.remove('softmax')\n"),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        target = self._target(node.func)
        if target is None:
            return
        self._funcs.add(id(node.func))
        module = nodes.argument(node, 0, "module")
        name = nodes.literal_string(getattr(nodes.argument(node, 1, "name"), "value", None))
        torch_function = bool(module) and name is not None and bool(set(TORCH_MODULES) & qualified_names(self, module.value))
        statement = self._statements.get(id(node))
        if not torch_function or statement is None:
            self.report(node, f"{self.MESSAGE}; not rewritten: wrap the calls of {name or 'this function'!r} in "
                        "`with torch.autocast(\"cuda\", enabled=False):` and cast the inputs by hand")
            return
        if registered_natively(target, qualified_names(self, module.value), name):
            self._fix_statement(node, statement, Safety.SAFE, "native autocast already casts this function the same way")
        else:
            self._fix_statement(node, statement, Safety.UNSAFE, f"native autocast does not cast {name!r} this way: without "
                                "the registration it runs in its inputs' dtype (wrap its calls in "
                                "`with torch.autocast(\"cuda\", enabled=False):` with cast inputs to keep apex's cast)")

    def _fix_statement(self, call: cst.Call, statement: cst.SimpleStatementLine, safety: Safety, why: str) -> None:
        root = nodes.root_name(call.func)
        guard = nodes.guarding_if(statement, lambda n: self.get_metadata(ParentNodeProvider, n, None))
        casts = self._casts
        if casts.stay:
            self.report(guard or statement, f"{self.MESSAGE}; not removed: {casts.why}, and apex casts through the registry")
            return
        replacement: cst.SimpleStatementLine | cst.RemovalSentinel = cst.RemoveFromParent()
        started = tuple(self.context.settings.get(MIGRATED_SETTING, ()))
        if not self._initializes_here():  # apex amp starts in another file
            if started:  # only where this run migrates it, safely
                why = f"{why}; apex amp starts at {', '.join(started[:3])}{', ...' if len(started) > 3 else ''}, which this run migrates"
            else:
                elsewhere = ("apex amp is initialized in another file, where apex still casts through the registry until that "
                             "file is migrated")
                safety, why = Safety.UNSAFE, elsewhere if safety is Safety.SAFE else f"{why}; {elsewhere}"
            if safety is Safety.UNSAFE:  # no plan of this file marks it: a `pass` holds the marker where the call stood
                replacement = marked(nodes.with_leading(cst.SimpleStatementLine([cst.Pass()]), guard or statement),
                                     f"removed `{nodes.code(call)}`: {why}")
        elif casts.safety is Safety.UNSAFE and safety is Safety.SAFE:
            safety, why = Safety.UNSAFE, casts.why
        self.report(
            guard or statement,
            f"{self.MESSAGE}; {why}",
            replacement=replacement,
            safety=safety,
            fix_message="Remove the registration",
            why_unsafe=why if safety is Safety.UNSAFE else "",
            remove_imports=tuple(self._apex_imports.get(root or "", ())),
        )

    def _initializes_here(self) -> bool:
        return bool(plan_of(self, self._module).findings_for("AMP002"))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if not hasattr(self, "_statements"):
            self._statements: dict[int, cst.SimpleStatementLine] = {}
        if len(node.body) == 1 and isinstance(node.body[0], cst.Expr) and isinstance(node.body[0].value, cst.Call):
            self._statements[id(node.body[0].value)] = node

    def _reference(self, node: cst.BaseExpression) -> None:
        if id(node) in self._funcs or getattr(self, "_inside_lists", False) or not may_resolve_within(self, node, ("apex",)):
            return
        names = qualified_names(self, node)
        if any(n == "apex.amp.lists" or n.startswith("apex.amp.lists.") for n in names):
            self.report(node, f"{self.MESSAGE}; not rewritten: `amp.lists` edits have no native equivalent; "
                        "wrap the affected calls in `with torch.autocast(\"cuda\", enabled=False):` and cast by hand")
            self._inside_lists = node
        elif self._target(node) is not None:
            self.report(node, f"{self.MESSAGE}; not rewritten: this use is not a call")

    def leave_Attribute(self, original_node: cst.Attribute) -> None:
        if getattr(self, "_inside_lists", None) is original_node:
            self._inside_lists = False

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        return NoFix("")
