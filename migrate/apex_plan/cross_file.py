"""One half of apex amp in this file, the other half in another: planned with that half's facts."""
from __future__ import annotations

import re
from collections.abc import Iterable

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Step
from migrate.apex_plan.initialize import InitializePlanning
from migrate.apex_plan.scaler_options import constant_option
from migrate.apex_plan.several_initialize import INFERENCE_CAST, SeveralInitializePlanning, halved, inference_step
from migrate.forwardless_models import SETTING as FORWARDLESS
from migrate.apex_plan.vocabulary import (
    COMPUTED_LEVEL,
    INITIALIZE,
    InitializeSite,
    ScaleBounds,
    Setup,
    Unplannable,
    normal,
)
from migrate.tree_walk import descendants
from migrate.types import ImportChange

BOTH = "give ampmigrate both files to migrate them together"


class CrossFilePlanning(Step):
    """A file with ``amp.initialize`` and no ``amp.scale_loss`` (the initialize half), or the reverse.

    Alone, each half's rewrite is unsafe: the scale half makes a GradScaler with apex's defaults,
    not with the options ``initialize`` was given, and the initialize half only loses its call.
    Paired in one run (``migrate.halves``), the scale half makes its GradScaler at module level
    with the initialize half's options, and the initialize half imports it for its checkpoints.
    The pair is as safe as its less safe half (each takes the other's reasons), so a run fixes
    both halves or neither; a half that cannot be rewritten keeps the other as it is too.

    It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the ``Draft``.
    """

    def check_partner(self, first: cst.CSTNode, state_reads: tuple[str, ...] = (), overrides: tuple = (),
                      master_weights_kept: tuple[str, ...] = ()) -> None:
        """Unplannable where the other half cannot be rewritten, where other files read apex's
        internal state (``migrate.apex_state_reads``), which this file's ``initialize`` fills,
        where a subclass in another file overrides a method holding a site or a step
        (``migrate.subclass_overrides``): the rewrite changes what that method must do, or, for a
        file that scales a loss and initializes nothing, where its project keeps an
        ``amp.initialize`` that may hold fp32 master weights (``migrate.apex_kept``)."""
        scales = self.sites.calls["scale_loss"]
        if master_weights_kept and scales and not self.sites.calls["initialize"]:
            raise Unplannable(scales[0], (
                f"`amp.initialize` at {', '.join(master_weights_kept)} stays on apex amp and may keep float32 master "
                "weights (O2, O3, or an opt level set at run time): the optimizer steps those copies, which apex fills "
                "in `scale_loss` and a GradScaler here would not (\"No inf checks were recorded\"); migrate them together"))
        for owner, method, place in overrides:
            site = self._site_in_method(owner, method)
            if site is not None:
                raise Unplannable(site, f"`{owner}.{method}` is overridden in another file ({place}), which this rewrite "
                                        "does not reach: migrate the two together by hand")
        facts = self.partner.facts if self.partner is not None else None
        if facts is not None and facts.manual:
            # the other half failed on this half's own reason ("its other half, <this file>, cannot
            # be rewritten (...)"): that reason, not the loop back to it
            back = re.fullmatch(r"its other half, .+? cannot be rewritten \((.*)\)", facts.manual, re.DOTALL)
            raise Unplannable(first, back.group(1) if back else
                              f"its other half, {self._partner_at()}, cannot be rewritten ({facts.manual})")
        if state_reads and self.sites.calls["initialize"]:
            raise Unplannable(self.sites.calls["initialize"][0], (
                f"another file reads apex's internal state, which `amp.initialize` fills ({', '.join(state_reads[:3])}"
                f"{', ...' if len(state_reads) > 3 else ''}): without it those reads raise; migrate them first"))

    def _site_in_method(self, owner: str, method: str) -> cst.CSTNode | None:
        """The first apex site or optimizer ``step()`` in ``owner.method`` of the file."""
        for cls in (n for n in descendants(self.tree.module) if type(n) is cst.ClassDef and n.name.value == owner):
            for function in (s for s in cls.body.body if type(s) is cst.FunctionDef and s.name.value == method):
                for node in descendants(function):
                    if type(node) is cst.Call and (id(node) in self.sites.ids or (
                            isinstance(node.func, cst.Attribute) and node.func.attr.value == "step" and not node.args)):
                        return node
        return None

    def _partner_at(self) -> str:
        return f"{self.partner.file} (line {self.partner.line})"

    def scale_half(self) -> tuple[str, tuple[str, ...]]:
        """The opt level and GradScaler arguments of a file that scales the loss but initializes nothing."""
        partner = self.partner
        if partner is None or partner.facts is None:
            where = f"; `amp.initialize` is in {self._partner_at()}: {BOTH}" if partner else ""
            self.draft.unsafe.append(
                "nothing is initialized in this file: it gets its own GradScaler with apex's defaults "
                "(the opt level and options given to `amp.initialize` elsewhere are not seen)" + where
            )
            return "O1", ()
        self.draft.notes.append(f"`amp.initialize` is in {self._partner_at()}, migrated with this file")
        self._take_partner_reasons()
        return partner.facts.level or "O1", partner.facts.scaler_args

    def plan_scale_half_scaler(self, partner_args: tuple[str, ...], receivers: tuple[cst.FunctionDef, ...] | None) -> None:
        """The scale half's GradScaler: taken as a parameter where its initialize half hands it over
        (``handed_across``), else made at module level with the initialize half's options."""
        if receivers is not None:
            names = self.partner.facts.hands_to
            self.draft.half_facts = {"scaler": self.setup.scaler, "receives": tuple(f.name.value for f in receivers if f.name.value in names)}
            return
        arguments = ", ".join(['"cuda"', *partner_args])
        self.draft.after_imports.append(f"{self.setup.scaler} = torch.amp.GradScaler({arguments})\n")
        self.draft.half_facts = {"scaler": self.setup.scaler}

    def _take_partner_reasons(self) -> None:
        """The pair is as safe as its less safe half: the other half's reasons, by its file."""
        self.draft.partner_unsafe += [f"{self.partner.file}: {reason}" for reason in self.partner.facts.reasons]

    def hand_off_setup(self, inits: list[InitializeSite], others: list[cst.Call]) -> Setup:
        """``amp.initialize`` with the scaled backward in another file: no scaler is made here; the
        file that scales the loss makes the GradScaler, which this file imports for its
        checkpoints (``others``)."""
        if self.sites.escapes:
            # `args.amp = amp` beside `amp.initialize`: code in another file calls the module it
            # receives, and no GradScaler is made here to hand on in its place
            node, _ = self.sites.escapes[0]
            raise Unplannable(node, "the amp module is handed on here to code in another file, and the GradScaler "
                              "that would take its place is made there: migrate the two together by hand")
        scaler = self._import_partner_scaler(others[0]) if others else None
        return Setup(level=inits[0].level, o0=True, scaler=scaler)  # no scaler made here

    def plan_hand_off(self, inits: list[InitializeSite], hands_to: tuple[str, ...] = ()) -> None:
        """The initialize half's calls go (see ``hand_off_setup``). Under O1 the returned models and
        optimizers are the ones passed in. ``hands_to``: the other half's functions this file could
        hand a GradScaler made here to (``handed_across``), for the other half's plan to take."""
        partner = self.partner
        paired = partner is not None and partner.facts is not None
        static = all(constant_option(arg.split("=", 1)[1]) for arg in inits[0].scaler_args)
        # what a computed level becomes is the scale half's to say (an O1 scaler made at module
        # level, whatever the level): not "O0 keeps its meaning", which holds where this file made it
        self.draft.unsafe[:] = [reason.removesuffix(", and " + COMPUTED_LEVEL) for reason in self.draft.unsafe
                                if reason != COMPUTED_LEVEL]
        self.draft.half_facts = {"level": inits[0].level, "scaler_args": tuple(inits[0].scaler_args) if static else (),
                                 "hands_to": hands_to}
        SeveralInitializePlanning(self.context).note_inference(inits)
        if any(init.scale_bounds != ScaleBounds() for init in inits):
            self.draft.unsafe.append("`min_loss_scale`/`max_loss_scale` bound apex's scale here; the GradScaler made "
                                     "in the file that scales the loss does not keep them")
        if all(init.level != "O0" for init in inits):
            if paired:
                self.draft.notes.append(f"`amp.scale_loss` is in {self._partner_at()}, migrated with this file: it makes the GradScaler")
                self._take_partner_reasons()
                self._note_what_cannot_cross(inits, static)
            elif partner is not None or not all(init.inference for init in inits):  # inference alone scales nothing
                reason = (f"`amp.scale_loss` is in {self._partner_at()}, not in this file: {BOTH}" if partner is not None else
                          "no file found with this one scales the loss with `amp.scale_loss`: where one does, it gets the GradScaler "
                          "and autocast when it is migrated (migrate both, or neither); where none does, apex only cast the forward "
                          "passes here, or a library handed the model or optimizer scales the loss with apex, which raises once this "
                          "call is gone")
                self.draft.unsafe.append(reason)
                if any(init.level != "O0" for init in inits):
                    self.draft.marked_reasons.append(reason)  # each removed call is marked with what to do
        for init in inits:
            model = nodes.argument(init.call, 0, "models").value
            if halved(init):
                self._plan_half(init, model)
                continue
            # a comment on what to do takes its place: where the model only infers, and where no
            # migrated file scales the loss, as apex's casts end with the call (a backward with
            # no scale_loss still ran its forward in float16)
            marked = (init.inference or not paired) and init.level != "O0"
            InitializePlanning(self.context).plan_initialize_removal(init, with_guard=not marked)  # an `if fp16:` that held only this goes too
            if marked:
                self.draft.marked_reasons.append(INFERENCE_CAST)  # the marker says what to do
                step = inference_step(init)
                optimizers = nodes.argument(init.call, 1, "optimizers")
                if not init.inference and not paired and optimizers is not None:
                    # nothing migrated with it scales a loss: a library may, with apex (helperbot's `BaseBot`)
                    step += (f"; where code handed `{' '.join(nodes.code(optimizers.value).split())}` (another file, a library) "
                             "scales the loss with apex's `amp.scale_loss`, it raises once this call is gone: migrate it too, "
                             "or keep this call on apex")
                self.draft.leave_marker(init.statement, step)

    def _plan_half(self, init: InitializeSite, model: cst.BaseExpression) -> None:
        """O3 for inference: apex ran the model in float16, so ``model.half()`` keeps the ``.half()``
        inputs it is given working (fp32 weights would refuse them). apex's ``forward`` also cast
        its inputs and outputs: safe only where nothing calls it (``migrate.forwardless_models``)."""
        if self.tree.line(init.call) not in (self.tree.provider.cache or {}).get(FORWARDLESS, ()):
            self.draft.unsafe.append("apex O3 also cast the model's inputs to float16 and its outputs to float32; `.half()` does neither")
        code = nodes.code(model)
        target, values = init.restore.split(" = ", 1) if init.restore else (code, code)  # `model, _ = ...(model, [])`
        restore = f"{target} = {values.replace(code, f'{code}.half()', 1)}"
        new = nodes.parse_statements(restore + "\n", self.tree.module)[0]
        self.draft.replace(init.statement, nodes.with_leading(new, init.statement))
        self.draft.kind(init.statement, INITIALIZE, "`amp.initialize` is apex mixed precision", "Call `.half()` on the model: O3 is pure float16")

    def _import_partner_scaler(self, first: cst.CSTNode) -> str:
        """The checkpoints of an initialize half read the scale half's GradScaler, imported from its
        module: the name it has here."""
        partner = self.partner
        if partner is not None and partner.facts is None:
            raise Unplannable(first, f"`amp.scale_loss` is in {self._partner_at()}, which makes the scaler this needs: {BOTH}")
        if partner is None:
            raise Unplannable(first, "`amp.scale_loss` is not in this file, so the scaler this needs lives elsewhere")
        if partner.facts.scaler is None:
            raise Unplannable(first, f"its other half, {self._partner_at()}, makes no GradScaler whose state could be saved")
        if partner.scaler_import is None:
            raise Unplannable(first, f"the GradScaler lives in {partner.file}, which imports this file: importing it back would be circular")
        name = partner.facts.scaler
        local = name if name not in self.tree.names else InitializePlanning(self.context).free_scaler_name()
        self.draft.imports_added.append(ImportChange(partner.scaler_import.module, name, None if local == name else local, partner.scaler_import.relative))
        return local

    def _note_what_cannot_cross(self, inits: list[InitializeSite], static: bool) -> None:
        """Where the scale half's GradScaler, made once at module level, cannot be what apex
        made here: an opt level, options or a switch known only at run time, or a call that may not run."""
        other = self.partner.file
        made, are = ("GradScaler and autocast", "are") if self.partner.facts.autocast else ("GradScaler", "is")  # what the other half writes
        init = inits[0]
        if len({normal(nodes.code(each.call)) for each in inits}) > 1:
            self.draft.unsafe.append(f"`amp.initialize` is called {len(inits)} times with different arguments: {other} makes one GradScaler, as the first asked")
        if init.level is None:
            self.draft.unsafe.append(f"the opt level is computed at run time: {other} gets an O1 {made}")
        if init.enabled is not None:
            self.draft.unsafe.append(f"`enabled={nodes.code(init.enabled)}` is decided at run time: {other}'s {made} {are} always on")
        if not static:
            self.draft.unsafe.append(f"its loss scale is known only at run time: {other}'s GradScaler, made at module level, starts at GradScaler's default")
        statement = init.statement
        block = self.tree.parent.get(id(statement))
        holder = self.tree.parent.get(id(block))
        # a `with` block's body runs whenever the statement does (`with timer("model"):`), as a `try`'s does
        while isinstance(holder, cst.With) or (isinstance(holder, cst.Try) and block is holder.body):
            statement, block = holder, self.tree.parent.get(id(holder))
            holder = self.tree.parent.get(id(block))
        # a script's `if __name__ == "__main__":` runs whenever the script does, as its top level would
        runs_always = isinstance(block, cst.Module) or isinstance(holder, cst.FunctionDef) or (
            nodes.is_main_guard(holder) and isinstance(self.tree.parent.get(id(holder)), cst.Module))
        if not runs_always and not self._under_the_partners_switch(statement, block, holder):
            self.draft.unsafe.append(f"`amp.initialize` runs inside a block here: {other}'s {made} {are} on whether or not it ran")

    def _under_the_partners_switch(self, statement: cst.CSTNode, block: cst.CSTNode, holder: cst.CSTNode) -> bool:
        """Whether ``statement`` is in the body of an ``if`` that runs whenever its function does,
        testing a switch (``if args.fp16:``, ``if args['do_apex']:``) by which every autocast region
        of the scale half is enabled too, read there under the same name (``if self.args.fp16:``,
        ``if p['do_apex']:``): its scaled backward passes, autocast and steps through the scaler
        run only where that switch is on, where this ran; where it is off, neither did. The two
        reads are taken for one setting by their name."""
        if not isinstance(holder, cst.If) or holder.body is not block or switch_name(holder.test) not in self.partner.facts.switches:
            return False
        around = self.tree.parent.get(id(holder))
        owner = self.tree.parent.get(id(around))
        return isinstance(around, cst.Module) or isinstance(owner, cst.FunctionDef) or (
            nodes.is_main_guard(owner) and isinstance(self.tree.parent.get(id(owner)), cst.Module))


