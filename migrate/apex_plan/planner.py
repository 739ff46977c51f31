"""The planner: classifies the file's apex.amp references, then plans every rewrite or none."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.autocast import AutocastPlanning
from migrate.apex_plan.checkpoints import CheckpointPlanning
from migrate.apex_plan.cross_file import CrossFilePlanning
from migrate.apex_plan.gradients import GradientPlanning
from migrate.apex_plan.handed_on import HandedOnPlanning
from migrate.apex_plan.initialize import InitializePlanning
from migrate.apex_plan.module_reads import ModuleReadPlanning
from migrate.apex_plan.several_initialize import SeveralInitializePlanning
from migrate.apex_plan.steps import StepPlanning
from migrate.apex_plan.draft import Draft
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import (
    ACCEPT_O2,
    CAST_API,
    CORE,
    EACH,
    GUESSED_MODELS,
    HELPER_NAME,
    HELPER_SOURCE,
    INITIALIZE,
    MASTER_PARAMS,
    PARTNER,
    SCALE_LOSS,
    STATE_DICT,
    SCALER_NAMES,
    ApexPlan,
    HalfFacts,
    InitializeSite,
    ScaleLossSite,
    Setup,
    Unplannable,
)
from migrate.names import qualified_names
from migrate.native_casts import registered_natively
from migrate.rule import ImportChange, Report
from migrate.types import Safety


class Planner(InitializePlanning, StepPlanning, GradientPlanning, AutocastPlanning, CheckpointPlanning,
              HandedOnPlanning, ModuleReadPlanning, CrossFilePlanning, SeveralInitializePlanning):
    """The plan of one file: its apex.amp sites, then a consistent rewrite of all of them, or none.

    ``plan()`` classifies the references, then ``_rewrite()`` plans, in order: the steps after
    each ``scale_loss`` (and the gradients read before them), ``master_params`` and the state
    dicts, the scaler made where ``initialize`` was, and the autocast regions; ``_emit()`` turns
    the replacements into findings that share one safety.
    """

    def __init__(self, provider: cst.MetadataDependent, module: cst.Module) -> None:
        self.tree = FileTree(provider, module)
        self.draft = Draft(self.tree)
        self.sites: dict[str, list[cst.Call]] = {kind: [] for kind in CORE}
        self.blockers: list[tuple[cst.CSTNode, str]] = []
        self.findings: list[Report] = []
        self.setup: Setup | None = None  # decided once, before the rewrite is written
        self.escapes: list[tuple[cst.CSTNode, str]] = []  # the amp module handed on, and under what name
        self._stand_in_calls: set[int] = set()
        self._stand_in_assignments: list[cst.CSTNode] = []  # `self.amp = amp` where `self.amp` only stands in for the module
        self._stand_ins_assigned_once = True  # no stand-in is assigned anywhere else
        self.alias_of: dict[int, str] = {}  # a site called on what received it -> that expression
        # The opt levels the rewrite keeps: O0 and O1, and O2 where the project accepts it as autocast.
        self.exact_levels = {"O0", "O1"} | ({"O2"} if (provider.cache or {}).get(ACCEPT_O2) else set())
        self.partner = (provider.cache or {}).get(PARTNER)  # the other half of apex amp, in another file
        self.scale_pokes: list[tuple[cst.CSTNode, cst.BaseExpression, cst.CSTNode]] = []  # statement, scale, `amp._amp_state...`
        self.probes: list[tuple[cst.If, cst.CSTNode]] = []  # `if "state_dict" in amp.__dict__:` tests that go, and `amp.__dict__`
        self.module_reads: list[cst.CSTNode] = []  # statements that only touch apex's module (`amp.init()` unused, a log line)
        self.legacy_handles: list[cst.Call] = []  # `amp.init()` calls whose handle is never used

    @property
    def _site_ids(self) -> frozenset[int]:
        """The calls of apex's API the plan rewrites (direct, on a stand-in or on a receiver)."""
        return frozenset(id(call) for found in self.sites.values() for call in found)

    def plan(self) -> ApexPlan:
        self._classify()
        core = [call for kind in CORE for call in self.sites[kind]]
        if not core:
            return ApexPlan()
        try:
            if self.blockers:
                node, reason = self.blockers[0]
                raise Unplannable(node, reason)
            self._check_partner(core[0])
            self._rewrite()
            self.draft.check_disjoint()
        except Unplannable as problem:
            return ApexPlan(self._report_only(problem), half=HalfFacts(manual=problem.reason) if self._is_half() else None)
        handled = frozenset(self.alias_of) | self._stand_in_calls | {id(node) for _, node in self.probes} | {id(node) for *_, node in self.scale_pokes}
        handled |= {id(node) for node, _ in self.tree.refs if self.tree.statement(node) in self.module_reads}
        handled |= {id(call) for _, call in self.setup.receiver_calls}
        half = HalfFacts(**(self.draft.half_facts or {}), reasons=tuple(dict.fromkeys(self.draft.unsafe))) if self._is_half() else None
        return ApexPlan(self.findings, tuple(dict.fromkeys(self.draft.unsafe + self.draft.partner_unsafe)), handled=handled, half=half)

    def _is_half(self) -> bool:
        return bool(self.sites["initialize"]) != bool(self.sites["scale_loss"])

    def _classify(self) -> None:
        for node, name in self.tree.refs:
            attr = name[len("apex.amp.") :] if name != "apex.amp" else ""
            parent = self.tree.parent.get(id(node))
            if attr in CORE and isinstance(parent, cst.Call) and parent.func is node:
                self.sites[attr].append(parent)
            elif attr.split(".")[0] in CAST_API:
                self._cast_edit(attr, node, parent)
            elif attr == "__dict__" and self.tree.in_test(node):
                self._probe(node)  # `if "state_dict" in amp.__dict__:`: GradScaler has both methods
            elif attr == "":
                if self.tree.in_test(node):
                    continue
                alias = self._escape(node)
                if alias is None:
                    self.blockers.append((node, "`amp` is passed on or stored here, so its use elsewhere cannot be seen"))
                else:
                    self.escapes.append((node, alias))
            elif not self._scale_poke(attr, node) and not self._module_read(attr, node):
                self.blockers.append((node, f"`amp.{attr}` (apex internals or the legacy handle) depends on apex's state"))
        self._find_stand_ins()
        if self.escapes:
            self._find_alias_sites({alias for _, alias in self.escapes})

    def _cast_edit(self, attr: str, node: cst.CSTNode, parent: cst.CSTNode | None) -> None:
        """``amp.register_*`` and ``amp.lists`` edits are rewritten on their own (AMP007); where
        native autocast would not make the cast they ask for, autocast computes differently."""
        if attr.startswith("register_") and isinstance(parent, cst.Call) and parent.func is node:
            module = nodes.argument(parent, 0, "module")
            name = nodes.literal_string(getattr(nodes.argument(parent, 1, "name"), "value", None))
            modules = qualified_names(self.tree.provider, module.value) if module is not None else set()
            if registered_natively(f"apex.amp.{attr}", modules, name):
                return
        elif not attr.startswith("lists"):
            return  # cast decorators and `disable_casts` have exact native forms
        self.draft.unsafe.append(
            f"the file changes apex's cast lists (`amp.{attr.split('.')[0]}`, line {self.tree.line(node)}): native autocast "
            "does not read them, so the ops they name run in autocast's own precision"
        )

    def _report_only(self, problem: Unplannable) -> list[Report]:
        line = self.tree.line(problem.node)
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

    def _rewrite(self) -> None:
        inits = [self._initialize(call) for call in self.sites["initialize"]]
        others = self.sites["master_params"] + self.sites["state_dict"] + self.sites["load_state_dict"]
        # No scaler for these: autocast on what follows (not in a file whose scaler state lives elsewhere).
        found = {id(init): self._inference_tail(init) for init in inits} if self.sites["scale_loss"] or not others else {}
        tails = [init for init in inits if found.get(id(init)) is not None]
        inits = [init for init in inits if init not in tails]
        for tail in tails:
            self._plan_inference_tail(tail, found[id(tail)])
        scales = [self._scale_loss(call) for call in self.sites["scale_loss"]]
        self._plan_scale_pokes(inits)
        if not scales:
            if not inits and tails:
                self.setup = Setup(level="O1", o0=False)
                self._plan_module_reads(tails)
                self._emit([])
                return
            if not inits:
                self._master_params_alone()
                return
            self._hand_off(inits, others)
            return
        # The scaler is made where the first training `initialize` was (a teacher readied for
        # inference before it does not decide).
        init = next((site for site in inits if not site.inference), inits[0]) if inits else None
        others_inits = [site for site in inits if site is not init]
        level, partner_args = self._scale_half() if init is None else (init.level, ())
        repeats = [extra for extra in others_inits if self._repeats(init, extra)]
        joined = [extra for extra in others_inits if extra not in repeats and (self._joins(init, extra) or self._inference_beside(init, extra))]
        self._note_inference([extra for extra in inits if extra not in joined])
        if len(inits) > 1 + len(repeats) + len(joined):
            self.draft.unsafe.append(f"`amp.initialize` is called {len(inits)} times: one GradScaler serves them all")
        o0 = level == "O0"
        scaler_sites: list[cst.CSTNode] = [s.statement for s in scales if id(s.call) not in self.alias_of]
        scaler_sites += [call for call in others if id(call) not in self.alias_of] + [node for node, _ in self.escapes]
        receiver_calls = self._receiver_calls() if self.escapes else ()
        if self.escapes and receiver_calls is None:
            self.draft.unsafe.append(
                "`amp` is handed on (`x.amp = amp`, `f(amp=amp)`): the GradScaler takes its place, and "
                "`scale_loss`/`master_params` called on what receives it (found by name) become the scaler's"
            )
        scaler, scope, stand_in = self._scaler_name(init, scaler_sites)
        hoist, in_block = None, False
        if init is not None and not o0:  # O0: no scaler
            hoist, stand_in, in_block = self._hoist_guard(init, scaler_sites, scaler, scope, stand_in)
        # A scaler assigned through `global` exists only once its function ran: a disabled one
        # stands in at module level until then, as apex did nothing before `initialize`.
        if scope == "global" and not o0 and self.tree.import_anchor() is not None:
            stand_in = "module"
        elif scope == "module" and not o0 and init is not None:
            # Created inside `if __name__ == "__main__":`: functions read it, maybe after an import.
            created_in = self.tree.parent.get(id(hoist if hoist is not None else init.statement))
            if not isinstance(created_in, cst.Module):
                if self.tree.import_anchor() is None:
                    raise Unplannable(init.call, "the scaler would be created in a block at module level, with no import line to declare it after")
                stand_in = "module"
        self.setup = Setup(
            level=level,
            o0=o0,
            scaler=scaler,
            scope=scope,
            stand_in=stand_in,
            in_block=in_block,
            may_be_disabled=not in_block and (
                hoist is not None or stand_in is not None
                or (init is not None and (init.enabled is not None or init.level_expression is not None))),
            merged_losses=any(site.merges_losses for site in (*inits, *scales)),
            level_guarded=init is not None and init.guard_level,
            guard_test=nodes.code(hoist.test) if hoist is not None else None,
            model_codes=frozenset(set().union(*(i.model_codes for i in inits)) if inits else GUESSED_MODELS),
            receiver_calls=receiver_calls or (),
        )
        if stand_in == "init":
            self._plan_default_in_init(init)
        elif stand_in == "local":
            self._plan_local_default(init)

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
            if self.setup.o0:
                continue
            plain = self._plain_backward(beside=scale.statement)
            if plain is not None:
                self.draft.unsafe.append(
                    f"the plain backward pass at line {self.tree.line(plain)} adds gradients that apex kept as they were "
                    "and `scaler.step` would divide by the scale"
                )
            found = [hit for optimizer in scale.optimizers for hit in self._plan_steps(scale, optimizer)]
            found_by_scale.append(found)
            step_scaler.update((id(line), self._scaler_of(scale.call)) for line, _, _ in found)
        if self.setup.merged_losses:
            found_by_scale = [[hit for found in found_by_scale for hit in found]]
        for found in found_by_scale:
            found.sort(key=lambda hit: (self.tree.order[id(hit[0])], hit[1]))
            last_in_block = {id(self.tree.parent[id(line)]): (id(line), index) for line, index, _ in found}
            for line, index, condition in found:
                entry = steps.setdefault(id(line), (line, {}, condition))
                last = last_in_block[id(self.tree.parent[id(line)])] == (id(line), index) and not self._under_gradient_guard(line)
                entry[1][index] = entry[1].get(index, False) or last
        for line, updates, condition in steps.values():
            if EACH in updates:
                self.draft.replace(line, self._each_step_replacement(line, updates[EACH], condition, step_scaler[id(line)]))
                self.draft.kind(line, SCALE_LOSS, "`optimizer.step()` after `amp.scale_loss` must go through the scaler",
                           f"Use `{self.setup.scaler}.step(optimizer)` for each optimizer, then `{self.setup.scaler}.update()` once")
                continue
            self.draft.replace(line, self._step_replacement(line, updates, condition, step_scaler[id(line)]))
            self.draft.kind(line, SCALE_LOSS, "`optimizer.step()` after `amp.scale_loss` must go through the scaler", f"Use `{self.setup.scaler}.step(optimizer)` and `{self.setup.scaler}.update()`")
        self._plan_gradient_guards()
        self._plan_master_params()
        self._plan_state_dicts()
        self._plan_escapes()
        self._plan_probes()
        self._plan_module_reads(inits)
        for extra in others_inits:  # first: the `if` around `init` goes when nothing else stays in it
            if extra in repeats and not self.setup.o0:
                self._plan_initialize(extra, None, reinitialize=True)
            else:
                self._plan_initialize_removal(extra, with_guard=extra in joined)
        if init is not None:
            self._plan_initialize(init, hoist)
        elif not self.setup.o0:
            arguments = ", ".join(['"cuda"', *partner_args])
            self.draft.after_imports.append(f"{self.setup.scaler} = torch.amp.GradScaler({arguments})\n")
            self.draft.half_facts = {"scaler": self.setup.scaler}
        if not self.setup.o0:
            for scale in scales:
                self._plan_autocast(scale)
        self._plan_after_imports()
        self._emit(scales)

    def _plan_half(self, init: InitializeSite, model: cst.BaseExpression) -> None:
        """O3 for inference: apex ran the model in float16, so ``model.half()`` keeps the ``.half()``
        inputs it is given working (fp32 weights would refuse them)."""
        self.draft.unsafe.append("apex O3 also cast the model's inputs to float16 and its outputs to float32; `.half()` does neither")
        target, values = init.restore.split(" = ", 1)
        code = nodes.code(model)
        restore = f"{target} = {values.replace(code, f'{code}.half()', 1)}"
        new = nodes.parse_statements(restore + "\n", self.tree.module)[0]
        self.draft.replace(init.statement, nodes.with_leading(new, init.statement))
        self.draft.kind(init.statement, INITIALIZE, "`amp.initialize` is apex mixed precision", "Call `.half()` on the model: O3 is pure float16")

    def _master_params_alone(self) -> None:
        """``amp.master_params`` in a file with no other amp: its parameters, when no gradient is read."""
        states = self.sites["state_dict"] + self.sites["load_state_dict"]
        scaler = next((name for name in SCALER_NAMES if name not in self.tree.names), None) if states else None
        self.setup = Setup(level=None, o0=True, scaler=scaler)
        if states:
            self._plan_state_alone()
        for call in self.sites["master_params"]:
            if self._feeds_grad_consumer(call, self.tree.statement(call)):
                raise Unplannable(call, "its gradients are read here, but the scaler that must unscale them first lives in another file")
        self._plan_master_params()
        self._plan_after_imports()
        self._emit([])

    def _until(self, init: InitializeSite) -> str:
        function = self.tree.function(init.statement)
        return f"until `{function.name.value}()` runs" if function is not None else "until the block below that creates it runs"

    def _plan_after_imports(self) -> None:
        """Definitions the rewrite needs at module level go after the last top-level import."""
        if not self.draft.after_imports:
            return
        anchor = self.tree.import_anchor()
        if anchor is None or self.draft.touched(anchor):
            first = next(call for kind in CORE for call in self.sites[kind])
            raise Unplannable(first, "no top-level import to put the module-level definitions after")
        following = self.tree.module.body[self.tree.module.body.index(anchor) + 1 :]
        blank_after = sum(1 for line in following[0].leading_lines if line.comment is None) if following else 2
        added = []
        for source in sorted(self.draft.after_imports, key=lambda text: text == HELPER_SOURCE):  # assignments first
            statements = nodes.parse_statements(source, self.tree.module)
            blank = 2 if isinstance(statements[0], cst.FunctionDef) else 1 if not added else 0
            added += [statements[0].with_changes(leading_lines=[cst.EmptyLine()] * blank), *statements[1:]]
        if isinstance(added[-1], cst.FunctionDef) and blank_after < 2:  # two blank lines after a def
            footer = [*added[-1].body.footer, *[cst.EmptyLine(indent=False)] * (2 - blank_after)]
            added[-1] = added[-1].with_changes(body=added[-1].body.with_changes(footer=footer))
        self.draft.replace(anchor, cst.FlattenSentinel([anchor, *added]))
        # said as what the file gains, where it gains it (a user reads this line, not the planner's)
        what = []
        if any(source != HELPER_SOURCE for source in self.draft.after_imports):
            what.append(f"the GradScaler `{self.setup.scaler}` is made at module level, after the imports")
        if HELPER_SOURCE in self.draft.after_imports:
            what.append(f"`{HELPER_NAME}`, which reads old apex checkpoints into a GradScaler, is defined after the imports")
        code = STATE_DICT if self.sites["load_state_dict"] else SCALE_LOSS
        self.draft.kind(anchor, code, "; ".join(what), "Add it after the imports" if len(what) == 1 else "Add them after the imports")

    def _emit(self, scales: list[ScaleLossSite]) -> None:
        self._mark_unsafe(scales)
        self._mark_scaled_readers(scales)
        self.draft.place_insertions(self.setup.scaler)
        self.draft.compose_nested()
        if not self.setup.o0:
            for name, scope in self.tree.torch_shadowed:
                if any(self.tree.inside(node, scope) for node, _ in self.draft.replacements.values()):
                    raise Unplannable(name, "`torch` names something else in this function, where the rewrite needs the torch module")
        safety = Safety.UNSAFE if self.draft.unsafe or self.draft.partner_unsafe else Safety.SAFE
        why_unsafe = "; ".join(dict.fromkeys(self.draft.unsafe + self.draft.partner_unsafe))
        notes = "".join(f" (note: {note})" for note in dict.fromkeys(self.draft.notes))
        removes = tuple(dict.fromkeys(change for node, _ in self.tree.refs for change in self.tree.imports.get(nodes.root_name(node) or "", ())))
        adds = (*(() if self.setup.o0 else (ImportChange("torch"),)), *self.draft.imports_added)
        for scale in scales:
            fix = f"Use `{self.setup.scaler}.scale(loss).backward()`" if not self.setup.o0 else "Use `loss.backward()` (O0: no scaling)"
            self.draft.kind(scale.statement, SCALE_LOSS, "`amp.scale_loss` is apex mixed precision", fix)
        for node, replacement in self.draft.replacements.values():
            code, message, fix = self.draft.kinds[id(node)]
            self.findings.append(Report(code, node, message, replacement, safety, fix + notes, adds, removes, why_unsafe))

    def _mark_unsafe(self, scales: list[ScaleLossSite]) -> None:
        """An unsafe rewrite may train differently: it says why in the code, where apex amp was set
        up (or scaled the loss), as a ``TODO(ampmigrate)`` that AMP017 reports until reviewed. A
        reason with a marker of its own, at its line, is not repeated."""
        reasons = [reason for reason in dict.fromkeys(self.draft.unsafe + self.draft.partner_unsafe) if reason not in self.draft.marked_reasons]
        if not reasons:
            return
        anchors = [self.tree.statement(call) for call in self.sites["initialize"]] + [scale.statement for scale in scales]
        anchor = next((statement for statement in anchors if id(statement) in self.draft.replacements), None)
        if anchor is not None:
            self.draft.leave_marker(anchor, "review, this rewrite is unsafe: " + "; ".join(reasons))
