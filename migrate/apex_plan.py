"""One analysis per file of how it uses ``apex.amp``, shared by the AMP002-AMP005 rewrites.

``amp.initialize``, ``amp.scale_loss``, ``amp.master_params`` and ``amp.state_dict`` only make
sense together: a ``scaler.scale(loss)`` needs the ``scaler`` that replaces ``initialize``, and a
``scaler.step(opt)`` must replace the ``opt.step()`` that follows. So the file is planned as a
whole: either every such site gets a consistent fix (all with the same safety, so that a run
applies all of them or none), or every site is reported with the reason, and nothing is
half-rewritten. The rules read the plan through ``ApexPlanProvider`` (a libcst metadata
provider), which runs once per file however many rules ask for it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import BatchableMetadataProvider, PositionProvider, QualifiedNameProvider

from migrate.names import qualified_names
from migrate.native_casts import registered_natively
from migrate.rule import ImportChange, Replacement, Report
from migrate import apex_nodes as nodes
from migrate import grad_readers
from migrate.types import Safety

CORE = ("initialize", "scale_loss", "master_params", "state_dict", "load_state_dict")
# apex.amp names handled by their own rules, independently of initialize (no scaler involved).
CAST_API = frozenset(
    {
        "half_function",
        "float_function",
        "bfloat16_function",
        "promote_function",
        "register_half_function",
        "register_float_function",
        "register_bfloat16_function",
        "register_promote_function",
        "disable_casts",
        "lists",
    }
)
INITIALIZE, SCALE_LOSS, MASTER_PARAMS, STATE_DICT = "AMP002", "AMP003", "AMP004", "AMP005"
HELPER_NAME = "_scaler_state_from_apex"
MANUAL_STEP_MARKER = "TODO(ampmigrate):"  # a step the rewrite leaves to the user (reported by AMP017)
MASTER_COPIES = "under O2 `amp.master_params` are fp32 copies; natively they are the model's parameters"
def _operand(expression: cst.BaseExpression) -> str:
    """``expression``'s code, parenthesised unless it binds tighter than any operator."""
    text = nodes.code(expression)
    simple = isinstance(expression, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) or bool(getattr(expression, "lpar", ()))
    return text if simple else f"({text})"


def _conjunction(parts: list[str]) -> str | None:
    parts = list(dict.fromkeys(parts))  # `if level != "O0":` around initialize adds the same test twice
    return " and ".join(f"({p})" if len(parts) > 1 and " " in p else p for p in parts) or None


COMPUTED_LEVEL = (
    "the opt_level is computed at run time: O0 and O1 keep their meaning (scaler and autocast are off for O0), "
    "O2 and O3 become O1"
)
HELPER_SOURCE = '''

def _scaler_state_from_apex(state, scaler):
    """``scaler``'s state from ``state``, which may also be the loss-scaler state of an apex checkpoint."""
    if "loss_scaler0" not in state:
        return state
    apex_state = state["loss_scaler0"]
    # apex saved the scale and its unskipped count; growth and backoff stay the scaler's own.
    return {**scaler.state_dict(), "scale": float(apex_state["loss_scale"]), "_growth_tracker": int(apex_state["unskipped"])}
'''
_INITIALIZE_KEYWORDS = frozenset(
    {
        "models",
        "optimizers",
        "enabled",
        "opt_level",
        "cast_model_type",
        "patch_torch_functions",
        "keep_batchnorm_fp32",
        "master_weights",
        "loss_scale",
        "cast_model_outputs",
        "num_losses",
        "verbosity",
        "min_loss_scale",
        "max_loss_scale",
    }
)
_NO_NATIVE_OPTION = ("cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32", "master_weights", "cast_model_outputs")
_O2_O3_OPTIONS = ("cast_model_type", "keep_batchnorm_fp32", "master_weights")
_SCALE_LOSS_KEYWORDS = frozenset({"loss", "optimizers", "loss_id", "model", "delay_unscale", "delay_overflow_check"})
ACCEPT_O2 = "o2-as-autocast"  # the setting that accepts apex O2 rewritten as autocast with fp32 weights
_EACH = -1  # the step index of a loop stepping each optimizer of a list
_NEVER = "2**31 - 1"  # a growth interval no run reaches: the scale of a static apex loss scale stays
_SCALER_NAMES = ("scaler", "grad_scaler", "amp_scaler")
# Without amp.initialize in the file, calls of these stand for the forward pass.
_GUESSED_MODELS = frozenset({"model", "self.model", "net", "self.net", "network", "self.network", "module", "self.module"})
_AUTOCAST = 'torch.autocast("cuda", dtype=torch.float16{enabled})'
# Statement kinds that a search for the following optimizer.step() may look into.
_TRANSPARENT = (cst.If, cst.Else, cst.Try, cst.TryStar, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.With)


@dataclass
class ApexPlan:
    """The reports of the file's apex.amp sites, with their fixes, for each rule to pass on."""

    findings: list[Report] = field(default_factory=list)
    unsafe_reasons: tuple[str, ...] = ()  # why the fixes are unsafe, when they are
    active_codes: set[str] = field(default_factory=set)  # the planned rules taking part in this run
    handled: frozenset[int] = frozenset()  # calls on a receiver of the handed-on module that the plan rewrites

    def findings_for(self, code: str) -> list[Report]:
        return [finding for finding in self.findings if finding.code == code]