def region_switches(enabled: Iterable[str], module: cst.Module) -> frozenset[str]:
    """The switches every region's ``enabled`` argument (``, enabled=bool(p['do_apex'])``, ``,
    enabled=args.fp16 and x``) holds among the operands of its conjunction; none where a region
    is always on."""
    found: frozenset[str] | None = None
    for argument in enabled:
        names = frozenset()
        if argument.startswith(", enabled="):
            names = frozenset(name for operand in _conjuncts(nodes.parse_expression(argument[len(", enabled="):], module))
                              if (name := switch_name(operand)) is not None)
        found = names if found is None else found & names
    return found or frozenset()


def _conjuncts(expression: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(expression, cst.BooleanOperation) and isinstance(expression.operator, cst.And):
        return [*_conjuncts(expression.left), *_conjuncts(expression.right)]
    return [expression]


def switch_name(test: cst.BaseExpression) -> str | None:
    """The name a switch is read by: ``fp16`` of ``args.fp16``, ``self.args.fp16`` or ``bool(fp16)``,
    ``do_apex`` of ``p['do_apex']``; None for any other test."""
    if isinstance(test, cst.Call) and nodes.code(test.func) == "bool" and len(test.args) == 1:
        test = test.args[0].value
    if isinstance(test, cst.Name):
        return test.value
    if isinstance(test, cst.Attribute):
        return test.attr.value
    if isinstance(test, cst.Subscript) and len(test.slice) == 1 and isinstance(test.slice[0].slice, cst.Index):
        return nodes.literal_string(test.slice[0].slice.value)
    return None
