"""The planner: classifies the file's apex.amp references, then plans every rewrite or none."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.after_imports import AfterImportsPlanning
from migrate.apex_plan.autocast import AutocastPlanning
from migrate.apex_plan.attribute_forwards import AttributeForwardPlanning
from migrate.apex_plan.detached_forwards import DetachedForwardPlanning
from migrate.apex_plan.checkpoints import CheckpointPlanning
from migrate.apex_plan.classify import classify
from migrate.apex_plan.conditions import disabling_if, flag_spellings, in_failing_arm
from migrate.apex_plan.context import Context, Sites
from migrate.apex_plan.delay_flags import DelayFlagPlanning
from migrate.apex_plan.cross_file import CrossFilePlanning, region_switches
from migrate.apex_plan.draft import Draft
from migrate.apex_plan.gradients import GradientPlanning
from migrate.apex_plan.handed_across import HandedAcrossPlanning
from migrate.apex_plan.handed_on import HandedOnPlanning
from migrate.apex_plan.hidden_readers import helpers_reached
from migrate.apex_plan.initialize import InitializePlanning
from migrate.apex_plan.kept_elsewhere import kept_elsewhere_reasons
from migrate.apex_plan.module_reads import ModuleReadPlanning
from migrate.apex_plan.per_loss import LOSSES_MERGED, LossesShareAStep, scalers_per_loss
from migrate.apex_plan.scaled_readers import ScaledReaderPlanning
from migrate.apex_plan.scaler_parameters import ScalerParameterPlanning
from migrate.apex_plan.several_initialize import SeveralInitializePlanning
from migrate.apex_plan.stand_ins import StandInPlanning
from migrate.apex_plan.steps import StepPlanning
from migrate.apex_plan.step_updates import placed_steps
from migrate.apex_plan.timm_scalers import TimmScalerPlanning
from migrate.apex_plan.version_gated import VersionGatedPlanning, holds_only_dead_apex
from migrate.apex_plan.warm_ups import WarmUpPlanning
from migrate.apex_plan.report_only import report_only
from migrate.apex_plan.half_model import cast_to_half
from migrate.apex_plan.inference_tail import InferenceTailPlanning
from migrate.apex_plan.late_backwards import uncleared_plain_backward
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import (
    ACCEPT_O2, DECORATORS_KEPT, EACH, GUESSED_MODELS, INITIALIZED_ELSEWHERE, LEVELS_ELSEWHERE, MASTER_WEIGHTS_KEPT, PARTNER, SCALE_LOSS,
    SCALE_LOSS_KEPT, SCALER_NAMES, STATE_CALLERS_KEPT, STATE_CALLERS_PASS, STATE_HELPERS, STATE_INITIALIZE_KEPT, ApexPlan, HalfFacts,
    InitializeSite, ScaleBounds, ScaleLossSite, Setup, Unplannable,
)
from migrate.apex_state_reads import SETTING as STATE_READ_ELSEWHERE
from migrate.half_helpers import SETTING as HALF_HELPERS
from migrate.subclass_overrides import SETTING as OVERRIDES
from migrate.base_bindings import SETTING as BASE_BINDINGS
from migrate.cast_registrations import SETTING as CASTS_ELSEWHERE
from migrate.forward_callers import SETTING as HANDED_ELSEWHERE
from migrate.importers import FUNCTIONS_SETTING as IMPORTED_ELSEWHERE
from migrate.grad_norms import SETTING as GRADIENT_NORMS
from migrate.rule import ImportChange, Report
from migrate.types import Safety


class Planner:
    """The plan of one file: its apex.amp sites, then a consistent rewrite of all of them, or none.

    ``plan()`` classifies the references (``classify``), reads the sites, decides the ``Setup``
    once, then runs the planning steps that write the ``Draft``, in order: the steps after each
    ``scale_loss`` (and the gradients read before them), ``master_params`` and the state dicts,
    the scaler made where ``initialize`` was, and the autocast regions; ``_emit()`` turns the
    replacements into findings that share one safety. Each family of steps is its own object,
    given the tree, the sites, the setup and the draft (``context.Step``).
    """

    def __init__(self, provider: cst.MetadataDependent, module: cst.Module) -> None:
        self.tree = FileTree(provider, module)
        self.draft = Draft(self.tree)
        settings = provider.cache or {}
        # The opt levels the rewrite keeps: O0 and O1, and O2 where the project accepts it as autocast.
        self.exact_levels = frozenset({"O0", "O1"} | ({"O2"} if settings.get(ACCEPT_O2) else set()))
        self.partner = settings.get(PARTNER)  # the other half of apex amp, in another file
        self.master_weights_kept = settings.get(MASTER_WEIGHTS_KEPT, ())  # apex initializes left beside a scale half
        self.casts_elsewhere = settings.get(CASTS_ELSEWHERE, ())  # apex cast lists changed by other files
        self.decorators_kept = settings.get(DECORATORS_KEPT, ())  # apex cast decorators left on apex, and why
        self.state_read_elsewhere = settings.get(STATE_READ_ELSEWHERE, ())  # apex's internal state read by other files
        self.handed_elsewhere = settings.get(HANDED_ELSEWHERE, ())  # what other files hand the file's functions
        self.scaled_elsewhere = settings.get(SCALE_LOSS_KEPT, ())  # linked files that keep apex's scale_loss
        self.initialized_elsewhere = settings.get(INITIALIZED_ELSEWHERE, ())  # other files initializing for its scale_loss
        self.levels_elsewhere = settings.get(LEVELS_ELSEWHERE, {})  # option names the project sets to O2/O3
        self.state_helpers = dict(settings.get(STATE_HELPERS, ()))  # another file's checkpoint helpers, handed the scaler
        self.callers_pass = frozenset(settings.get(STATE_CALLERS_PASS, ()))  # this file's helpers, each caller handing it
        self.callers_kept = tuple(settings.get(STATE_CALLERS_KEPT, ()))  # or callers left on apex
        self.initialize_kept = tuple(settings.get(STATE_INITIALIZE_KEPT, ()))  # or the project's initializes left on apex
        self.gradient_norms = frozenset(settings.get(GRADIENT_NORMS, ()))  # names it calls returning a gradient norm
        self.half_helpers = dict(settings.get(HALF_HELPERS, ()))  # imported functions casting modules to float16
        self.overrides = tuple(settings.get(OVERRIDES, ()))  # its classes' methods subclasses elsewhere override
        self.base_bindings = tuple(settings.get(BASE_BINDINGS, ()))  # what bases in other files keep of their parameters
        self.imported_elsewhere = frozenset(settings.get(IMPORTED_ELSEWHERE, ()))  # its functions other files import
        self.sites = Sites()
        self.setup: Setup | None = None  # decided once, before the rewrite is written
        self.findings: list[Report] = []
        self.keep_losses = True  # apex's per-loss scalers become one GradScaler per loss id, where they can

    def plan(self) -> ApexPlan:
        try:
            return self._plan()
        except LossesShareAStep:
            # planned again from the start, apex's per-loss scalers merged into one GradScaler
            self.draft, self.findings, self.setup, self.keep_losses = Draft(self.tree), [], None, False
            return self._plan()

    def _plan(self) -> ApexPlan:
        self.sites = classify(self.tree, self.draft)
        reading = Context(self.tree, self.sites, self.draft, None, self.exact_levels, self.partner, self.handed_elsewhere,
                          self.levels_elsewhere, self.gradient_norms)
        core = self.sites.all_calls()
        if not core:
            return self._handle_alone(reading)
        if (arms := holds_only_dead_apex(self.tree.module, core, self.tree.inside)) is not None:
            return self._without_dead_arms(reading, arms)  # apex only for a torch older than native amp
        try:
            if self.sites.blockers:
                node, reason = self.sites.blockers[0]
                raise Unplannable(node, reason)
            CrossFilePlanning(reading).check_partner(core[0], self.state_read_elsewhere, self.overrides, self.master_weights_kept)
            if self.sites.timm_scalers:
                return self._timm_scalers(reading)
            if self.sites.calls["initialize"] and (half := cast_to_half(self.tree.module, self.half_helpers)) is not None:
                raise half
            self.draft.unsafe += kept_elsewhere_reasons(self.casts_elsewhere, self.decorators_kept, bool(self.sites.calls["initialize"]))
            self._rewrite(reading)
            self.draft.check_disjoint()
        except Unplannable as problem:
            return ApexPlan(report_only(self.tree, self.sites, problem), handled=self._unbound_calls(),
                            half=HalfFacts(manual=problem.reason) if self._is_half() else None)
        handled = frozenset(self.sites.alias_of) | self.sites.stand_in_calls | {id(node) for _, node in self.sites.probes} | {id(node) for *_, node in self.sites.scale_pokes}
        handled |= {id(node) for _, node in self.sites.scale_reads}
        handled |= {id(node) for node, _ in self.tree.refs if self.tree.statement(node) in self.sites.module_reads}
        handled |= {id(call) for _, call in self.setup.receiver_calls} | self._unbound_calls()
        half = HalfFacts(**(self.draft.half_facts or {}), autocast=bool(self.draft.regions),
                         switches=region_switches(self.draft.region_enabled.values(), self.tree.module),
                         reasons=tuple(dict.fromkeys(self.draft.unsafe))) if self._is_half() else None
        return ApexPlan(self.findings, tuple(dict.fromkeys(self.draft.unsafe + self.draft.partner_unsafe)), handled=handled, half=half)

    def _is_half(self) -> bool:
        return bool(self.sites.calls["initialize"]) != bool(self.sites.calls["scale_loss"])

    def _handle_alone(self, reading: Context) -> ApexPlan:
        """The legacy handle, unused, in a file with nothing else of apex amp (a test script's
        ``amp_handle = amp.init(enabled=fp16)``): autocast over what runs after it (``inference_tail``)."""
        handles = self.sites.legacy_handles
        found = InferenceTailPlanning(reading).handle_tail(handles[0], self.imported_elsewhere) if len(handles) == 1 else None
        if (found is None or self.sites.blockers or self.sites.module_reads != [self.tree.statement(handles[0])]
                or cast_to_half(self.tree.module, self.half_helpers) is not None):  # apex fed a float16 model float32 inputs
            return ApexPlan()  # AMP009 says what the handle is
        tail, why = found
        writing = self._decided(reading, Setup(level="O1", o0=False))
        self.draft.unsafe += kept_elsewhere_reasons(self.casts_elsewhere, self.decorators_kept, True) + ([why] if why else [])
        InferenceTailPlanning(writing).plan_handle_tail(tail)
        self.draft.check_disjoint()
        self._emit(writing, [])
        handled = {id(node) for node, _ in self.tree.refs if self.tree.statement(node) in self.sites.module_reads}
        return ApexPlan(self.findings, tuple(dict.fromkeys(self.draft.unsafe)), handled=frozenset(handled) | self._unbound_calls())

    def _timm_scalers(self, reading: Context) -> ApexPlan:
        """timm's ``ApexScaler`` beside ``initialize`` becomes its ``NativeScaler`` (``timm_scalers``)."""
        writing = self._decided(reading, Setup(level="O1", o0=False))
        TimmScalerPlanning(writing).plan_timm_scalers(self.sites.timm_native)
        self.draft.check_disjoint()
        self._emit(writing, [])
        return ApexPlan(self.findings, tuple(dict.fromkeys(self.draft.unsafe)), handled=self._unbound_calls())

    def _without_dead_arms(self, reading: Context, arms: list[cst.If]) -> ApexPlan:
        """The arms of apex amp that never run on current torch go (``version_gated``)."""
        writing = self._decided(reading, Setup())
        VersionGatedPlanning(writing).plan_removal(arms)
        self.draft.check_disjoint()
        self._emit(writing, [])
        return ApexPlan(self.findings, (), handled=self._unbound_calls())

    def _unbound_calls(self) -> frozenset[int]:
        """The calls through an ``amp`` no import reaches that the plan reads as apex's (AMP016's else)."""
        return frozenset(id(self.tree.parent[id(node)]) for node, _ in self.tree.refs
                         if type(node) is cst.Attribute and id(node.value) in self.tree.unbound and id(node) in self.tree.parent)

    def _rewrite(self, reading: Context) -> None:
        initialize, steps, several = InitializePlanning(reading), StepPlanning(reading), SeveralInitializePlanning(reading)
        inits = [initialize.read_initialize(call) for call in self.sites.calls["initialize"]]
        others = self.sites.calls["master_params"] + self.sites.calls["state_dict"] + self.sites.calls["load_state_dict"]
        # No scaler for these: autocast on what follows (not in a file whose scaler state lives elsewhere).
        found = {id(init): InferenceTailPlanning(reading).inference_tail(init, self.imported_elsewhere) for init in inits} if self.sites.calls["scale_loss"] or not others else {}
        tails = [init for init in inits if found.get(id(init)) is not None]
        inits = [init for init in inits if init not in tails]
        for tail in tails:
            InferenceTailPlanning(reading).plan_inference_tail(tail, found[id(tail)])
        scales = [steps.read_scale_loss(call) for call in self.sites.calls["scale_loss"]]
        inits = ModuleReadPlanning(reading).plan_scale_pokes(inits)
        if inits and self.scaled_elsewhere:
            raise Unplannable(next((site for site in inits if not site.inference), inits[0]).call,
                              f"{', '.join(self.scaled_elsewhere)} stays on apex amp and needs "
                              "this `amp.initialize` (apex fails there without it: \"Amp state has not been initialized\", "
                              "no loss scaler to save): migrate them together")
        if not scales:
            if not inits and tails:
                writing = self._decided(reading, Setup(level="O1", o0=False))
                ModuleReadPlanning(writing).plan_module_reads(tails)
                self._emit(writing, [])
            elif not inits:
                self._master_params_alone(reading)
            else:
                self._hand_off(reading, inits, others)
            return
        # The scaler is made where the first training `initialize` was (not a teacher readied for
        # inference); of several, the one whose function goes on to scale a loss (`main()` calling
        # `train()`, not a test entry point that only evaluates).
        training = [site for site in inits if not site.inference]
        init = next((site for site in training if self._reaches_a_scale(site, scales)), training[0] if training else inits[0]) if inits else None
        if init is not None and self.initialized_elsewhere:
            raise Unplannable(scales[0].call if scales else init.call,
                              f"`amp.initialize` at {', '.join(self.initialized_elsewhere)} sets apex up too, then calls "
                              "what scales this loss: those runs never make the GradScaler this file would make "
                              "(its own `amp.initialize` does not run there); migrate them together by hand")
        others_inits = [site for site in inits if site is not init]
        level, partner_args = CrossFilePlanning(reading).scale_half() if init is None else (init.level, ())
        repeats = [extra for extra in others_inits if several.repeats(init, extra)]
        joined = [extra for extra in others_inits if extra not in repeats and (several.joins(init, extra) or several.inference_beside(init, extra))]
        several.note_inference([init] if init is not None and init.inference else [])  # the others are marked where they go
        apart = [extra for extra in others_inits if extra not in repeats + joined and not extra.inference
                 and self.tree.exclusive(init.statement, extra.statement)]
        o0 = level == "O0"
        scaler_sites: list[cst.CSTNode] = [s.statement for s in scales if id(s.call) not in self.sites.alias_of]
        helpers = ScalerParameterPlanning(reading).helper_calls(self.state_helpers)
        scaler_sites += [call for call in others if id(call) not in self.sites.alias_of] + [node for node, _ in self.sites.escapes] + helpers
        scaler_sites += [read for read, _ in self.sites.scale_reads]
        receiver_calls = HandedOnPlanning(reading).receiver_calls() if self.sites.escapes else ()
        if self.sites.escapes and receiver_calls is None:
            # what receives it is not all seen: a GradScaler in its place may be handed apex's
            # old checkpoint state (`{"loss_scaler0": ...}`, a KeyError) or apex's API
            raise Unplannable(self.sites.escapes[0][0], "`amp` is handed on here to code this file does not show "
                              "(another file, or a container): a GradScaler in its place could be given apex's API or "
                              "its old checkpoint state")
        scaler, scope, stand_in = initialize.scaler_name(init, scaler_sites)
        hoist, in_block = None, False
        # `initialize` in each arm of an `if`/`else`, alike: the scaler is made in every arm
        mirrored = (several.mirrored(init, apart, None) or {}) if apart else {}
        # or alone in the arms of a chain under `if flag:`: one `initialize` under that flag
        chained = several.chained_under_flag(init, apart, scope) if apart and not mirrored and not o0 else None
        if chained is not None:
            hoist = chained[0]
        elif init is not None and not o0 and not mirrored:  # O0: no scaler
            hoist, stand_in, in_block = initialize.hoist_guard(init, scaler_sites, scaler, scope, stand_in)
            # or under the same `if flag:` in each arm, hoisted out of it there
            mirrored = (several.mirrored(init, apart, hoist) or {}) if apart and hoist is not None else mirrored
        if chained is None and any(id(extra) not in mirrored for extra in apart):  # a run training through that arm would have none
            extra = next(extra for extra in apart if id(extra) not in mirrored)
            raise Unplannable(extra.call, f"`amp.initialize` runs here or at line {self.tree.line(init.statement)}, in arms "
                              "that exclude each other: the GradScaler would be made in one only")
        # The function making the scaler hands it to the functions using it, where it can;
        # else a scaler assigned through `global` exists only once its function ran: a disabled
        # one stands in at module level until then, as apex did nothing before `initialize`.
        receivers, maker, returned = None, self.tree.function(init.statement) if init is not None else None, None
        if scope == "global" and not o0 and stand_in is None:
            made_at = several.chain_made_in(init, hoist) if mirrored else hoist if hoist is not None else init.statement
            parameters = ScalerParameterPlanning(reading)
            receivers = parameters.receivers(maker, made_at, scaler_sites)
            if receivers is None and (handed := parameters.returned(maker, made_at, scaler_sites, scaler)) is not None:
                maker, receivers, returned = handed  # `model, optimizer, scaler = build(args)`: the caller hands it on
            if receivers is not None and any(f.name.value in self.imported_elsewhere for f in (*receivers, *(returned or ())[:1])):
                receivers, maker, returned = None, self.tree.function(init.statement), None  # called elsewhere without it
        # handed over by the function initializing in another file, where it can be
        receivers = HandedAcrossPlanning(reading).receivers(scaler_sites, self.imported_elsewhere) if init is None else receivers
        if receivers is not None:
            scope = "parameter"
        elif scope == "global" and not o0 and self.tree.import_anchor() is not None:
            stand_in = "module"
        elif scope == "module" and not o0 and init is not None:
            # Created inside `if __name__ == "__main__":`: functions read it, maybe after an import.
            created_in = self.tree.parent.get(id(hoist if hoist is not None else init.statement))
            if not isinstance(created_in, cst.Module):
                if self.tree.import_anchor() is None:
                    raise Unplannable(init.call, "the scaler would be created in a block at module level, with no import line to declare it after")
                stand_in = "module"
        elsewhere = several.elsewhere(init, [e for e in others_inits if e not in repeats + joined + apart], hoist, scope) if init else {}
        if scope == "global" and receivers is None and several.each_its_own(init, [e for e in inits if id(e) in elsewhere], scaler_sites):
            scope, stand_in = "local", None  # `train()` and `finetune()` each make theirs
        if mirrored and (scope == "global" or stand_in is not None):  # one `global` line, or a stand-in, would not serve every arm
            raise Unplannable(apart[0].call, f"`amp.initialize` runs here or at line {self.tree.line(init.statement)}, in arms "
                              "that exclude each other, and the scaler would be a global or stand in before them: "
                              "made in each arm, it would not be")
        inferring = [e for e in others_inits if e.inference and e not in joined and id(e) not in elsewhere]  # removed, no scaler
        if len(inits) > 1 + len(repeats) + len(joined) + len(elsewhere) + len(mirrored) + len(inferring) + (len(apart) if chained else 0):
            self.draft.unsafe.append(f"`amp.initialize` is called {len(inits)} times: one GradScaler serves them all")
        # the test under which the scaler is enabled: the hoisted `if`'s, or that of the block
        # it is made in after a disabled stand-in
        guard = hoist if hoist is not None else (
            disabling_if(self.tree, init.statement, self.sites.calls["initialize"])
            if init is not None and stand_in is not None and not in_block else None)
        merges = any(site.merges_losses for site in (*inits, *scales))  # apex kept one scaler per loss
        # a chain of `initialize` arms (`chained`) is one setup, whichever arm runs: its loss ids are the first's
        per_loss = [site for site in inits if chained is None or site not in apart]
        names = scalers_per_loss(self.sites, per_loss, scales, scaler, self.tree.module.code) if (
            self.keep_losses and init is not None and not o0 and stand_in is None
            and scope in ("self", "local", "module", "parameter")) else None
        if names is not None:
            scaler, *extra_scalers = dict.fromkeys(names.values())
        elif not o0 and merges:
            self.draft.unsafe.append(LOSSES_MERGED)
        writing = self._decided(reading, Setup(
            level=level,
            o0=o0,
            scaler=scaler,
            scope=scope,
            stand_in=stand_in,
            in_block=in_block,
            may_be_disabled=not in_block and (
                hoist is not None or stand_in is not None or (init is None and receivers is not None)
                or (init is not None and (init.enabled is not None or init.level_expression is not None))),
            merged_losses=names is None and merges,
            extra_scalers=tuple(extra_scalers) if names is not None else (),
            loss_scalers=names or {},
            level_guarded=init is not None and init.guard_level,
            guard=guard,
            guard_tests=flag_spellings(self.tree, guard.test, self.base_bindings) if guard is not None else frozenset(),
            # apex O1 cast every forward pass once it ran: a model under a usual name counts too (`self.model` of a trainer handed it)
            model_codes=frozenset(set().union(*(i.model_codes for i in inits), GUESSED_MODELS)),
            receiver_calls=receiver_calls or (),
            scaler_receivers=receivers or (),
            scaler_maker=maker if receivers is not None else None,
            scaler_returned=returned,
            scale_bounds=init.scale_bounds if init is not None else ScaleBounds(),
        ))
        initialize, steps, gradients = InitializePlanning(writing), StepPlanning(writing), GradientPlanning(writing)
        module_reads = ModuleReadPlanning(writing)
        if stand_in == "init":
            StandInPlanning(writing).plan_default_in_init(init)
        elif stand_in == "class":
            StandInPlanning(writing).plan_class_default(init)
        elif stand_in == "local":
            StandInPlanning(writing).plan_local_default(init)

        # Each optimizer step after a scaled backward goes through the scaler (see step_updates).
        step_scaler: dict[int, str] = {}
        found_by_scale = []
        for scale in scales:
            steps.plan_scale_loss(scale)
            if self.setup.o0:
                continue
            before = len(self.draft.unsafe)
            found = [hit for optimizer in scale.optimizers for hit in steps.plan_steps(scale, optimizer)]
            if (reason := uncleared_plain_backward(steps, scale, found)) is not None:
                self.draft.unsafe.insert(before, reason)
            found_by_scale.append(found)
            for line, _, _ in found:
                named = steps.scaler_of(scale.call)
                if step_scaler.setdefault(id(line), named) != named and self.setup.extra_scalers:
                    raise LossesShareAStep()
                step_scaler[id(line)] = named
        stepped = placed_steps(self.tree, found_by_scale, steps.under_gradient_guard, self.setup.merged_losses)
        for line, updates, condition, update_after in stepped:
            if EACH in updates:
                self.draft.replace(line, steps.each_step_replacement(line, updates[EACH], condition, step_scaler[id(line)]))
                self.draft.kind(line, SCALE_LOSS, "`optimizer.step()` after `amp.scale_loss` must go through the scaler",
                           f"Use `{self.setup.scaler}.step(optimizer)` for each optimizer, then `{self.setup.scaler}.update()` once")
                continue
            replacement = steps.step_replacement(line, dict.fromkeys(updates, False) if update_after else updates, condition, step_scaler[id(line)])
            self.draft.replace(line, cst.FlattenSentinel([replacement, *steps.updates(step_scaler[id(line)], None)]) if update_after else replacement)
            self.draft.kind(line, SCALE_LOSS, "`optimizer.step()` after `amp.scale_loss` must go through the scaler", f"Use `{self.setup.scaler}.step(optimizer)` and `{self.setup.scaler}.update()`")
        steps.plan_gradient_guards()
        gradients.plan_master_params()
        CheckpointPlanning(writing).plan_state_dicts()
        HandedOnPlanning(writing).plan_escapes()
        ScalerParameterPlanning(writing).plan_helper_arguments(helpers, self.state_helpers)
        module_reads.plan_probes()
        module_reads.plan_scale_reads()
        module_reads.plan_module_reads(inits)
        if chained is not None:
            several.remove_chain(chained[1])
        for extra in others_inits:  # first: the `if` around `init` goes when nothing else stays in it
            if chained is not None and extra in apart:
                continue  # it goes with the chain
            if extra in repeats and not self.setup.o0:
                initialize.plan_initialize(extra, None, reinitialize=True)
            elif id(extra) in elsewhere and not self.setup.o0:
                initialize.plan_initialize(extra, elsewhere[id(extra)], again=True)
            elif id(extra) in mirrored and not self.setup.o0:
                initialize.plan_initialize(extra, mirrored[id(extra)], again=True)
            else:
                several.remove(extra, joined=extra in joined)
        if init is not None:
            initialize.plan_initialize(init, hoist)
        elif not self.setup.o0:  # handed over by the other half, or made at module level with its options
            CrossFilePlanning(writing).plan_scale_half_scaler(partner_args, receivers)
        if self.setup.scaler_receivers or self.setup.scaler_returned is not None:
            ScalerParameterPlanning(writing).plan_parameters()
        if not self.setup.o0:
            autocast = AutocastPlanning(writing)
            for scale in scales:
                autocast.plan_autocast(scale)
            AttributeForwardPlanning(writing).plan_attribute_forwards(scales)
            WarmUpPlanning(writing).plan_warm_ups()
            DetachedForwardPlanning(writing).plan_detached_forwards()
        for scale in scales:  # last: a region planned above may hold its line, which then stays
            DelayFlagPlanning(writing).plan_unread_flag(scale)
        AfterImportsPlanning(writing).plan_after_imports()
        self._emit(writing, scales)

    def _decided(self, reading: Context, setup: Setup) -> Context:
        """The context the rewrite is written in: ``setup``, decided once."""
        self.setup = setup
        return reading._replace(setup=setup)

    def _hand_off(self, reading: Context, inits: list[InitializeSite], others: list[cst.Call]) -> None:
        """``amp.initialize`` with the scaled backward in another file (``cross_file``), where the
        scaler may be made and handed to what the other file takes it as (``handed_across``)."""
        if (calls := HandedAcrossPlanning(reading).calls(inits, others)) and set(calls) & set(self.partner.facts.receives):
            writing = self._decided(reading, HandedAcrossPlanning(reading).made_here(inits[0]))
            HandedAcrossPlanning(writing).plan_hand_across(inits[0], calls)
        else:  # no scaler is made here: the other half's `scale_loss` says whether apex's per-loss scalers merge
            writing = self._decided(reading, CrossFilePlanning(reading).hand_off_setup(inits, others))
            CrossFilePlanning(writing).plan_hand_off(inits, tuple(calls or ()))
        if others:
            CheckpointPlanning(writing).plan_state_dicts()
            AfterImportsPlanning(writing).plan_after_imports()
        ModuleReadPlanning(writing).plan_module_reads(inits)
        self._emit(writing, [])

    def _master_params_alone(self, reading: Context) -> None:
        """``amp.master_params`` in a file with no other amp: its parameters, when no gradient is read."""
        states = self.sites.calls["state_dict"] + self.sites.calls["load_state_dict"]
        scaler = next((name for name in SCALER_NAMES if name not in self.tree.names), None) if states else None
        writing = self._decided(reading, Setup(level=None, o0=True, scaler=scaler, callers_pass=self.callers_pass,
                                                  callers_kept=self.callers_kept, initialize_kept=self.initialize_kept))
        if states:
            CheckpointPlanning(writing).plan_state_alone()
        gradients = GradientPlanning(writing)
        for call in self.sites.calls["master_params"]:
            if gradients.feeds_grad_consumer(call, self.tree.statement(call)):
                raise Unplannable(call, "its gradients are read here, but the scaler that must unscale them first lives in another file")
        gradients.plan_master_params()
        AfterImportsPlanning(writing).plan_after_imports()
        self._emit(writing, [])

    def _reaches_a_scale(self, init: InitializeSite, scales: list[ScaleLossSite]) -> bool:
        """Whether the function running ``init`` scales a loss, or calls one of the file's
        functions that does (or one that calls such a function)."""
        function = self.tree.function(init.statement)
        if function is None:
            return True  # at module level: the script itself
        # nothing skipped: every helper is followed, the scaling ones too
        reached = [function, *helpers_reached(self.tree, function.body, frozenset())]
        return any(self.tree.inside(scale.call, each) for each in reached for scale in scales)

    def _emit(self, writing: Context, scales: list[ScaleLossSite]) -> None:
        self._mark_unsafe(scales)
        ScaledReaderPlanning(writing).mark_scaled_readers(scales)
        for scale in scales:
            scaler = self.setup.loss_scalers.get(id(scale.call), self.setup.scaler)
            fix = f"Use `{scaler}.scale(loss).backward()`" if not self.setup.o0 else "Use `loss.backward()` (O0: no scaling)"
            self.draft.kind(scale.statement, SCALE_LOSS, "`amp.scale_loss` is apex mixed precision", fix)
        self.draft.place_insertions(self.setup.scaler)
        self.draft.place_marks()
        self.draft.compose_nested()
        self.draft.fold_identical_arms(lambda call: in_failing_arm(self.tree, call, self.setup.guard_tests))
        self.draft.indent_as_around()
        self.draft.continue_moved_lines()
        if not self.setup.o0:
            for name, scope in self.tree.torch_shadowed:
                if any(self.tree.inside(node, scope) for node, _ in self.draft.replacements.values()):
                    raise Unplannable(name, "`torch` names something else in this function, where the rewrite needs the torch module")
        safety = Safety.UNSAFE if self.draft.unsafe or self.draft.partner_unsafe else Safety.SAFE
        reasons = list(dict.fromkeys(self.draft.unsafe + self.draft.partner_unsafe))
        notes = "".join(f" (note: {note})" for note in dict.fromkeys(self.draft.notes))
        removes = tuple(dict.fromkeys(change for node, _ in self.tree.refs for change in self.tree.imports.get(nodes.root_name(node) or "", ())))
        adds = (*(() if self.setup.o0 else (ImportChange("torch"),)), *self.draft.imports_added)
        for node, replacement in self.draft.replacements.values():
            code, message, fix = self.draft.kinds[id(node)]
            why_unsafe = self.draft.reasons_for(node, reasons) if reasons else ""
            self.findings.append(Report(code, node, message, replacement, safety, fix + notes, adds, removes, why_unsafe))

    def _setup_anchor(self, statement: cst.CSTNode) -> cst.CSTNode:
        """The replaced node nearest ``statement`` (it, or an ancestor), where a marker goes; past
        a removed one inside another replaced (a chain of `initialize` arms that goes, the `if`
        around it rebuilt): a marker there would overlap."""
        around = [node for node in (statement, *self.tree.ancestors(statement)) if id(node) in self.draft.replacements
                  or isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Module))]
        while len(around) > 1 and id(around[1]) in self.draft.replacements and isinstance(self.draft.replacements.get(id(around[0]), (None, None))[1], cst.RemovalSentinel):
            around.pop(0)
        return around[0] if around else statement

    def _mark_unsafe(self, scales: list[ScaleLossSite]) -> None:
        """An unsafe rewrite may train differently: it says why in the code, where apex amp was set
        up (or scaled the loss), as a ``TODO(ampmigrate)`` that AMP017 reports until reviewed. A
        reason with a marker of its own, at its line, is not repeated."""
        reasons = [reason for reason in dict.fromkeys(self.draft.unsafe + self.draft.partner_unsafe) if reason not in self.draft.marked_reasons]
        if not reasons:
            return
        # `initialize`'s statement, or the `if` around it that the rewrite replaced as a whole (the
        # scaler hoisted before its flag's test), then the scaled backward passes
        setups = [self._setup_anchor(statement) for statement in map(self.tree.statement, self.sites.calls["initialize"] + self.sites.legacy_handles)]
        anchors = setups + [scale.statement for scale in scales]
        placed = [statement for statement in anchors if id(statement) in self.draft.replacements]
        sited = [site for reason in reasons for site in self.draft.unsafe_sites.get(reason, [])]  # one call's reason: at its line
        anchor = next((a for a in placed if any(self.tree.inside(site, a) for site in sited)), placed[0] if placed else None)
        if anchor is not None:
            self.draft.leave_marker(anchor, "review, this rewrite is unsafe: " + "; ".join(reasons))