class ApexPlanProvider(BatchableMetadataProvider[ApexPlan]):
    """Attaches the file's ``ApexPlan`` to the ``Module`` node."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider)

    def visit_Module(self, node: cst.Module) -> bool:
        self.set_metadata(node, _Planner(self, node).plan())
        return False


def plan_of(visitor: cst.MetadataDependent, module: cst.Module) -> ApexPlan:
    return visitor.get_metadata(ApexPlanProvider, module)


class _Unplannable(Exception):
    """The file cannot be rewritten consistently; ``node`` and the message say where and why."""

    def __init__(self, node: cst.CSTNode, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


@dataclass
class _Initialize:
    call: cst.Call
    statement: cst.SimpleStatementLine
    level: str | None  # "O0".."O3", None when computed at run time
    level_expression: cst.BaseExpression | None  # the computed opt level
    guard_level: bool  # computed, not provably O0/O1: the rewrite stops O2/O3 runs at run time
    enabled: cst.BaseExpression | None
    scaler_args: list[str]
    restore: str | None  # "targets = values" keeping the assignment's meaning, if needed
    model_codes: set[str]
    on_self: bool
    inference: bool = False  # no optimizers: the models only ran forward under apex's casts


@dataclass
class _ScaleLoss:
    call: cst.Call
    statement: cst.With
    loss: cst.BaseExpression
    optimizers: list[cst.BaseExpression]
    scaled_name: str
    backward_args: list[cst.Arg] | None  # set when the body is only ``scaled.backward(...)``
    body: list[cst.BaseStatement]


class _Planner:
    def __init__(self, provider: cst.MetadataDependent, module: cst.Module) -> None:
        self.provider = provider
        self.module = module
        self.parent: dict[int, cst.CSTNode] = {}
        self.refs: list[tuple[cst.CSTNode, str]] = []
        self.names: set[str] = set()
        self.attributes: set[str] = set()
        self.sites: dict[str, list[cst.Call]] = {kind: [] for kind in CORE}
        self.blockers: list[tuple[cst.CSTNode, str]] = []
        self.unsafe: list[str] = []
        self.notes: list[str] = []  # what a safe fix reads differently from the letter of the code
        self.level_guarded = False
        self.replacements: dict[int, tuple[cst.CSTNode, Replacement]] = {}
        self.findings: list[Report] = []
        self.order: dict[int, int] = {}  # statement lines in source order
        self.after_imports: list[str] = []  # module-level definitions the rewrite adds
        self.scaler_in_block = False  # created in a block its users are not all in
        self.merged_losses = False  # `loss_id`: apex's per-loss scalers become one GradScaler
        self.escapes: list[tuple[cst.CSTNode, str]] = []  # the amp module handed on, and under what name
        self.alias_of: dict[int, str] = {}  # a site called on what received it -> that expression
        self.default_scaler = False  # a disabled module-level scaler stands in until initialize's code runs
        self.default_in_init = False  # a disabled `self.scaler` made in `__init__` stands in until then
        self.assigned: dict[str, list[cst.BaseExpression]] = {}  # name -> every value assigned to it
        self.choices: dict[str, list[str] | None] = {}  # argparse dest -> its choices, if restricted
        self.defaults: dict[str, str | None] = {}  # argparse dest -> its default, if a string
        # The opt levels the rewrite keeps: O0 and O1, and O2 where the project accepts it as autocast.
        self.exact_levels = {"O0", "O1"} | ({"O2"} if (provider.cache or {}).get(ACCEPT_O2) else set())
        self._kinds: dict[int, tuple[str, str, str]] = {}
        # Lines to put before a statement (`scaler.unscale_(opt)`, a default scaler), and the
        # gradient-reading statements an unscale covers.
        self.insert_before: dict[int, tuple[cst.BaseStatement, list[str]]] = {}
        self.unscale_covered: set[int] = set()
        self.master_params_in_clips: set[int] = set()  # rewritten as part of a scale-aware clip
        self.composed: set[int] = set()  # replaced statements that carry the replacements inside them
        self.torch_shadowed: list[tuple[cst.Name, cst.CSTNode]] = []  # `torch` bound in a function, and that function
        self.imports = nodes.apex_imports(module)
        module.visit(_Collect(self))

    # ---- the plan -------------------------------------------------------------------------

    def plan(self) -> ApexPlan:
        self._classify()
        core = [call for kind in CORE for call in self.sites[kind]]
        if not core:
            return ApexPlan()
        try:
            if self.blockers:
                node, reason = self.blockers[0]
                raise _Unplannable(node, reason)
            self._rewrite()
            self._check_disjoint()
        except _Unplannable as problem:
            return ApexPlan(self._report_only(problem))
        return ApexPlan(self.findings, tuple(dict.fromkeys(self.unsafe)), handled=frozenset(self.alias_of))

    def _classify(self) -> None:
        for node, name in self.refs:
            attr = name[len("apex.amp.") :] if name != "apex.amp" else ""
            parent = self.parent.get(id(node))
            if attr in CORE and isinstance(parent, cst.Call) and parent.func is node:
                self.sites[attr].append(parent)
            elif attr.split(".")[0] in CAST_API:
                self._cast_edit(attr, node, parent)
            elif attr == "__dict__" and self._in_test(node):
                continue  # `"state_dict" in amp.__dict__`: a probe, left as it is and reported as internals
            elif attr == "":
                if self._in_test(node):
                    continue
                alias = self._escape(node)
                if alias is None:
                    self.blockers.append((node, "`amp` is passed on or stored here, so its use elsewhere cannot be seen"))
                else:
                    self.escapes.append((node, alias))
            else:
                self.blockers.append((node, f"`amp.{attr}` (apex internals or the legacy handle) depends on apex's state"))
        if self.escapes:
            self._find_alias_sites({alias for _, alias in self.escapes})

    def _cast_edit(self, attr: str, node: cst.CSTNode, parent: cst.CSTNode | None) -> None:
        """``amp.register_*`` and ``amp.lists`` edits are rewritten on their own (AMP007); where
        native autocast would not make the cast they ask for, autocast computes differently."""
        if attr.startswith("register_") and isinstance(parent, cst.Call) and parent.func is node:
            module = nodes.argument(parent, 0, "module")
            name = nodes.literal_string(getattr(nodes.argument(parent, 1, "name"), "value", None))
            modules = qualified_names(self.provider, module.value) if module is not None else set()
            if registered_natively(f"apex.amp.{attr}", modules, name):
                return
        elif not attr.startswith("lists"):
            return  # cast decorators and `disable_casts` have exact native forms
        self.unsafe.append(
            f"the file changes apex's cast lists (`amp.{attr.split('.')[0]}`, line {self._line(node)}): native autocast "
            "does not read them, so the ops they name run in autocast's own precision"
        )

    def _escape(self, node: cst.CSTNode) -> str | None:
        """``model.amp = amp`` or ``f(amp=amp)``: the name the module is handed on under."""
        parent = self.parent.get(id(node))
        if isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1:
            target = parent.targets[0].target
            return target.attr.value if isinstance(target, cst.Attribute) else None
        if isinstance(parent, cst.Arg) and parent.value is node and parent.keyword is not None:
            return parent.keyword.value
        return None

    def _find_alias_sites(self, aliases: set[str]) -> None:
        """``amp.scale_loss`` / ``amp.master_params`` called on what received the handed-on module:
        a parameter or an attribute of that name (``def run(..., amp=None)``, ``self.amp``)."""
        known = {id(call) for kind in CORE for call in self.sites[kind]}
        planner = self

        class _Find(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> None:
                func = node.func
                if not (isinstance(func, cst.Attribute) and func.attr.value in ("scale_loss", "master_params")) or id(node) in known:
                    return
                holder = func.value
                name = holder.value if isinstance(holder, cst.Name) else holder.attr.value if isinstance(holder, cst.Attribute) else None
                if name in aliases:
                    planner.sites[func.attr.value].append(node)
                    planner.alias_of[id(node)] = nodes.code(holder)

        self.module.visit(_Find())

    def _in_test(self, node: cst.CSTNode) -> bool:
        """``if amp:``, ``amp is not None``, ``not amp``: an availability check, not a use."""
        parent = self.parent.get(id(node))
        if isinstance(parent, (cst.If, cst.While, cst.Assert)) and parent.test is node:
            return True
        if isinstance(parent, cst.IfExp) and parent.test is node:
            return True
        return isinstance(parent, (cst.Comparison, cst.ComparisonTarget, cst.UnaryOperation, cst.BooleanOperation))

    def _report_only(self, problem: _Unplannable) -> list[Report]:
        line = self._line(problem.node)
        where = f" (line {line})" if line else ""
        reason = f"not rewritten: {problem.reason}{where}; migrate this file by hand or keep it running on ampshim"
        messages = {
            "initialize": (INITIALIZE, "`amp.initialize`"),
            "scale_loss": (SCALE_LOSS, "`amp.scale_loss`"),
            "master_params": (MASTER_PARAMS, "`amp.master_params`"),
            "state_dict": (STATE_DICT, "`amp.state_dict`"),
            "load_state_dict": (STATE_DICT, "`amp.load_state_dict`"),
        }
        findings = []
        for kind in CORE:
            code, what = messages[kind]
            for call in self.sites[kind]:
                findings.append(Report(code, call, f"{what} is apex mixed precision; {reason}"))
        return findings

    def _line(self, node: cst.CSTNode) -> int | None:
        where = self.provider.get_metadata(PositionProvider, node, None)
        return where.start.line if where is not None else None

    # ---- the rewrite ----------------------------------------------------------------------

    def _rewrite(self) -> None:
        inits = [self._initialize(call) for call in self.sites["initialize"]]
        scales = [self._scale_loss(call) for call in self.sites["scale_loss"]]
        others = self.sites["master_params"] + self.sites["state_dict"] + self.sites["load_state_dict"]
        if not scales:
            if not inits:
                self._master_params_alone()
                return
            if others:
                raise _Unplannable(others[0], "`amp.scale_loss` is not in this file, so the scaler this needs lives elsewhere")
            self._hand_off(inits)
            return
        init = inits[0] if inits else None
        if init is None:
            self.unsafe.append(
                "nothing is initialized in this file: it gets its own GradScaler with apex's defaults "
                "(the opt level and options given to `amp.initialize` elsewhere are not seen)"
            )
        repeats = [extra for extra in inits[1:] if self._repeats(init, extra)]
        if len(inits) > 1 + len(repeats):
            self.unsafe.append(f"`amp.initialize` is called {len(inits)} times: one GradScaler serves them all")
        self.level = init.level if init is not None else "O1"
        self.o0 = self.level == "O0"
        self.level_guarded = init is not None and init.guard_level
        self.model_codes = set().union(*(i.model_codes for i in inits)) if inits else _GUESSED_MODELS
        scaler_sites: list[cst.CSTNode] = [s.statement for s in scales if id(s.call) not in self.alias_of]
        scaler_sites += [call for call in others if id(call) not in self.alias_of] + [node for node, _ in self.escapes]
        if self.escapes:
            self.unsafe.append(
                "`amp` is handed on (`x.amp = amp`, `f(amp=amp)`): the GradScaler takes its place, and "
                "`scale_loss`/`master_params` called on what receives it (found by name) become the scaler's"
            )
        self.scaler, self.scaler_scope = self._scaler_name(init, scaler_sites)
        hoist = self._hoist_guard(init, scaler_sites) if init is not None and not self.o0 else None  # O0: no scaler
        self._guard_test = nodes.code(hoist.test) if hoist is not None else None
        # A scaler assigned through `global` exists only once its function ran: a disabled one
        # stands in at module level until then, as apex did nothing before `initialize`.
        if self.scaler_scope == "global" and not self.o0 and self._import_anchor() is not None:
            self.default_scaler = True
        elif self.scaler_scope == "module" and not self.o0 and init is not None:
            # Created inside `if __name__ == "__main__":`: functions read it, maybe after an import.
            created_in = self.parent.get(id(hoist if hoist is not None else init.statement))
            if not isinstance(created_in, cst.Module):
                if self._import_anchor() is None:
                    raise _Unplannable(init.call, "the scaler would be created in a block at module level, with no import line to declare it after")
                self.default_scaler = True
        self.may_be_disabled = not self.scaler_in_block and (
            hoist is not None
            or self.default_scaler
            or self.default_in_init
            or (init is not None and (init.enabled is not None or init.level_expression is not None))
        )

        # Each optimizer step after a scaled backward goes through the scaler; the scale is
        # updated once per scaled backward, after the last of its optimizers' steps (in each
        # branch, when the steps sit in different branches).
        # With apex's per-loss scalers (`loss_id`) merged into one GradScaler, the scale is
        # updated once per iteration instead: after the last step of all the losses' optimizers.
        steps: dict[int, tuple[cst.SimpleStatementLine, dict[int, bool], str | None]] = {}
        step_scaler: dict[int, str] = {}
        found_by_scale = []
        for scale in scales:
            self._plan_scale_loss(scale)
            if self.o0:
                continue
            plain = self._plain_backward(beside=scale.statement)
            if plain is not None:
                self.unsafe.append(
                    f"the plain backward pass at line {self._line(plain)} adds gradients that apex kept as they were "
                    "and `scaler.step` would divide by the scale"
                )
            found = [hit for optimizer in scale.optimizers for hit in self._plan_steps(scale, optimizer)]
            found_by_scale.append(found)
            step_scaler.update((id(line), self._scaler_of(scale.call)) for line, _, _ in found)
        if self.merged_losses:
            found_by_scale = [[hit for found in found_by_scale for hit in found]]
        for found in found_by_scale:
            found.sort(key=lambda hit: (self.order[id(hit[0])], hit[1]))
            last_in_block = {id(self.parent[id(line)]): (id(line), index) for line, index, _ in found}
            for line, index, condition in found:
                entry = steps.setdefault(id(line), (line, {}, condition))
                last = last_in_block[id(self.parent[id(line)])] == (id(line), index)
                entry[1][index] = entry[1].get(index, False) or last
        for line, updates, condition in steps.values():
            if _EACH in updates:
                self._replace(line, self._each_step_replacement(line, updates[_EACH], condition, step_scaler[id(line)]))
                self._kind(line, SCALE_LOSS, "`optimizer.step()` after `amp.scale_loss` must go through the scaler",
                           f"Use `{self.scaler}.step(optimizer)` for each optimizer, then `{self.scaler}.update()` once")
                continue
            self._replace(line, self._step_replacement(line, updates, condition, step_scaler[id(line)]))
            self._kind(line, SCALE_LOSS, "`optimizer.step()` after `amp.scale_loss` must go through the scaler", f"Use `{self.scaler}.step(optimizer)` and `{self.scaler}.update()`")
        self._plan_master_params()
        self._plan_state_dicts()
        self._plan_escapes()
        if init is not None:
            self._plan_initialize(init, hoist)
        else:
            self.after_imports.append(f'{self.scaler} = torch.amp.GradScaler("cuda")\n')
        for extra in inits[1:]:
            if extra in repeats and not self.o0:
                self._plan_initialize(extra, None, reinitialize=True)
            else:
                self._plan_initialize_removal(extra)
        if not self.o0:
            for scale in scales:
                self._plan_autocast(scale)
        self._plan_after_imports()
        self._emit(scales)

    def _hand_off(self, inits: list[_Initialize]) -> None:
        """``amp.initialize`` with the scaled backward in another file: the call goes, nothing else.

        Under O1 the returned models and optimizers are the ones passed in; the file that scales
        the loss gets its own GradScaler when it is migrated.
        """
        self.level = inits[0].level
        self.o0 = True
        if all(init.level != "O0" for init in inits):
            self.unsafe.append(
                "`amp.scale_loss` is not in this file: the file that scales the loss gets the GradScaler and "
                "autocast when it is migrated (migrate both, or neither)"
            )
        for init in inits:
            model = nodes.argument(init.call, 0, "models").value
            if init.inference and init.level == "O3" and init.restore and isinstance(model, (cst.Name, cst.Attribute)):
                self._plan_half(init, model)
                continue
            self._plan_initialize_removal(init)
            if init.inference and init.level != "O0":
                models = " ".join(nodes.code(model).split())
                if init.level in ("O2", "O3"):
                    step = f"apex {init.level} ran `{models}` in float16, weights and inputs: call `.half()` on both, or run it under {_AUTOCAST.format(enabled='')}"
                else:
                    step = f"run `{models}` under {_AUTOCAST.format(enabled='')} where it computes: apex cast it from here on"
                self._leave_marker(init.statement, step)
        self._emit([])

    def _plan_half(self, init: _Initialize, model: cst.BaseExpression) -> None:
        """O3 for inference: apex ran the model in float16, so ``model.half()`` keeps the ``.half()``
        inputs it is given working (fp32 weights would refuse them)."""
        self.unsafe.append("apex O3 also cast the model's inputs to float16 and its outputs to float32; `.half()` does neither")
        target, values = init.restore.split(" = ", 1)
        code = nodes.code(model)
        restore = f"{target} = {values.replace(code, f'{code}.half()', 1)}"
        new = nodes.parse_statements(restore + "\n", self.module)[0]
        self._replace(init.statement, nodes.with_leading(new, init.statement))
        self._kind(init.statement, INITIALIZE, "`amp.initialize` is apex mixed precision", "Call `.half()` on the model: O3 is pure float16")

    def _master_params_alone(self) -> None:
        """``amp.master_params`` in a file with no other amp: its parameters, when no gradient is read."""
        blocked = self.sites["state_dict"] + self.sites["load_state_dict"]
        if blocked:
            raise _Unplannable(blocked[0], "neither `amp.initialize` nor `amp.scale_loss` is in this file, so the scaler lives elsewhere")
        for call in self.sites["master_params"]:
            if self._feeds_grad_consumer(call, self._statement(call)):
                raise _Unplannable(call, "its gradients are read here, but the scaler that must unscale them first lives in another file")
        self.level, self.o0, self.scaler = None, True, None
        self._plan_master_params()
        self._emit([])

    def _scaler_of(self, call: cst.Call) -> str:
        """The scaler a site uses: the plan's, or what received the handed-on module."""
        return self.alias_of.get(id(call), self.scaler)

    def _plan_escapes(self) -> None:
        for node, _ in self.escapes:
            self._replace(node, cst.Name(self.scaler))
            self._kind(node, INITIALIZE, "the apex.amp module is handed on here", f"Hand on `{self.scaler}`, the GradScaler, instead")

    def _plan_initialize_removal(self, init: _Initialize) -> None:
        if init.restore:
            new = nodes.parse_statements(init.restore + "\n", self.module)[0]
            self._replace(init.statement, nodes.with_leading(new, init.statement))
        else:
            self._replace(init.statement, cst.RemoveFromParent())
        self._kind(init.statement, INITIALIZE, "`amp.initialize` is apex mixed precision", "Remove it: the scaler is created once, elsewhere")

    def _import_anchor(self) -> cst.SimpleStatementLine | None:
        """The last top-level import line: module-level definitions of the rewrite go after it."""
        anchor = None
        for statement in self.module.body:
            if isinstance(statement, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body):
                anchor = statement
        return anchor

    def _until(self, init: _Initialize) -> str:
        function = self._function(init.statement)
        return f"until `{function.name.value}()` runs" if function is not None else "until the block below that creates it runs"

    def _plan_after_imports(self) -> None:
        """Definitions the rewrite needs at module level go after the last top-level import."""
        if not self.after_imports:
            return
        anchor = self._import_anchor()
        if anchor is None or self._touched(anchor):
            first = next(call for kind in CORE for call in self.sites[kind])
            raise _Unplannable(first, "no top-level import to put the module-level definitions after")
        following = self.module.body[self.module.body.index(anchor) + 1 :]
        blank_after = sum(1 for line in following[0].leading_lines if line.comment is None) if following else 2
        added = []
        for source in sorted(self.after_imports, key=lambda text: text == HELPER_SOURCE):  # assignments first
            statements = nodes.parse_statements(source, self.module)
            blank = 2 if isinstance(statements[0], cst.FunctionDef) else 1 if not added else 0
            added += [statements[0].with_changes(leading_lines=[cst.EmptyLine()] * blank), *statements[1:]]
        if isinstance(added[-1], cst.FunctionDef) and blank_after < 2:  # two blank lines after a def
            footer = [*added[-1].body.footer, *[cst.EmptyLine(indent=False)] * (2 - blank_after)]
            added[-1] = added[-1].with_changes(body=added[-1].body.with_changes(footer=footer))
        self._replace(anchor, cst.FlattenSentinel([anchor, *added]))
        self._kind(anchor, STATE_DICT if self.sites["load_state_dict"] else SCALE_LOSS, "module-level definitions for the rewrite of apex.amp", "Add them after the imports")

    def _emit(self, scales: list[_ScaleLoss]) -> None:
        self._place_insertions()
        if not self.o0:
            for name, scope in self.torch_shadowed:
                if any(self._inside(node, scope) for node, _ in self.replacements.values()):
                    raise _Unplannable(name, "`torch` names something else in this function, where the rewrite needs the torch module")
        safety = Safety.UNSAFE if self.unsafe else Safety.SAFE
        why = f" (unsafe: {'; '.join(dict.fromkeys(self.unsafe))})" if self.unsafe else ""
        why += "".join(f" (note: {note})" for note in dict.fromkeys(self.notes))
        removes = tuple(dict.fromkeys(change for node, _ in self.refs for change in self.imports.get(nodes.root_name(node) or "", ())))
        adds = () if self.o0 else (ImportChange("torch"),)
        for scale in scales:
            fix = f"Use `{self.scaler}.scale(loss).backward()`" if not self.o0 else "Use `loss.backward()` (O0: no scaling)"
            self._kind(scale.statement, SCALE_LOSS, "`amp.scale_loss` is apex mixed precision", fix)
        for node, replacement in self.replacements.values():
            code, message, fix = self._kinds[id(node)]
            self.findings.append(Report(code, node, message, replacement, safety, fix + why, adds, removes))

    def _initialize_fix(self) -> str:
        if self.o0:
            return "Remove it: O0 is plain fp32"
        return f'Create `{self.scaler} = torch.amp.GradScaler("cuda")`'

    def _kind(self, node: cst.CSTNode, code: str, message: str, fix: str) -> None:
        self._kinds[id(node)] = (code, message, fix)

    def _replace(self, node: cst.CSTNode, replacement: Replacement) -> None:
        self.replacements[id(node)] = (node, replacement)

    def _check_disjoint(self) -> None:
        for node, _ in self.replacements.values():
            ancestor = self.parent.get(id(node))
            while ancestor is not None:
                if id(ancestor) in self.replacements and id(ancestor) not in self.composed:
                    raise _Unplannable(node, "two rewrites would overlap here")
                ancestor = self.parent.get(id(ancestor))

    # ---- initialize -----------------------------------------------------------------------

    def _initialize(self, call: cst.Call) -> _Initialize:
        statement = self._statement(call)
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
        if isinstance(small, cst.Assign) and (len(small.targets) != 1 or small.value is not call):
            small = None
        if isinstance(small, (cst.Expr, cst.Return)) and small.value is not call:
            small = None
        if not isinstance(small, (cst.Assign, cst.Expr, cst.Return)):
            raise _Unplannable(call, "`amp.initialize` is part of a larger statement")
        if any(arg.star == "*" for arg in call.args):
            raise _Unplannable(call, "`amp.initialize` takes `*args`, so its models and options cannot be seen")
        splat = any(arg.star == "**" for arg in call.args)
        if splat:
            self.unsafe.append("options passed through `**kwargs` are not seen: the rewrite is O1 with GradScaler's defaults")
        unknown = nodes.keyword_names(call) - _INITIALIZE_KEYWORDS
        if unknown or len([a for a in call.args if a.keyword is None]) > 4:
            raise _Unplannable(call, f"`amp.initialize` has arguments apex does not take: {sorted(unknown)!r}")
        models = nodes.argument(call, 0, "models")
        optimizers = nodes.argument(call, 1, "optimizers")
        if models is None:
            raise _Unplannable(call, "`amp.initialize` is called without models")
        has_optimizers = optimizers is not None and not (
            (isinstance(optimizers.value, cst.Name) and optimizers.value.value == "None")
            or (isinstance(optimizers.value, (cst.List, cst.Tuple)) and not optimizers.value.elements)
        )
        level_arg = nodes.argument(call, 3, "opt_level")
        level: str | None = None if splat and level_arg is None else "O1"
        guard_level = False
        if level_arg is not None:
            level = nodes.literal_string(level_arg.value)
            possible = self._possible_levels(level_arg.value)
            if level is None and possible is not None and possible <= self.exact_levels:
                pass  # only O0 or O1 can reach this call: both keep their meaning
            elif level is None and self._default_level(level_arg.value) in {"O2", "O3"} - self.exact_levels:
                # A run-time check would stop the run people make most; O2/O3 are not exact natively.
                self.unsafe.append(f"the opt level defaults to {self._default_level(level_arg.value)}, and " + COMPUTED_LEVEL)
            elif level is None and possible is None and nodes.is_pure(level_arg.value):
                # Unknown until run time: O0/O1 keep their meaning, O2/O3 stop with an error (the
                # rewrite adds that check), so no run silently trains differently.
                guard_level = True
                if "O2" in self.exact_levels:
                    self.notes.append(f"O2 as autocast, by the `{ACCEPT_O2}` setting: fp32 weights, no master copies")
            elif level is None:
                self.unsafe.append(COMPUTED_LEVEL)
            elif level in ("01", "o1"):
                # apex refuses it, so no run that worked changes: the rewrite reads the evident O1.
                self.notes.append(f"opt_level {level!r} is not valid (apex refused it); it is read as 'O1'")
                level = "O1"
            elif level not in ("O0", "O1", "O2", "O3"):
                raise _Unplannable(call, f"opt_level {level!r} is not one of 'O0'-'O3' (apex rejects it)")
            elif level in self.exact_levels - {"O0", "O1"}:
                self.notes.append(f"{level} as autocast, by the `{ACCEPT_O2}` setting: fp32 weights, no master copies")
                level = "O1"
            elif level in ("O2", "O3"):
                self.unsafe.append(f"{level} keeps fp16 weights (O2: with fp32 master copies); native autocast keeps fp32 weights, like O1")
        if not has_optimizers and level != "O0":
            self.unsafe.append("`amp.initialize` without optimizers (inference ran under apex's casts): put it under `torch.autocast` by hand")
        enabled_arg = nodes.argument(call, 2, "enabled")
        enabled = enabled_arg.value if enabled_arg is not None else None
        if isinstance(enabled, cst.Name) and enabled.value == "True":
            enabled = None
        scaler_args = self._scaler_options(call, level in ("O0", "O1") or guard_level)
        restore = None
        values = nodes.code(models.value) + (f", {nodes.code(optimizers.value)}" if has_optimizers or optimizers is not None else "")
        if isinstance(small, cst.Assign):
            target = nodes.code(small.targets[0].target)
            if _normal(target) != _normal(values):
                restore = f"{target} = {values}"
        elif isinstance(small, cst.Return):
            restore = f"return {values}"  # under O1 initialize hands back what it was given
        model_codes = self._codes(models.value)
        if isinstance(small, cst.Assign):
            target = small.targets[0].target
            if optimizers is not None and isinstance(target, (cst.Tuple, cst.List)) and target.elements:
                target = target.elements[0].value
            model_codes |= self._codes(target)
        on_self = any(code.startswith("self.") for code in model_codes)
        level_expression = level_arg.value if level is None and level_arg is not None else None
        return _Initialize(call, statement, level, level_expression, guard_level, enabled, scaler_args, restore,
                           model_codes, on_self, inference=not has_optimizers)

    def _possible_levels(self, expression: cst.BaseExpression, depth: int = 0) -> set[str] | None:
        """Every opt level ``expression`` can be, when the file shows them all; else None.

        ``"O1" if fp16 else "O0"``, a name only ever assigned such values, or an argparse option
        with ``choices``.
        """
        text = nodes.literal_string(expression)
        if text is not None:
            return {text}
        if depth > 3:
            return None
        if isinstance(expression, cst.IfExp):
            body, orelse = self._possible_levels(expression.body, depth + 1), self._possible_levels(expression.orelse, depth + 1)
            return body | orelse if body is not None and orelse is not None else None
        if isinstance(expression, cst.Name) and expression.value in self.assigned:
            found: set[str] = set()
            for value in self.assigned[expression.value]:
                levels = self._possible_levels(value, depth + 1)
                if levels is None:
                    return None
                found |= levels
            return found
        if isinstance(expression, cst.Attribute) and self.choices.get(expression.attr.value):
            return set(self.choices[expression.attr.value])
        return None

    def _default_level(self, expression: cst.BaseExpression) -> str | None:
        """The argparse default of ``args.opt_level``, when the file gives one."""
        return self.defaults.get(expression.attr.value) if isinstance(expression, cst.Attribute) else None

    @staticmethod
    def _codes(expression: cst.BaseExpression) -> set[str]:
        """The source of each model in a ``models`` argument or target: one, or a list of them."""
        if isinstance(expression, (cst.List, cst.Tuple)):
            return {nodes.code(element.value) for element in expression.elements}
        return {nodes.code(expression)}

    def _scaler_options(self, call: cst.Call, o0_or_o1: bool) -> list[str]:
        """GradScaler's arguments for apex's options; an option with no native form makes it unsafe.

        Dropping one is safe where it changes nothing: ``max_loss_scale`` (GradScaler has no cap,
        as for apex's default cap of 2**24 that every rewrite drops), and, for O0/O1, the options
        apex only applies under O2/O3 (under O1 it refuses them outright). A ``loss_scale`` known
        only at run time (``args.loss_scale``, a config value) picks the scaler's start and growth
        at run time: dynamic as GradScaler's defaults, a static value as a scale that never grows.
        """
        options = []
        harmless = {"max_loss_scale", *(_O2_O3_OPTIONS if o0_or_o1 else ())}
        loss_scale = nodes.argument(call, None, "loss_scale")
        if loss_scale is not None and nodes.literal_string(loss_scale.value) != "dynamic":
            number = nodes.number_text(loss_scale.value)
            if number is not None:
                # A static scale: GradScaler starts there and never grows. It still skips a step whose
                # gradients overflowed and halves, where apex would have stepped with inf/NaN.
                options += [f"init_scale={number}", f"growth_interval={_NEVER}"]
                harmless.add("min_loss_scale")  # apex bounds only a dynamic scale
            elif o0_or_o1 and nodes.is_pure(loss_scale.value):
                init, growth = _run_time_scale(loss_scale.value)
                options += [f"init_scale={init}", f"growth_interval={growth}"]
            else:
                self.unsafe.append(f"loss_scale={nodes.code(loss_scale.value)} may be static; GradScaler is always dynamic (init 2**16)")
        for name in ("min_loss_scale", "max_loss_scale", "num_losses", *_NO_NATIVE_OPTION):
            arg = nodes.argument(call, None, name)
            if arg is None or (isinstance(arg.value, cst.Name) and arg.value.value == "None"):
                continue
            if (name == "num_losses" and nodes.code(arg.value) == "1") or name in harmless:
                continue
            if name == "num_losses":
                self.merged_losses = True
                self.unsafe.append("one GradScaler serves every loss (apex keeps one scaler per loss), updated once per iteration")
            else:
                self.unsafe.append(f"`{name}` has no native equivalent and is dropped")
        return options

    def _repeats(self, first: _Initialize, again: _Initialize) -> bool:
        """``again`` initializes as ``first`` did (re-initialising before loading a checkpoint), in
        its function, outside any block that could make the scaler's flag differ: apex started
        a fresh loss scaler there, as a fresh GradScaler does."""
        same = _normal(nodes.code(first.call)) == _normal(nodes.code(again.call)) and first.restore == again.restore
        block = self.parent.get(id(first.statement))
        at_top = isinstance(block, cst.Module) or isinstance(self.parent.get(id(block)), cst.FunctionDef)
        return same and at_top and self._function(first.statement) is self._function(again.statement)

    def _plan_initialize(self, init: _Initialize, hoist: cst.If | None, reinitialize: bool = False) -> None:
        lines: list[str] = []
        if self.default_scaler and not reinitialize:
            self.after_imports.append(f'{self.scaler} = torch.amp.GradScaler("cuda", enabled=False)  # {self._until(init)}\n')
        if not self.o0:
            if self.scaler_scope == "global" and not reinitialize:
                lines.append(f"global {self.scaler}")
            lines += [] if reinitialize else self._run_time_checks(init, hoist)
            enabled = self._enabled_expression(init, hoist)
            options = ['"cuda"', *init.scaler_args, *([f"enabled={enabled}"] if enabled else [])]
            line = f"{self.scaler} = torch.amp.GradScaler({', '.join(options)})"
            if len(line) > 100:  # one option a line, as a formatter would put them
                line = f"{self.scaler} = torch.amp.GradScaler(\n" + "".join(f"    {option},\n" for option in options) + ")"
            lines.append(line)
        if hoist is None:
            if init.restore:
                lines.append(init.restore)
            new = nodes.parse_statements("\n".join(lines) + "\n", self.module) if lines else []
            if not new:
                self._replace(init.statement, cst.RemoveFromParent())
                self._kind(init.statement, INITIALIZE, "`amp.initialize` is apex mixed precision", self._initialize_fix())
                return
            new[0] = nodes.with_leading(new[0], init.statement)
            self._replace(init.statement, cst.FlattenSentinel(new) if len(new) > 1 else new[0])
            self._kind(init.statement, INITIALIZE, "`amp.initialize` is apex mixed precision", self._initialize_fix())
            return
        new = nodes.parse_statements("\n".join(lines) + "\n", self.module)
        fix = self._initialize_fix() + ", enabled by the same flag, before the `if`"
        if len(hoist.body.body) == 1 and hoist.orelse is None and init.restore is None:
            # The `if` held nothing else: it goes, and its test is evaluated once, as before.
            self._replace(hoist, cst.FlattenSentinel([nodes.with_leading(new[0], hoist), *new[1:]]))
            self._kind(hoist, INITIALIZE, "`amp.initialize` is apex mixed precision", fix)
            return
        block = self.parent[id(hoist)]
        body = list(block.body)
        previous = body[body.index(hoist) - 1] if body.index(hoist) > 0 else None
        if not self._touched(hoist):
            # Nothing else in the `if` is rewritten: the `if` is rebuilt behind the scaler.
            restored = nodes.parse_statements(init.restore + "\n", self.module)[0] if init.restore else None
            inner = [restored if s is init.statement else s for s in hoist.body.body if s is not init.statement or restored]
            kept = hoist.with_changes(leading_lines=(), body=hoist.body.with_changes(body=inner or [cst.SimpleStatementLine([cst.Pass()])]))
            self._replace(hoist, cst.FlattenSentinel([nodes.with_leading(new[0], hoist), *new[1:], kept]))
            self._kind(hoist, INITIALIZE, "`amp.initialize` is apex mixed precision", fix)
        elif previous is not None and not self._touched(previous):
            self._plan_initialize_removal(init)
            self._replace(previous, cst.FlattenSentinel([previous, *new]))
            self._kind(previous, INITIALIZE, "`amp.initialize` is apex mixed precision", fix)
        else:
            raise _Unplannable(init.call, "no place before the `if` around `amp.initialize` to create the scaler")

    def _enabled_expression(self, init: _Initialize, hoist: cst.If | None) -> str | None:
        parts = self._flags(init, hoist)
        if init.level_expression is not None:
            parts.append(f'{_operand(init.level_expression)} != "O0"')
        return _conjunction(parts)

    def _run_time_checks(self, init: _Initialize, hoist: cst.If | None) -> list[str]:
        """Lines stopping a run that the rewrite would not reproduce: a computed O2/O3 opt level.
        O0/O1 are exact, whatever their loss scale, so nothing else stops."""
        if not init.guard_level:
            return []
        level = _operand(init.level_expression)
        exact = sorted(self.exact_levels)
        names = " and ".join([", ".join(exact[:-1]), exact[-1]])
        missing = "/".join(sorted({"O2", "O3"} - self.exact_levels))
        before, after = "opt_level ", f": migrated from apex for {names}; native torch.amp has no {missing}"
        if any(char in level for char in '"\\\n'):  # `cfg["opt_level"]` cannot sit in an f-string before 3.12
            message = f'"{before}%r{after}" % ({level},)'
        else:
            message = f'f"{before}{{{level}!r}}{after}"'
        levels = ", ".join(f'"{name}"' for name in exact)
        condition = _conjunction([*self._flags(init, hoist), f"{level} not in ({levels})"])
        return [f"if {condition}:", f"    raise RuntimeError({message})"]

    @staticmethod
    def _flags(init: _Initialize, hoist: cst.If | None) -> list[str]:
        """The run-time conditions under which apex was initialized at all."""
        parts = []
        if hoist is not None:
            parts.append(_as_bool(hoist.test))
        if init.enabled is not None:
            parts.append(_as_bool(init.enabled))
        return parts

    def _hoist_guard(self, init: _Initialize, sites: list[cst.CSTNode]) -> cst.If | None:
        """The ``if flag:`` whose body holds initialize, when the scaler must exist outside it.

        Moved before the ``if`` as ``GradScaler(enabled=flag)``, the scaler exists on every path
        and does nothing where apex was not initialized.
        """
        block = self.parent.get(id(init.statement))
        owner = self.parent.get(id(block))
        if isinstance(owner, (cst.FunctionDef, cst.Module)) or isinstance(block, cst.Module):
            return None
        if isinstance(owner, cst.ClassDef):
            raise _Unplannable(init.call, "`amp.initialize` runs in a class body, where its methods cannot see a scaler")
        is_elif = isinstance(self.parent.get(id(owner)), cst.If) and self.parent[id(owner)].orelse is owner
        if all(self._inside(site, block) for site in sites):
            return None  # the scaler is only used where it exists
        # In a loop, `if epoch == 0:` is a trigger that runs once, not a flag for the whole run.
        if isinstance(owner, cst.If) and owner.body is block and not is_elif and not self._changes_its_test(owner) and not self._in_loop(owner):
            alone = len(block.body) == 1 and init.restore is None and owner.orelse is None
            if nodes.is_pure(owner.test) or alone:
                return owner
        # A run-once guard (`if not self.initialized:`), an elif, a loop or a try: the scaler is
        # created where apex was initialized. apex needed that to have run before any scale_loss,
        # but the forward pass may run on paths where it did not, so autocast cannot ask the
        # scaler whether it is on.
        if self.scaler_scope in ("global", "module") and self._import_anchor() is not None:
            self.default_scaler = True  # disabled at module level until the block has run
            return None
        if self.default_in_init:
            return None  # `__init__` makes a disabled scaler that stands in until this block runs
        if not self.scaler.startswith("self."):
            # A local created in the block may not exist where autocast asks it.
            raise _Unplannable(init.call, "`amp.initialize` runs inside a block (a run-once guard, an elif, a loop "
                               "or a try) that the code using the scaler is not in")
        self.unsafe.append(
            "the scaler is created where `amp.initialize` ran, inside a block; its users assume that ran first "
            "(as apex did); autocast is on only where it did"
        )
        self.scaler_in_block = True
        return None

    def _plan_default_in_init(self, owner: cst.ClassDef, function: cst.FunctionDef, attribute: str) -> None:
        """A disabled ``self.<attribute>`` made in ``__init__``, standing in until ``function`` runs."""
        anchor = self._init_anchor(owner)
        if anchor is None:
            self.unsafe.append(
                f"the scaler is created in `{function.name.value}()`: methods that use it fail where that has not run "
                "(apex trained in fp32 there)"
            )
            return
        line = f'self.{attribute} = torch.amp.GradScaler("cuda", enabled=False)  # until `{function.name.value}()` runs'
        self.insert_before.setdefault(id(anchor), (anchor, []))[1].append(line)
        self._kind(anchor, INITIALIZE, "the scaler that replaces `amp.initialize` must exist from construction on",
                   "Create it disabled in `__init__`")
        self.default_in_init = True

    @staticmethod
    def _init_anchor(owner: cst.ClassDef) -> cst.BaseStatement | None:
        """The statement of ``__init__`` to put a default before: after the docstring and ``super().__init__``."""
        init = next((s for s in owner.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        if init is None or not isinstance(init.body, cst.IndentedBlock):
            return None
        for index, statement in enumerate(init.body.body):
            small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
            docstring = index == 0 and isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString))
            parent_init = isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and "__init__" in nodes.code(small.value.func)
            if not (docstring or parent_init):
                return statement
        return None

    @staticmethod
    def _runs_at_construction(function: cst.FunctionDef, owner: cst.ClassDef) -> bool:
        """``__init__`` itself, or a method ``__init__`` calls (``self._setup_amp()``)."""
        if function.name.value == "__init__":
            return True
        init = next((s for s in owner.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        called = False

        class _Find(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> None:
                nonlocal called
                func = node.func
                called = called or (isinstance(func, cst.Attribute) and func.attr.value == function.name.value
                                    and isinstance(func.value, cst.Name) and func.value.value == "self")

        if init is not None:
            init.visit(_Find())
        return called

    def _in_loop(self, node: cst.CSTNode) -> bool:
        node = self.parent.get(id(node))
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            if isinstance(node, (cst.For, cst.While)):
                return True
            node = self.parent.get(id(node))
        return False

    @staticmethod
    def _changes_its_test(branch: cst.If) -> bool:
        """``if not self.initialized: ...; self.initialized = True``: a run-once guard."""
        tested: set[str] = set()
        assigned: set[str] = set()

        class _Tested(cst.CSTVisitor):
            def visit_Name(self, node: cst.Name) -> None:
                tested.add(node.value)

            def visit_Attribute(self, node: cst.Attribute) -> None:
                tested.add(nodes.code(node))

        class _Assigned(cst.CSTVisitor):
            def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
                assigned.add(nodes.code(node.target))

            def visit_AugAssign(self, node: cst.AugAssign) -> None:
                assigned.add(nodes.code(node.target))

        branch.test.visit(_Tested())
        branch.body.visit(_Assigned())
        return bool(tested & assigned)

    def _scaler_name(self, init: _Initialize | None, sites: list[cst.CSTNode]) -> tuple[str | None, str]:
        name = next((name for name in (*_SCALER_NAMES, "amp_grad_scaler") if name not in self.names), "amp_grad_scaler_")
        if init is None:
            return name, "module"
        if init.level == "O0":
            return None, "none"
        function = self._function(init.statement)
        if init.on_self and function is not None and self._first_param(function) == "self":
            owner = self._class(function)
            if owner is not None and all(self._class(self._function(site)) is owner and self._first_param(self._function(site)) == "self" for site in sites):
                attribute = next(name for name in (*_SCALER_NAMES, "amp_grad_scaler") if name not in self.attributes)
                if not self._runs_at_construction(function, owner):
                    self._plan_default_in_init(owner, function, attribute)
                return f"self.{attribute}", "self"
        if all(self._function(site) is function for site in sites):
            return name, "local"
        if function is None:
            return name, "module"
        return name, "global"

    # ---- scale_loss and the optimizer step ---------------------------------------------------

    def _scale_loss(self, call: cst.Call) -> _ScaleLoss:
        item = self.parent.get(id(call))
        statement = self.parent.get(id(item))
        if not (isinstance(item, cst.WithItem) and isinstance(statement, cst.With) and item.item is call):
            raise _Unplannable(call, "`amp.scale_loss` is not used as a `with` statement (it is entered by hand or returned)")
        if len(statement.items) != 1 or statement.asynchronous is not None:
            raise _Unplannable(call, "`amp.scale_loss` shares its `with` statement with other context managers")
        if item.asname is None or not isinstance(item.asname.name, cst.Name):
            raise _Unplannable(call, "`amp.scale_loss` does not bind the scaled loss to a name")
        if nodes.has_star(call):
            raise _Unplannable(call, "`amp.scale_loss` takes `*args`/`**kwargs`")
        unknown = nodes.keyword_names(call) - _SCALE_LOSS_KEYWORDS
        if unknown:
            raise _Unplannable(call, f"`amp.scale_loss` has arguments apex does not take: {sorted(unknown)!r}")
        loss = nodes.argument(call, 0, "loss")
        optimizers = nodes.argument(call, 1, "optimizers")
        if loss is None or optimizers is None:
            raise _Unplannable(call, "`amp.scale_loss` is called without a loss and an optimizer")
        for name, why in (
            ("loss_id", "one GradScaler serves every loss (apex keeps one scaler per loss), updated once per iteration"),
            ("delay_overflow_check", "`delay_overflow_check` has no native equivalent"),
        ):
            arg = nodes.argument(call, None, name)
            if arg is not None and nodes.code(arg.value) not in ("False", "0"):
                self.unsafe.append(why)
                self.merged_losses = self.merged_losses or name == "loss_id"
        value = optimizers.value
        listed = [e.value for e in value.elements] if isinstance(value, (cst.List, cst.Tuple)) else [value]
        scaled = item.asname.name.value
        body = statement.body
        statements: list[cst.BaseStatement]
        if isinstance(body, cst.SimpleStatementSuite):
            smalls = list(body.body)
            statements = [cst.SimpleStatementLine([s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for s in smalls])]
        else:
            smalls = list(body.body[0].body) if len(body.body) == 1 and isinstance(body.body[0], cst.SimpleStatementLine) else []
            statements = list(body.body)
            if any(line.comment for line in body.footer):
                smalls = []
        backward_args = None
        if len(smalls) == 1 and isinstance(smalls[0], cst.Expr):
            call_node = smalls[0].value
            if (
                isinstance(call_node, cst.Call)
                and isinstance(call_node.func, cst.Attribute)
                and call_node.func.attr.value == "backward"
                and nodes.code(call_node.func.value) == scaled
                and scaled != nodes.code(loss.value)
                and not self._read_elsewhere(scaled, statement)
            ):
                backward_args = list(call_node.args)
        return _ScaleLoss(call, statement, loss.value, listed, scaled, backward_args, statements)

    def _read_elsewhere(self, name: str, statement: cst.With) -> bool:
        """Whether ``name`` (the scaled loss) is used outside every ``with amp.scale_loss`` of its function."""
        scope = self._function(statement) or self.module
        withs = [self._statement(call) for call in self.sites["scale_loss"]]
        found = False
        planner = self

        class _Find(cst.CSTVisitor):
            def visit_Name(self, node: cst.Name) -> None:
                nonlocal found
                if node.value == name and not any(planner._inside(node, other) for other in withs):
                    found = True

        scope.visit(_Find())
        return found

    def _plan_scale_loss(self, scale: _ScaleLoss) -> None:
        loss = nodes.code(scale.loss)
        if isinstance(scale.loss, (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp, cst.Lambda)):
            loss = f"({loss})"
        scaled = loss if self.o0 else f"{self._scaler_of(scale.call)}.scale({nodes.code(scale.loss)})"
        if scale.backward_args is not None:
            args = ", ".join(nodes.code(arg) for arg in scale.backward_args)
            new = nodes.parse_statements(f"{scaled}.backward({args})\n", self.module)[0]
            self._replace(scale.statement, self._keep_comments(new, scale.statement))
            return
        first = nodes.parse_statements(f"{scale.scaled_name} = {scaled}\n", self.module)[0]
        self._replace(scale.statement, cst.FlattenSentinel([nodes.with_leading(first, scale.statement), *scale.body]))

    @staticmethod
    def _keep_comments(new: cst.SimpleStatementLine, statement: cst.With) -> cst.SimpleStatementLine:
        """The one-line replacement of a ``with`` keeps the comments that were on and in it."""
        leading = list(statement.leading_lines)
        trailing = new.trailing_whitespace
        body = statement.body
        if isinstance(body, cst.IndentedBlock):
            inner = body.body[0]
            leading += [line for line in inner.leading_lines if line.comment]
            trailing = body.header if body.header.comment else inner.trailing_whitespace
        elif body.trailing_whitespace.comment:
            trailing = body.trailing_whitespace
        return new.with_changes(leading_lines=leading, trailing_whitespace=trailing)

    def _plan_steps(self, scale: _ScaleLoss, optimizer: cst.BaseExpression) -> list[tuple[cst.SimpleStatementLine, int, str | None]]:
        """Where ``optimizer.step()`` follows the scaled backward, and the test it must keep, if any."""
        wanted = nodes.code(optimizer)
        current: cst.CSTNode = scale.statement
        conditions: list[str | None] = []  # the tests of the branches climbed out of
        passed: list[tuple[list[cst.BaseStatement], list[str | None]]] = []  # run between the backward and the step
        while True:
            block = self.parent.get(id(current))
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                break
            body = list(block.body)
            found: list[tuple[cst.SimpleStatementLine, int]] = []
            between: list[cst.BaseStatement] = []
            for sibling in body[body.index(current) + 1 :]:
                found = self._steps_in(sibling, wanted)
                if found:
                    break
                between.append(sibling)
            passed.append((between, list(conditions)))
            if found:
                self._no_closure(found)
                if any(self._in_handler(line, scale.statement) for line, _ in found):
                    self.unsafe.append(f"`{wanted}.step()` runs in a `finally:`/`except:`, also where nothing was scaled")
                condition = self._step_condition(conditions, scale.call)
                self._plan_grad_readers(scale, wanted, passed, sibling, found)
                return [(line, index, condition) for line, index in found]
            owner = self.parent.get(id(block))
            if isinstance(owner, (cst.If, cst.Else)):
                conditions.append(self._branch_condition(owner))
            elif not isinstance(owner, _TRANSPARENT):
                break
            while isinstance(owner, (cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally)) or (
                isinstance(self.parent.get(id(owner)), (cst.If, cst.Else)) and isinstance(owner, cst.If)
            ):
                owner = self.parent.get(id(owner))
            current = owner
        anywhere = self._steps_in_file(wanted)
        self._no_closure(anywhere)
        if not anywhere:
            raise _Unplannable(scale.call, f"no `{wanted}.step()` follows `amp.scale_loss`, so the scaler cannot step the optimizer")
        # Every `optimizer.step()` of the file then goes through the scaler: right as long as no
        # backward pass of the file skips the scaler while it is enabled.
        plain = self._plain_backward()
        if plain is not None:
            self.unsafe.append(
                f"`{wanted}.step()` is not next to `amp.scale_loss`, and the backward pass at line {self._line(plain)} "
                "is not scaled: every `{wanted}.step()` in the file goes through the scaler".replace("{wanted}", wanted)
            )
        if any(self._in_handler(line, scale.statement) for line, _ in anywhere):
            self.unsafe.append(f"`{wanted}.step()` runs in a `finally:`/`except:`, also where nothing was scaled")
        if any(self._exclusive(line, scale.statement) for line, _ in anywhere):
            self.unsafe.append(f"a `{wanted}.step()` sits in another branch than the scaled backward: it may run before anything is scaled")
        for line, index in anywhere:
            self._plan_grad_readers(scale, wanted, [], self._function(line) or self.module, [(line, index)], anywhere)
        return [(line, index, None) for line, index in anywhere]

    def _plain_backward(self, beside: cst.CSTNode | None = None) -> cst.Call | None:
        """A ``.backward()`` outside ``amp.scale_loss`` that may run while the scaler is enabled;
        with ``beside``, one in its function that can run in the same pass (not in another branch)."""
        scaled = [self._statement(call) for call in self.sites["scale_loss"]]
        scope = self.module if beside is None else self._function(beside) or self.module
        for call in _backward_calls(scope, nested=True):
            if any(self._inside(call, statement) for statement in scaled) or self._scaler_disabled_at(call):
                continue
            if beside is not None and self._exclusive(call, beside):
                continue
            return call
        return None

    def _exclusive(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        """Whether the two sit in different branches of one ``if``, so never run in the same pass."""
        child, node = first, self.parent.get(id(first))
        while node is not None:
            if isinstance(node, cst.If) and self._inside(second, node) and not self._inside(second, child):
                return child is node.body or child is node.orelse
            child, node = node, self.parent.get(id(node))
        return False

    def _scaler_disabled_at(self, node: cst.CSTNode) -> bool:
        """Inside ``else:`` of ``if fp16:`` (or ``if not fp16:``) where ``fp16`` disables the scaler."""
        if self._guard_test is None:
            return False
        child, parent = node, self.parent.get(id(node))
        while parent is not None:
            if isinstance(parent, cst.If):
                test = nodes.code(parent.test)
                if (test == self._guard_test and child is parent.orelse) or (test == f"not {self._guard_test}" and child is parent.body):
                    return True
            child, parent = parent, self.parent.get(id(parent))
        return False

    def _in_handler(self, line: cst.CSTNode, scaled: cst.CSTNode) -> bool:
        node = self.parent.get(id(line))
        while node is not None and not isinstance(node, cst.FunctionDef):
            if isinstance(node, (cst.Finally, cst.ExceptHandler, cst.ExceptStarHandler)) and not self._inside(scaled, node):
                return True
            node = self.parent.get(id(node))
        return False

    def _no_closure(self, found: list[tuple[cst.SimpleStatementLine, int]]) -> None:
        for line, index in found:
            if index == _EACH:
                continue  # its inner steps were checked by name
            if line.body[index].value.args:
                raise _Unplannable(line, "`optimizer.step(closure)`: GradScaler does not support closures")

    def _step_condition(self, conditions: list[str | None], call: cst.Call) -> str | None:
        """The test under which the scaled backward ran, when the step sits outside that ``if``.

        None when no test is needed: no branch, or the branch's test is the flag the scaler
        was created with (a disabled scaler steps the optimizer plainly).
        """
        if not conditions or (self._guard_test is not None and conditions == [self._guard_test]):
            return None
        if None not in conditions:
            return " and ".join(f"({c})" if " " in c and len(conditions) > 1 else c for c in reversed(conditions))
        raise _Unplannable(call, "the scaled backward runs under a condition the optimizer step cannot test again (it calls something)")

    def _branch_condition(self, branch: cst.If | cst.Else) -> str | None:
        """When the body of ``branch`` runs: ``test``, ``not (a) and b`` for an elif, ``not (test)`` for else.

        None when a test of the chain has side effects (calls), so it cannot be evaluated again.
        """
        own = branch.test if isinstance(branch, cst.If) else None
        earlier = []
        link = branch
        while True:
            above = self.parent.get(id(link))
            if not (isinstance(above, cst.If) and above.orelse is link):
                break
            earlier.insert(0, above.test)
            link = above
        tests = [*earlier, *([own] if own is not None else [])]
        if not all(nodes.is_pure(test) for test in tests):
            return None
        parts = [_negated(t) for t in earlier] + ([nodes.code(own)] if own is not None else [])
        return " and ".join(_grouped_text(p) if len(parts) > 1 else p for p in parts)

    def _plan_grad_readers(
        self,
        scale: _ScaleLoss,
        optimizer: str,
        passed: list[tuple[list[cst.BaseStatement], list[str | None]]],
        container: cst.CSTNode,
        steps: list[tuple[cst.SimpleStatementLine, int]],
        every_step: list[tuple[cst.SimpleStatementLine, int]] | None = None,
    ) -> None:
        """``scaler.unscale_(optimizer)`` before the first statement reading gradients on the way to the step.

        apex unscaled when ``scale_loss`` exited, so clipping ``model.parameters()`` or a gradient
        norm taken there saw true gradients; natively they stay scaled until ``unscale_`` or the
        step. Unscaling is only right where the step then always follows: a reader on a path
        that may end without a step (accumulation with the step under ``if boundary:``), or
        between two scaled backward passes, makes the fix unsafe.
        """
        readers: list[tuple[cst.BaseStatement, str | None, bool]] = []  # (statement, condition, step always follows)
        inner = self._paths_to_steps(container, steps, every_step or steps)
        step_always_follows = not any(conditional for path in inner for _, conditional in path)
        for between, conditions in passed:
            for statement in between:
                if self._scales_again(statement, scale):
                    readers = [(r, c, False) for r, c, _ in readers]  # these ran before the other backward
                    continue
                if self._reads_grads(statement):
                    readers.append((statement, self._step_condition(conditions, scale.call), step_always_follows))
        condition = self._step_condition(passed[-1][1], scale.call) if passed else None
        if len(inner) == 1:
            path = inner[0]
            for depth in range(len(path) - 1, -1, -1):
                siblings, _ = path[depth]
                follows = not any(conditional for _, conditional in path[:depth])
                for sibling in siblings:
                    if not passed and self._scales_again(sibling, None):
                        readers = []  # read before the backward pass: not between it and the step
                    elif self._reads_grads(sibling):
                        readers.append((sibling, condition, follows))
        elif any(self._reads_grads(s) for path in inner for siblings, _ in path for s in siblings):
            readers.append((container, condition, False))
        if not readers:
            return
        if not all(follows for _, _, follows in readers) or any(_contains(r, (cst.Return, cst.Break, cst.Continue)) for r, _, _ in readers):
            clips = [grad_readers.scale_aware_clips(reader) for reader, _, _ in readers]
            if all(clips):
                self._plan_scale_aware(scale, [call for calls in clips for call in calls])
                return
            self.unsafe.append(
                f"gradients are read where `{optimizer}.step()` does not always follow (apex had unscaled them): "
                f"call `{self.scaler}.unscale_({optimizer})` by hand where they are final"
            )
            return
        first, condition, _ = readers[0]
        line = f"{self._scaler_of(scale.call)}.unscale_({optimizer})"
        if condition is not None:
            line = f"if {condition}:\n    {line}"
        # `if clip: clip_grad_norm_(...)` alone: unscale in the branches that read, as one would write it.
        places = self._first_readers(first) if len(readers) == 1 else [first]
        for place in places:
            lines = self.insert_before.setdefault(id(place), (place, []))[1]
            if line not in lines:
                lines.append(line)
        self.unscale_covered.update(id(reader) for reader, _, _ in readers)

    def _plan_scale_aware(self, scale: _ScaleLoss, clips: list[cst.Call]) -> None:
        """Clips where the step may not follow work on the scaled gradients (see ``grad_readers``)."""
        factor = f"{self._scaler_of(scale.call)}.get_scale()"
        masters = {id(call): call for call in self.sites["master_params"]}
        for clip in clips:
            params = clip.args[0].value if clip.args and clip.args[0].keyword is None else None
            generator = None
            if isinstance(params, cst.Call) and id(params) in masters:
                generator = self._master_params_generator(params)
                self.master_params_in_clips.add(id(params))
            new = grad_readers.scale_aware(clip, factor, self.parent.get(id(clip)), generator, self.module)
            self._replace(clip, new)
            self._kind(clip, SCALE_LOSS, "gradients read after `amp.scale_loss` were unscaled by apex",
                       f"Clip the scaled gradients at the threshold times `{factor}`: the step may not follow, so they cannot be unscaled here")

    def _first_readers(self, statement: cst.BaseStatement) -> list[cst.BaseStatement]:
        """Where gradients are first read in each branch of ``statement`` (itself, unless it is an ``if``)."""
        if not isinstance(statement, cst.If):
            return [statement]
        found, branch = [], statement
        while branch is not None:
            if isinstance(branch, cst.If) and self._reads_grads(branch.test) or not isinstance(branch.body, cst.IndentedBlock):
                return [statement]
            first = next((s for s in branch.body.body if self._reads_grads(s)), None)
            if first is not None:
                found += self._first_readers(first)
            if nodes.code(statement.test) == self._guard_test:
                break  # past `if fp16:` the scaler is disabled: nothing to unscale
            branch = branch.orelse if isinstance(branch, cst.If) else None
        return found

    def _paths_to_steps(self, container: cst.CSTNode, steps: list[tuple[cst.SimpleStatementLine, int]],
                        every_step: list[tuple[cst.SimpleStatementLine, int]]):
        """For each step inside ``container``, innermost first: the statements before it in each
        enclosing block, and whether entering that block is conditional (a branch or a loop)."""
        paths = []
        for line, _ in steps:
            path, node = [], line
            while node is not container:
                block = self.parent[id(node)]
                body = list(block.body)
                owner = self.parent.get(id(block))
                conditional = not isinstance(owner, (cst.With, cst.Try, cst.TryStar, cst.Finally, cst.FunctionDef, type(None)))
                if isinstance(owner, (cst.If, cst.Else)) and self._every_arm_steps(owner, every_step):
                    conditional = False  # `if c: opt.step() ... else: opt.step()`: a step follows either way
                path.append((body[: body.index(node)], conditional))
                if owner is None:
                    break
                node = owner
                while not isinstance(self.parent.get(id(node)), (cst.IndentedBlock, cst.Module)):
                    node = self.parent[id(node)]
            paths.append(path)
        return paths

    def _every_arm_steps(self, arm: cst.If | cst.Else, steps: list[tuple[cst.SimpleStatementLine, int]]) -> bool:
        """Whether every arm of the if/elif/else chain holding ``arm`` holds one of ``steps``."""
        top = arm
        while isinstance(top, cst.Else) or getattr(self.parent.get(id(top)), "orelse", None) is top:
            top = self.parent[id(top)]  # up from an else or an elif to the chain's first if
        branch: cst.CSTNode | None = top
        while isinstance(branch, cst.If):
            if not any(self._inside(line, branch.body) for line, _ in steps):
                return False
            branch = branch.orelse
        return isinstance(branch, cst.Else) and any(self._inside(line, branch.body) for line, _ in steps)

    def _scales_again(self, statement: cst.CSTNode, scale: _ScaleLoss | None) -> bool:
        """Whether ``statement`` holds a backward pass other than ``scale``'s (a ``scale_loss`` or ``.backward()``)."""
        others = [call for call in self.sites["scale_loss"] if scale is None or call is not scale.call]
        return any(self._inside(call, statement) for call in others) or bool(_backward_calls(statement))

    _reads_grads = staticmethod(grad_readers.reads_grads)

    def _steps_in(self, statement: cst.CSTNode, wanted: str) -> list[tuple[cst.SimpleStatementLine, int]]:
        if isinstance(statement, cst.SimpleStatementLine):
            return [(statement, i) for i, small in enumerate(statement.body) if _is_step(small, wanted)]
        if self._steps_each(statement, wanted):
            return [(statement, _EACH)]
        if not isinstance(statement, _TRANSPARENT):
            return []
        found = []
        for child in statement.children:
            if isinstance(child, cst.IndentedBlock):
                for inner in child.body:
                    found += self._steps_in(inner, wanted)
            elif isinstance(child, _TRANSPARENT):
                found += self._steps_in(child, wanted)
        return found

    def _steps_each(self, statement: cst.CSTNode, wanted: str) -> list[tuple[cst.SimpleStatementLine, int]]:
        """``for opt in optimizers: opt.step()`` over the list ``wanted``: the steps in its body."""
        if not (isinstance(statement, cst.For) and isinstance(statement.target, cst.Name) and statement.orelse is None
                and _normal(nodes.code(statement.iter)) == _normal(wanted)):
            return []
        return [hit for inner in statement.body.body for hit in self._steps_in(inner, statement.target.value)]

    def _steps_in_file(self, wanted: str) -> list[tuple[cst.SimpleStatementLine, int]]:
        found = []

        class _Steps(cst.CSTVisitor):
            def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
                found.extend((node, i) for i, small in enumerate(node.body) if _is_step(small, wanted))
                return False

        self.module.visit(_Steps())
        return found

    def _each_step_replacement(self, loop: cst.For, update: bool, condition: str | None, scaler: str) -> Replacement:
        """The loop stepping each optimizer through the scaler, and one ``update()`` after it."""
        if condition is not None:
            raise _Unplannable(loop, "the optimizers are stepped in a loop under a condition the scaler cannot test again")
        inner = {id(line): self._step_replacement(line, {index: False}, None, scaler)
                 for line, index in self._steps_each(loop, nodes.code(loop.iter))}
        new = loop.visit(_ReplaceByIdentity(inner))
        if not update:
            return new
        return cst.FlattenSentinel([new, nodes.parse_statements(f"{scaler}.update()\n", self.module)[0]])

    def _step_replacement(self, line: cst.SimpleStatementLine, updates: dict[int, bool], condition: str | None, scaler: str) -> Replacement:
        smalls: list[cst.BaseSmallStatement] = []
        for i, small in enumerate(line.body):
            if i not in updates:
                smalls.append(small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT))
                continue
            call = small.value
            args = "".join(f", {nodes.code(arg)}" for arg in call.args)
            optimizer = nodes.code(call.func.value)
            new = [cst.Expr(nodes.parse_expression(f"{scaler}.step({optimizer}{args})", self.module))]
            if updates[i]:
                new.append(cst.Expr(nodes.parse_expression(f"{scaler}.update()", self.module)))
            if condition is not None and len(line.body) == 1:
                body = "".join(f"    {nodes.code(statement)}\n" for statement in new)
                text = f"if {condition}:\n{body}else:\n    {nodes.code(small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT))}\n"
                return nodes.with_leading(nodes.parse_statements(text, self.module)[0], line)
            smalls += new
        if len(line.body) == 1:
            first = line.with_changes(body=[smalls[0]])
            return cst.FlattenSentinel([first, *(cst.SimpleStatementLine([small]) for small in smalls[1:])]) if len(smalls) > 1 else first
        return line.with_changes(body=smalls)

    # ---- autocast placement -----------------------------------------------------------------

    def _plan_autocast(self, scale: _ScaleLoss) -> None:
        loss = nodes.code(scale.loss)
        if self._plan_region(scale.statement, loss, scale):
            return
        callers = self._callers_handing(scale)
        # The callers' autocast may ask the scaler whether it is on: it must be visible there.
        visible = not self.may_be_disabled or self.scaler.startswith("self.") or self.scaler_scope in ("global", "module")
        if callers and visible and id(scale.call) not in self.alias_of and not any(self._touched(s) for s, _ in callers):
            # `def optimize(self, loss)` called as `self.optimize(loss)`: the forward is the callers'.
            if all(self._plan_region(statement, handed, scale) for statement, handed in callers):
                return
        block = self.parent.get(id(scale.statement))
        window = self._window(block, scale.statement)
        start = next((i for i, s in enumerate(window) if _assigns(s, loss)), None)
        if start is not None:
            self.unsafe.append("the model's forward call is not next to `amp.scale_loss`: only the loss computation goes under autocast")
            self._wrap(window[start:], scale, loss)
            return
        body = list(block.body)
        before = body[: body.index(scale.statement)]
        scaled = {id(call_statement) for call_statement in map(self._statement, self.sites["scale_loss"])}
        if not window and before and id(before[-1]) in scaled:
            return  # `a, b = out.x, out.y` and a backward pass for each: autocast went before the first
        self.unsafe.append("no forward pass next to `amp.scale_loss`: put the forward pass under `torch.autocast` by hand")
        loss_text = " ".join(nodes.code(scale.loss).split())  # a comment is one line
        self._leave_marker(scale.statement, f"compute `{loss_text}` (the forward pass) under {_AUTOCAST.format(enabled='')}: apex O1 cast it")

    def _plan_region(self, statement: cst.CSTNode, loss: str, scale: _ScaleLoss) -> bool:
        """Autocast around the statements before ``statement`` from the model's forward call on
        (in its block, or a block around it); whether that call was found."""
        current = statement
        while True:
            block = self.parent.get(id(current))
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                return False
            window = self._window(block, current)
            start = next((i for i, s in enumerate(window) if self._calls_model(s, self.model_codes)), None)
            if start is not None:
                self._wrap(window[start:], scale, loss)
                return True
            owner = self.parent.get(id(block))
            while isinstance(owner, cst.Else) or (isinstance(owner, cst.If) and isinstance(self.parent.get(id(owner)), (cst.If, cst.Else))):
                owner = self.parent.get(id(owner))
            if not isinstance(owner, (cst.If, cst.Try, cst.With)):
                return False
            current = owner

    def _callers_handing(self, scale: _ScaleLoss) -> list[tuple[cst.CSTNode, str]]:
        """Where the loss ``scale`` scales is a parameter: each call of its function in the file,
        and the name handed in for it (``self.optimize(loss)``); empty unless all are names."""
        function = self._function(scale.statement)
        if function is None or not isinstance(scale.loss, cst.Name):
            return []
        params = [param.name.value for param in function.params.params]
        if scale.loss.value not in params:
            return []
        position = params.index(scale.loss.value) - (1 if self._class(function) is not None else 0)
        found: list[tuple[cst.CSTNode, cst.Arg | None]] = []
        planner = self

        class _Calls(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> None:
                if planner._helper(node) is function:
                    found.append((planner._statement(node), nodes.argument(node, position, scale.loss.value)))

        self.module.visit(_Calls())
        if not all(arg is not None and isinstance(arg.value, (cst.Name, cst.Attribute)) for _, arg in found):
            return []
        return [(statement, nodes.code(arg.value)) for statement, arg in found]

    def _leave_marker(self, statement: cst.CSTNode, step: str) -> None:
        """A ``# TODO(ampmigrate): ...`` comment on the replacement of ``statement``; AMP017 reports it until done."""
        node, replacement = self.replacements[id(statement)]
        if isinstance(replacement, cst.RemovalSentinel):
            replacement = nodes.with_leading(cst.SimpleStatementLine([cst.Pass()]), statement)
        placed = list(replacement.nodes) if isinstance(replacement, cst.FlattenSentinel) else [replacement]
        comment = cst.EmptyLine(comment=cst.Comment(f"# {MANUAL_STEP_MARKER} {step}"))
        placed[0] = placed[0].with_changes(leading_lines=[*placed[0].leading_lines, comment])
        self._replace(node, cst.FlattenSentinel(placed) if len(placed) > 1 else placed[0])

    def _window(self, block: cst.CSTNode, current: cst.CSTNode) -> list[cst.BaseStatement]:
        body = list(block.body)
        end = body.index(current)
        start = end
        while start > 0 and not self._touched(body[start - 1]) and not _defines(body[start - 1]) and not _contains(body[start - 1], _SUSPENDS):
            start -= 1
        return body[start:end]

    def _touched(self, statement: cst.CSTNode) -> bool:
        targets = self.replacements
        hit = False

        class _Find(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                nonlocal hit
                hit = hit or id(node) in targets
                return not hit

        statement.visit(_Find())
        return hit

    def _calls_model(self, statement: cst.CSTNode, models: set[str], depth: int = 0) -> bool:
        """Whether ``statement`` runs the model: a call of it, or of a helper of the file (a
        function, or a method of the same class) that calls it (``loss = self.run_batch(b)``)."""
        calls: list[cst.Call] = []

        class _Find(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> None:
                calls.append(node)

            def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
                return node is statement

        statement.visit(_Find())
        for call in calls:
            func = call.func
            if nodes.code(func) in models or (isinstance(func, cst.Attribute) and func.attr.value == "forward" and nodes.code(func.value) in models):
                return True
            helper = self._helper(call) if depth < 2 else None
            if helper is not None and self._calls_model(helper, models, depth + 1):
                return True
        return False

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

    def _wrap(self, statements: list[cst.BaseStatement], scale: _ScaleLoss, loss: str) -> None:
        # Stop at the last statement that computes the loss or calls the model: what follows
        # (``optimizer.zero_grad()``, logging) stays outside the autocast region.
        relevant = [i for i, s in enumerate(statements) if _assigns(s, loss) or self._calls_model(s, self.model_codes)]
        if relevant:
            statements = statements[: relevant[-1] + 1]
        enabled = f", enabled={self.scaler}.is_enabled()" if self.may_be_disabled else ""
        if self.scaler_in_block:
            # The block that creates the scaler may not have run (`if use_amp and not ready:`):
            # then there is no scaler, and apex was not on either.
            owner, attribute = self.scaler.split(".", 1)
            enabled = f', enabled=getattr({owner}, "{attribute}", None) is not None and {self.scaler}.is_enabled()'
        if id(scale.call) in self.alias_of:  # what received the scaler may be None (`def run(..., amp=None)`)
            alias = self.alias_of[id(scale.call)]
            enabled = f", enabled={alias} is not None and {alias}.is_enabled()"

        head = nodes.parse_statements(f"with {_AUTOCAST.format(enabled=enabled)}:\n    pass\n", self.module)[0]
        first = statements[0]
        body = [nodes.with_leading(first, cst.SimpleStatementLine([])), *statements[1:]]
        wrapped = head.with_changes(body=head.body.with_changes(body=body), leading_lines=first.leading_lines)
        self._replace(first, wrapped)
        self._kind(first, INITIALIZE, "the forward pass of an `amp.initialize`d model runs under apex's casts", "Wrap the forward pass and the loss in `torch.autocast`")
        for statement in statements[1:]:
            self._replace(statement, cst.RemoveFromParent())
            self._kind(statement, INITIALIZE, "the forward pass of an `amp.initialize`d model runs under apex's casts", "Moved under `torch.autocast`")

    # ---- master_params and state_dict ---------------------------------------------------------

    def _plan_master_params(self) -> None:
        # Blocks where `scaler.unscale_(opt)` is inserted, per optimizer: once per block, so that
        # each branch reading gradients (`if clip: clip_grad_norm_ ... else: grad_norm(...)`) reads
        # unscaled ones, and never twice on one path (GradScaler refuses a second unscale_).
        unscaled: dict[str, list[cst.CSTNode]] = {}
        for call in self.sites["master_params"]:
            optimizer = nodes.argument(call, 0, "optimizer")
            if optimizer is None or nodes.has_star(call) or len(call.args) != 1:
                raise _Unplannable(call, "`amp.master_params` is not called with one optimizer")
            if self.level in ("O2", "O3") or (self.level is None and not self.level_guarded):
                self.unsafe.append(MASTER_COPIES)
            if id(call) in self.master_params_in_clips:
                continue
            opt = nodes.code(optimizer.value)
            generator = self._master_params_generator(call)
            statement = self._statement(call)
            blocks = self._enclosing_blocks(statement)
            done = unscaled.setdefault(opt, [])
            already = any(block is unscaled_block for block in blocks for unscaled_block in done)
            inspects_grads = self._feeds_grad_consumer(call, statement)
            covered = any(id(node) in self.unscale_covered for node in (statement, *self._ancestors(statement)))
            already = already or covered  # unscaled before the gradients are first read, on the way to the step
            self._kind(call, MASTER_PARAMS, "`amp.master_params` is apex mixed precision", "Use the optimizer's parameters")
            if self.o0 or not inspects_grads or already or not isinstance(statement, cst.SimpleStatementLine):
                self._replace(call, generator)
                if inspects_grads and not self.o0 and not already:
                    self.unsafe.append("gradients are read in a compound statement: call `scaler.unscale_(optimizer)` before it")
                continue
            if any(self._inside(block, blocks[0]) for block in done):
                raise _Unplannable(call, "gradients are read in a nested block before this: unscale once, by hand")
            done.append(blocks[0])
            unscale = nodes.parse_statements(f"{self._scaler_of(call)}.unscale_({opt})\n", self.module)[0]
            updated = statement.deep_replace(call, generator)
            new = cst.FlattenSentinel([nodes.with_leading(unscale, statement), updated.with_changes(leading_lines=())])
            self._replace(statement, new)
            self._kind(statement, MASTER_PARAMS, "`amp.master_params` is apex mixed precision", f"Call `{self.scaler}.unscale_({opt})` first and use the optimizer's parameters")

    def _master_params_generator(self, call: cst.Call) -> cst.BaseExpression:
        """The optimizer's parameters, where ``amp.master_params(optimizer)`` stood."""
        opt = nodes.code(nodes.argument(call, 0, "optimizer").value)
        generator = nodes.parse_expression(f'(p for group in {opt}.param_groups for p in group["params"])', self.module)
        arg = self.parent.get(id(call))
        outer = self.parent.get(id(arg))
        if isinstance(arg, cst.Arg) and isinstance(outer, cst.Call) and len(outer.args) == 1 and arg.keyword is None:
            generator = generator.with_changes(lpar=[], rpar=[])
        return generator

    def _ancestors(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        found = []
        node = self.parent.get(id(node))
        while node is not None:
            found.append(node)
            node = self.parent.get(id(node))
        return found

    def _place_insertions(self) -> None:
        """Put the planned lines (``scaler.unscale_``, a disabled scaler in ``__init__``) before their
        statements, keeping any fix inside them."""
        for statement, lines in self.insert_before.values():
            own = self.replacements.get(id(statement))
            if own is not None:
                replaced = own[1]
                body = list(replaced.nodes) if isinstance(replaced, cst.FlattenSentinel) else [replaced]
            else:
                inner = {id(node): new for node, new in self.replacements.values() if self._inside(node, statement)}
                body = [statement.visit(_ReplaceByIdentity(inner))] if inner else [statement]
                if inner:
                    self.composed.add(id(statement))
            new = nodes.parse_statements("\n".join(lines) + "\n", self.module)
            placed = [nodes.with_leading(new[0], statement), *new[1:], body[0].with_changes(leading_lines=()), *body[1:]]
            self._replace(statement, cst.FlattenSentinel(placed))
            if id(statement) not in self._kinds:
                self._kind(
                    statement,
                    SCALE_LOSS,
                    "gradients read after `amp.scale_loss` were unscaled by apex",
                    f"Call `{self.scaler}.unscale_(optimizer)` before reading them",
                )

    def _enclosing_blocks(self, statement: cst.CSTNode) -> list[cst.CSTNode]:
        """The blocks holding ``statement``, innermost first, up to its function's body."""
        blocks, node = [], self.parent.get(id(statement))
        while node is not None and not isinstance(node, cst.FunctionDef):
            if isinstance(node, (cst.IndentedBlock, cst.Module)):
                blocks.append(node)
            node = self.parent.get(id(node))
        return blocks

    def _feeds_grad_consumer(self, call: cst.Call, statement: cst.CSTNode) -> bool:
        """Whether the parameters go into something that reads gradients (clipping, norms)."""
        node = self.parent.get(id(call))
        while node is not None and node is not statement:
            if isinstance(node, cst.Call) and any(word in nodes.call_name(node).lower() for word in ("clip", "norm", "grad")):
                return True
            node = self.parent.get(id(node))
        return False

    def _plan_state_dicts(self) -> None:
        calls = self.sites["state_dict"] + self.sites["load_state_dict"]
        if calls and self.o0:
            raise _Unplannable(calls[0], "O0 has no loss scaler whose state could be saved")
        for call in self.sites["state_dict"]:
            if call.args:
                raise _Unplannable(call, "`amp.state_dict(destination)` has no native equivalent")
            node, native = self._state_dict_read(call)
            self._replace(node, nodes.parse_expression(native, self.module))
            self._kind(node, STATE_DICT, "`amp.state_dict` is apex's loss-scaler state", f"Use `{native}`")
        for call in self.sites["load_state_dict"]:
            state = nodes.argument(call, 0, "state_dict")
            if state is None or len(call.args) != 1 or nodes.has_star(call):
                raise _Unplannable(call, "`amp.load_state_dict` is not called with one state dict")
            self._replace(call, nodes.parse_expression(f"{self.scaler}.load_state_dict({HELPER_NAME}({nodes.code(state.value)}, {self.scaler}))", self.module))
            self._kind(call, STATE_DICT, "`amp.load_state_dict` is apex's loss-scaler state", f"Use `{self.scaler}.load_state_dict(...)`, converting old apex checkpoints")
        if self.sites["load_state_dict"] and HELPER_NAME not in self.names:
            self.after_imports.append(HELPER_SOURCE)

    def _state_dict_read(self, call: cst.Call) -> tuple[cst.CSTNode, str]:
        """What replaces ``amp.state_dict()`` and the keys read from it: GradScaler's state has
        other keys, so ``amp.state_dict()["loss_scaler0"]["loss_scale"]`` reads the scale itself."""
        keys, node = [], call
        while True:
            outer = self.parent.get(id(node))
            if not (isinstance(outer, cst.Subscript) and outer.value is node):
                break
            keys.append(_subscript_key(outer))
            node = outer
        if not keys:
            return call, f"{self.scaler}.state_dict()"
        native = {"loss_scale": f"{self.scaler}.get_scale()", "unskipped": f'{self.scaler}.state_dict()["_growth_tracker"]'}
        if len(keys) == 2 and (keys[0] or "").startswith("loss_scaler") and keys[1] in native:
            return node, native[keys[1]]
        raise _Unplannable(call, "apex's loss-scaler state is read by key here; GradScaler's state has other keys")

    # ---- tree helpers --------------------------------------------------------------------

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


class _ReplaceByIdentity(cst.CSTTransformer):
    """Swaps the given nodes (by identity) for their replacements."""

    def __init__(self, replacements: dict[int, Replacement]) -> None:
        super().__init__()
        self.replacements = replacements

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) not in self.replacements

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Replacement:
        return self.replacements.get(id(original_node), updated_node)


class _Collect(cst.CSTVisitor):
    """One walk: parents, every identifier (to pick free names), and every reference to apex.amp."""

    def __init__(self, planner: _Planner) -> None:
        super().__init__()
        self.planner = planner
        self.stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        planner = self.planner
        if self.stack:
            planner.parent[id(node)] = self.stack[-1]
        self.stack.append(node)
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            return False
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            planner.order[id(node)] = len(planner.order)
        if isinstance(node, cst.Try):
            self._import_fallback(node)
        if isinstance(node, cst.Name):
            planner.names.add(node.value)
            if node.value == "torch" and isinstance(self.stack[-2], (cst.Param, cst.AssignTarget)):
                # A parameter or local named `torch`: the rewrite's `torch.autocast` would read it.
                scope = next((n for n in reversed(self.stack) if isinstance(n, (cst.FunctionDef, cst.Lambda))), None)
                if scope is not None:
                    planner.torch_shadowed.append((node, scope))
        elif isinstance(node, cst.Attribute):
            planner.attributes.add(node.attr.value)
        elif isinstance(node, cst.Assign):
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    planner.assigned.setdefault(target.target.value, []).append(node.value)
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument":
            self._argument(node)
        if isinstance(node, (cst.Name, cst.Attribute)) and not self._binding(node):
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
        if not any(_imports_apex(small) for small in imports):
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


def _backward_calls(statement: cst.CSTNode, nested: bool = False) -> list[cst.Call]:
    """``x.backward(...)`` calls (a project's own ``backward(loss, opt)`` helper is not one)."""
    return [call for call in _calls(statement, lambda name: name == "backward", nested=nested) if isinstance(call.func, cst.Attribute)]


def _calls(statement: cst.CSTNode, wanted, *, nested: bool = False) -> list[cst.Call]:
    """The calls in ``statement`` of something whose last name part satisfies ``wanted``; those in
    nested definitions only with ``nested``."""
    found: list[cst.Call] = []

    class _Find(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
            if wanted(name):
                found.append(node)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return nested or node is statement

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return nested

    statement.visit(_Find())
    return found


def _is_step(small: cst.BaseSmallStatement, optimizer: str) -> bool:
    if not isinstance(small, cst.Expr) or not isinstance(small.value, cst.Call):
        return False
    func = small.value.func
    return isinstance(func, cst.Attribute) and func.attr.value == "step" and nodes.code(func.value) == optimizer


def _assigns(statement: cst.CSTNode, name: str) -> bool:
    """Whether ``statement`` binds ``name``: alone, in a tuple (``loss, aux = ...``), or in an arm
    of a compound statement; not in nested definitions."""
    found = False

    class _Find(cst.CSTVisitor):
        def _target(self, target: cst.BaseExpression) -> None:
            nonlocal found
            if isinstance(target, (cst.Tuple, cst.List)):
                for element in target.elements:
                    self._target(element.value)
            else:
                found = found or nodes.code(target) == name

        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            self._target(node.target)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            self._target(node.target)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            self._target(node.target)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

    statement.visit(_Find())
    return found


def _defines(statement: cst.CSTNode) -> bool:
    """Statements autocast must not swallow: definitions, imports and scope declarations."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return True
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(s, (cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal)) for s in statement.body
    )


_SUSPENDS = (cst.Yield, cst.Await)  # other code runs meanwhile: autocast must not stay on across them


def _contains(statement: cst.CSTNode, kinds: tuple[type, ...]) -> bool:
    """Whether ``statement`` holds a node of ``kinds`` outside nested definitions."""
    found = False

    class _Find(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nonlocal found
            found = found or isinstance(node, kinds)
            return not found and not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda))

    statement.visit(_Find())
    return found


def _run_time_scale(value: cst.BaseExpression) -> tuple[str, str]:
    """GradScaler's ``init_scale`` and ``growth_interval`` for apex's ``loss_scale=value``, chosen
    when the script runs: ``"dynamic"`` (or None) as GradScaler's defaults, a number as a scale
    that never grows. ``"dynamic" if c else 128.0`` gives ``2.0**16 if c else 128.0``."""
    if nodes.literal_string(value) == "dynamic" or (isinstance(value, cst.Name) and value.value == "None"):
        return "2.0**16", "2000"
    number = nodes.number_text(value)
    if number is not None:
        return number, _NEVER
    if isinstance(value, cst.IfExp):
        (body_init, body_growth), (else_init, else_growth) = _run_time_scale(value.body), _run_time_scale(value.orelse)
        test = _operand(value.test)
        return f"{body_init} if {test} else {else_init}", f"{body_growth} if {test} else {else_growth}"
    dynamic = f'{_operand(value)} in (None, "dynamic")'
    return f"2.0**16 if {dynamic} else float({nodes.code(value)})", f"2000 if {dynamic} else {_NEVER}"


def _imports_apex(small: cst.BaseSmallStatement) -> bool:
    if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
        return nodes.code(small.module).split(".")[0] == "apex"
    return isinstance(small, cst.Import) and any(alias.evaluated_name.split(".")[0] == "apex" for alias in small.names)


def _subscript_key(subscript: cst.Subscript) -> str | None:
    """The string key of ``x["key"]``, else None."""
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    return nodes.literal_string(subscript.slice[0].slice.value)


def _normal(text: str) -> str:
    text = "".join(text.split())
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return text


def _grouped(expression: cst.BaseExpression) -> str:
    text = nodes.code(expression)
    return text if isinstance(expression, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) else f"({text})"


def _negated(expression: cst.BaseExpression) -> str:
    if isinstance(expression, cst.UnaryOperation) and isinstance(expression.operator, cst.Not):
        return _grouped(expression.expression)
    return f"not {_grouped(expression)}"


def _grouped_text(text: str) -> str:
    return f"({text})" if " " in text and not text.startswith("not ") else text


def _as_bool(expression: cst.BaseExpression) -> str:
    text = nodes.code(expression)
    if isinstance(expression, (cst.Comparison,)) or (isinstance(expression, cst.UnaryOperation) and isinstance(expression.operator, cst.Not)):
        return text
    if isinstance(expression, cst.Name) and expression.value in ("True", "False"):
        return text
    return f"bool({text})"
