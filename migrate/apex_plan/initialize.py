"""``amp.initialize``: its options, the GradScaler made in its place, and where."""
from __future__ import annotations

import ast
import re

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.conditions import flag_if, tests_a_parameter
from migrate.apex_plan.context import Step
from migrate.apex_plan.module_fallbacks import only_module_fallbacks
from migrate.apex_plan.scaler_options import read_where, scaler_options
from migrate.apex_plan.stand_ins import StandInPlanning
from migrate.apex_plan.syntax import assigned_names, body_through_withs, read_names
from migrate.level_settings import on_a_command_line
from migrate.apex_plan.vocabulary import (
    ACCEPT_O2,
    COMPUTED_LEVEL,
    INITIALIZE,
    INITIALIZE_KEYWORDS,
    SCALER_NAMES,
    InitializeSite,
    Unplannable,
    as_bool,
    conjunction,
    fitted_conjunction,
    normal,
    operand,
    same_places,
)


class InitializePlanning(Step):
    """``amp.initialize``: its options, the GradScaler made in its place, and where.

    It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the ``Draft``.
    """

    def plan_initialize_removal(self, init: InitializeSite, with_guard: bool = False) -> None:
        fix = ("Remove it, and run the model under `torch.autocast` where it computes: apex cast it from here on" if init.inference
               else "Remove it: the scaler is created once, elsewhere")
        if init.restore:
            new = nodes.parse_statements(init.restore + "\n", self.tree.module)[0]
            self.draft.replace(init.statement, nodes.with_leading(new, init.statement))
        else:
            # `if isinstance(ema, nn.Module): ema = amp.initialize(ema, ...)`: the `if` goes too.
            target = init.statement
            while with_guard and (guard := nodes.guarding_if(target, lambda node: self.tree.parent.get(id(node)))) is not None:
                target = guard
            self.draft.replace(target, cst.RemoveFromParent())
            self.draft.kind(target, INITIALIZE, "`amp.initialize` is apex mixed precision", fix)
            return
        self.draft.kind(init.statement, INITIALIZE, "`amp.initialize` is apex mixed precision", fix)

    def _o0_scaled_dynamically(self, call: cst.Call, level: str | None, level_arg: cst.Arg | None) -> bool:
        """Whether the call may run O0 with a dynamic loss scale asked for (``loss_scale="dynamic"``,
        or a value known at run time): apex then scaled in fp32 and skipped overflowing steps."""
        loss_scale = nodes.argument(call, None, "loss_scale")
        if loss_scale is None or nodes.number_text(loss_scale.value) is not None or nodes.is_none(loss_scale.value):
            return False
        if nodes.literal_string(loss_scale.value) not in (None, "dynamic"):
            return False
        if level is not None or level_arg is None:
            return level == "O0"
        possible = self.possible_levels(level_arg.value)
        return possible is None or "O0" in possible

    def _scaled_elsewhere(self) -> bool:
        """Whether the loss is scaled in another file, the other half of apex amp, which makes the GradScaler."""
        return not self.sites.calls["scale_loss"] and self.partner is not None

    def _initialize_fix(self) -> str:
        if self.setup.o0:
            return "Remove it: O0 is plain fp32"
        return f'Create `{self.setup.scaler} = torch.amp.GradScaler("cuda")`'

    def read_initialize(self, call: cst.Call) -> InitializeSite:
        statement = self.tree.statement(call)
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
        if isinstance(small, cst.Assign) and (len(small.targets) != 1 or small.value is not call):
            small = None
        if isinstance(small, (cst.Expr, cst.Return)) and small.value is not call:
            small = None
        if not isinstance(small, (cst.Assign, cst.Expr, cst.Return)):
            raise Unplannable(call, "`amp.initialize` is part of a larger statement")
        if any(arg.star == "*" for arg in call.args):
            raise Unplannable(call, "`amp.initialize` takes `*args`, so its models and options cannot be seen")
        splat = any(arg.star == "**" for arg in call.args)
        if splat:
            self.draft.unsafe_at(call, "options passed through `**kwargs` are not seen: the rewrite is O1 with GradScaler's defaults")
        unknown = nodes.keyword_names(call) - INITIALIZE_KEYWORDS
        if unknown or len([a for a in call.args if a.keyword is None]) > 4:
            raise Unplannable(call, f"`amp.initialize` has arguments apex does not take: {sorted(unknown)!r}")
        models = nodes.argument(call, 0, "models")
        optimizers = nodes.argument(call, 1, "optimizers")
        if models is None:
            raise Unplannable(call, "`amp.initialize` is called without models")
        has_optimizers = optimizers is not None and not (
            nodes.is_none(optimizers.value)
            or (isinstance(optimizers.value, (cst.List, cst.Tuple)) and not optimizers.value.elements)
        )
        level_arg, inits = nodes.argument(call, 3, "opt_level"), len(self.sites.calls["initialize"])  # a level's reason: one call's of several
        level: str | None = None if splat and level_arg is None else "O1"
        guard_level = False
        if level_arg is not None:
            level = nodes.literal_string(level_arg.value)
            possible = self.possible_levels(level_arg.value)
            if level is None and possible is not None and possible <= self.exact_levels:
                # only O0 or O1 can reach this call: both keep their meaning (`opt_level = "O1"` just before it is O1)
                level = next(iter(possible)) if len(possible) == 1 else None
            elif level is None and self._default_level(level_arg.value) in {"O2", "O3"} - self.exact_levels:
                # A run-time check would stop the run people make most; O2/O3 are not exact natively.
                self.draft.unsafe.append(f"the opt level defaults to {self._default_level(level_arg.value)}, and " + COMPUTED_LEVEL)
            elif level is None and self._set_elsewhere(level_arg.value):
                # the project's default or its shipped configs: the same, from another file
                place, set_to = self._set_elsewhere(level_arg.value).rsplit(": ", 1)
                self.draft.unsafe.append(f"the project sets `{level_arg.value.attr.value}` to {set_to} (at {place}), and " + COMPUTED_LEVEL)
            elif level is None and nodes.is_pure(level_arg.value) and (
                    possible is None or self._default_level(level_arg.value) in self.exact_levels):
                # Unknown until run time (or `choices=["O0", "O1", "O2"]` with an O0 or O1 default):
                # O0/O1 keep their meaning, O2/O3 stop with an error (the rewrite adds that check),
                # so no run silently trains differently.
                guard_level = True
                if "O2" in self.exact_levels:
                    self.draft.notes.append(f"O2 as autocast, by the `{ACCEPT_O2}` setting: fp32 weights, no master copies")
            elif level is None:
                self.draft.unsafe.append(COMPUTED_LEVEL)
            elif level in ("01", "o1"):
                # apex refuses it, so no run that worked changes: the rewrite reads the evident O1.
                self.draft.notes.append(f"opt_level {level!r} is not valid (apex refused it); it is read as 'O1'")
                level = "O1"
            elif level not in ("O0", "O1", "O2", "O3"):
                raise Unplannable(call, f"opt_level {level!r} is not one of 'O0'-'O3' (apex rejects it)")
            elif level in self.exact_levels - {"O0", "O1"}:
                self.draft.notes.append(f"{level} as autocast, by the `{ACCEPT_O2}` setting: fp32 weights, no master copies")
                level = "O1"
            elif level == "O2" and has_optimizers:  # the project may accept it: the reason says how
                self.draft.unsafe_at(call, "O2 keeps fp16 weights with fp32 master copies, where native autocast keeps fp32 weights, "
                                     f"like O1 (`{ACCEPT_O2} = true` in [tool.ampmigrate.settings] accepts that)", among=inits)
            elif level == "O3" and has_optimizers:  # readied for inference: `.half()`, or a marker, says why
                self.draft.unsafe_at(call, "O3 keeps fp16 weights, where native autocast keeps fp32 weights, like O1", among=inits)
        enabled_arg = nodes.argument(call, 2, "enabled")
        enabled = enabled_arg.value if enabled_arg is not None else None
        if isinstance(enabled, cst.Name) and enabled.value == "True":
            enabled = None
        options = scaler_options(call, level in ("O0", "O1") or guard_level)
        for reason in options.unsafe:
            self.draft.unsafe_at(call, reason)
        scaler_args, merges_losses, bounds = options.arguments, options.merges_losses, options.bounds
        dynamic_o0 = None
        if self._o0_scaled_dynamically(call, level, level_arg):
            loss_scale = nodes.argument(call, None, "loss_scale").value
            literal = nodes.literal_string(loss_scale) == "dynamic"
            by_default = self._default_level(level_arg.value) == "O0" and (literal or self._default_level(loss_scale) == "dynamic")
            if guard_level and (literal or nodes.is_pure(loss_scale)) and not by_default:
                dynamic_o0 = "" if literal else nodes.code(loss_scale)  # the level known at run time: an O0 run stops, as O2 does
            elif not (level is None and self._scaled_elsewhere()):
                # a GradScaler made in the other half is on whatever level the run picks: it skips that step too
                self.draft.unsafe_at(call, "O0 with a dynamic loss scale: apex scaled the fp32 loss and skipped a step whose "
                                           "gradients overflowed; the rewrite's scaler is off for O0, so that step is taken")
        restore = None
        # apex hands back the models alone for `optimizers=None` (or none given), else both
        handed_back = optimizers is not None and not nodes.is_none(optimizers.value)
        values = nodes.code(models.value) + (f", {nodes.code(optimizers.value)}" if handed_back else "")
        if isinstance(small, cst.Assign):
            target = nodes.code(small.targets[0].target)
            if self._throwaway_optimizers(small.targets[0].target, optimizers):
                # `model, _ = amp.initialize(model, [], ...)`: what a person writes is `model`
                target, values = nodes.code(small.targets[0].target.elements[0].value), nodes.code(models.value)
            elif optimizers is not None and len(elements := getattr(small.targets[0].target, "elements", ())) == 2:
                # `models, optimizer = amp.initialize([encoder, model], optimizer)`: only `models = [encoder, model]` changes
                (model_target, model_given), (optimizer_target, optimizer_given) = ((nodes.code(kept.value), nodes.code(given.value)) for kept, given in zip(elements, (models, optimizers)))
                if normal(optimizer_target) == normal(optimizer_given) and "*" not in model_target:
                    target, values = model_target, model_given
                elif normal(model_target) == normal(model_given) and level in ("O0", "O1") and "*" not in optimizer_target:
                    target, values = optimizer_target, optimizer_given  # (O3's `.half()` goes on the model's part)
            if not same_places(target, values):
                restore = f"{target} = {values}"
        elif isinstance(small, cst.Return):
            restore = f"return {values}"  # under O1 initialize hands back what it was given
        model_codes = self._codes(models.value)
        if isinstance(small, cst.Assign):
            target = small.targets[0].target
            if optimizers is not None and isinstance(target, (cst.Tuple, cst.List)) and target.elements:
                target = target.elements[0].value
            model_codes |= self._codes(target)
        model_codes |= self._stored_on_self(statement, model_codes)
        model_codes |= self.tree.models_wrapped(self.tree.owner_class(self.tree.function(statement)), model_codes)
        on_self = any(code.startswith("self.") for code in model_codes)
        level_expression = level_arg.value if level is None and level_arg is not None else None
        return InitializeSite(call, statement, level, level_expression, guard_level, enabled, scaler_args, restore,
                           model_codes, on_self, inference=not has_optimizers, merges_losses=merges_losses,
                           dynamic_o0=dynamic_o0, scale_bounds=bounds)

    def possible_levels(self, expression: cst.BaseExpression, depth: int = 0) -> set[str] | None:
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
            body, orelse = self.possible_levels(expression.body, depth + 1), self.possible_levels(expression.orelse, depth + 1)
            return body | orelse if body is not None and orelse is not None else None
        if isinstance(expression, cst.Name) and expression.value in self.tree.assigned:
            found: set[str] = set()
            for value in self.tree.assigned[expression.value]:
                levels = self.possible_levels(value, depth + 1)
                if levels is None:
                    return None
                found |= levels
            return found
        if isinstance(expression, cst.Attribute) and self.tree.choices.get(expression.attr.value):
            return set(self.tree.choices[expression.attr.value])
        return None

    def _default_level(self, expression: cst.BaseExpression) -> str | None:
        """The argparse default of ``args.opt_level`` (or another option), when the file gives one."""
        return self.tree.defaults.get(expression.attr.value) if isinstance(expression, cst.Attribute) else None

    def _set_elsewhere(self, expression: cst.BaseExpression) -> str | None:
        """Where the project sets the option ``args.amp_level`` reads to a level not kept exactly
        (``configs/config.py:229: O2``), when the file gives it no default of its own; a command
        line the project ships (``scripts/train.sh:4: O2``) overrides that default too."""
        place = self.context.levels_elsewhere.get(expression.attr.value) if isinstance(expression, cst.Attribute) else None
        if place is None or place.rsplit(": ", 1)[-1] in self.exact_levels:
            return None
        return place if expression.attr.value not in self.tree.defaults or on_a_command_line(place) else None

    def _stored_on_self(self, statement: cst.CSTNode, models: set[str]) -> set[str]:
        """``self.model = model`` (or ``self.model, self.opt = model, opt``) in the function that
        initializes ``model``: other methods of the class run the model as ``self.model``."""
        function = self.tree.function(statement)
        if function is None or self.tree.owner_class(function) is None:
            return set()
        stored: set[str] = set()
        for line in function.body.body:
            for assign in getattr(line, "body", ()) if isinstance(line, cst.SimpleStatementLine) else ():
                if not isinstance(assign, cst.Assign):
                    continue
                for target_node in assign.targets:
                    target, value = target_node.target, assign.value
                    pairs = [(target, value)]
                    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)) and len(target.elements) == len(value.elements):
                        pairs = [(t.value, v.value) for t, v in zip(target.elements, value.elements)]
                    stored |= {nodes.code(t) for t, v in pairs if isinstance(t, cst.Attribute) and nodes.code(v) in models}
        return stored

    @staticmethod
    def _codes(expression: cst.BaseExpression) -> set[str]:
        """The source of each model in a ``models`` argument or target: one, or a list of them."""
        if isinstance(expression, (cst.List, cst.Tuple)):
            return {nodes.code(element.value) for element in expression.elements}
        return {nodes.code(expression)}

    def plan_initialize(self, init: InitializeSite, hoist: cst.If | None, reinitialize: bool = False, again: bool = False) -> None:
        """The scaler made where ``init`` was (before ``hoist``, enabled by its test); ``reinitialize``:
        made afresh later in its function; ``again``: in another function, its stand-in made once."""
        lines: list[str] = []
        if (self.setup.stand_in == "module") and not reinitialize and not again:
            StandInPlanning(self.context).plan_module_stand_in(init)
        if not self.setup.o0:
            if self.setup.scope == "global" and not reinitialize:
                lines.append(f"global {self.setup.scaler}")
            lines += [] if reinitialize else self.run_time_checks(init, hoist)
            enabled = self._enabled_expression(init, hoist)
            # made before `hoist`, an option read at run time is read where the flag holds, as apex read it
            arguments = init.scaler_args if hoist is None else read_where(init.scaler_args, conjunction(self._flags(init, hoist)))
            options = ['"cuda"', *arguments, *([f"enabled={enabled}"] if enabled else [])]
            line = f"{self.setup.scaler} = torch.amp.GradScaler({', '.join(options)})"
            room = self.tree.line_limit - self.tree.line_indent(hoist or init.statement)
            if len(line) > room:  # one option a line, as a formatter would put them
                if enabled:
                    parts = self._enabled_parts(init, hoist)
                    options[-1] = "enabled=" + fitted_conjunction(parts, room - len("    enabled=,"), depth=4)
                line = f"{self.setup.scaler} = torch.amp.GradScaler(\n" + "".join(f"    {option},\n" for option in options) + ")"
            lines.append(line)
            lines += [extra + line[len(self.setup.scaler):] for extra in self.setup.extra_scalers]  # one per loss id
        elif self.setup.scaler is not None:
            if self.setup.scope == "global" and not reinitialize:
                lines.append(f"global {self.setup.scaler}")
            lines.append(f'{self.setup.scaler} = torch.amp.GradScaler("cuda", enabled=False)  # O0 scales nothing; its state is saved and loaded')
        if hoist is None:
            if init.restore:
                lines.append(init.restore)
            new = nodes.parse_statements("\n".join(lines) + "\n", self.tree.module, self.tree.indent_unit(init.statement)) if lines else []
            if not new:
                self.draft.replace(init.statement, cst.RemoveFromParent())
                self.draft.kind(init.statement, INITIALIZE, "`amp.initialize` is apex mixed precision", self._initialize_fix())
                return
            new[0] = nodes.with_inner_comments_above(nodes.with_leading(new[0], init.statement), init.statement)
            new[-1] = nodes.with_trailing_comment(new[-1], init.statement)
            self.draft.replace(init.statement, cst.FlattenSentinel(new) if len(new) > 1 else new[0])
            self.draft.kind(init.statement, INITIALIZE, "`amp.initialize` is apex mixed precision", self._initialize_fix())
            return
        new = nodes.parse_statements("\n".join(lines) + "\n", self.tree.module, self.tree.indent_unit(hoist))
        fix = self._initialize_fix() + ", enabled by the same flag, before the `if`"
        rest = [s for s in hoist.body.body if s is not init.statement and not isinstance(self.draft.replacements.get(id(s), (None, None))[1], cst.RemovalSentinel)]
        orelse = None if only_module_fallbacks(self.tree, self.sites, hoist.orelse) else hoist.orelse  # `else: amp = None`
        if not rest and orelse is None and init.restore is None:
            # The `if` held nothing else that stays: it goes, and its test is evaluated once, as before.
            self.draft.replace(hoist, cst.FlattenSentinel([nodes.with_leading(new[0], hoist), *new[1:]]))
            self.draft.kind(hoist, INITIALIZE, "`amp.initialize` is apex mixed precision", fix)
            return
        # The `if` is rebuilt behind the scaler; fixes planned inside it go along (`_compose_nested`).
        restored = nodes.parse_statements(init.restore + "\n", self.tree.module)[0] if init.restore else None
        inner = [restored if s is init.statement else s for s in hoist.body.body if s is not init.statement or restored]
        kept = hoist.with_changes(leading_lines=(), body=hoist.body.with_changes(body=inner or [cst.SimpleStatementLine([cst.Pass()])]),
                                  orelse=orelse)
        self.draft.replace(hoist, cst.FlattenSentinel([nodes.with_leading(new[0], hoist), *new[1:], kept]))
        self.draft.kind(hoist, INITIALIZE, "`amp.initialize` is apex mixed precision", fix)

    def _enabled_expression(self, init: InitializeSite, hoist: cst.If | None) -> str | None:
        return conjunction(self._enabled_parts(init, hoist))

    def _enabled_parts(self, init: InitializeSite, hoist: cst.If | None) -> list[str]:
        parts = self._flags(init, hoist)
        if init.level_expression is not None and self._pinned_level(init, hoist) is None:
            parts.append(f'{operand(init.level_expression)} != "O0"')
        return parts

    def _pinned_level(self, init: InitializeSite, hoist: cst.If | None) -> str | None:
        """The opt level a condition of ``initialize`` fixes (``if cfg.level == "O1":``), where
        the rewrite keeps it exactly: then nothing else about the level need be tested."""
        if init.level_expression is None:
            return None
        level = re.escape(operand(init.level_expression).replace(" ", ""))
        for flag in (part for flag in self._flags(init, hoist) for part in re.split(r"\s+and\s+", flag.strip("()"))):
            found = re.fullmatch(rf'\(?{level}==(["\'])(O\d)\1\)?|\(?(["\'])(O\d)\3=={level}\)?', flag.replace(" ", ""))
            pinned = found and (found.group(2) or found.group(4))
            if pinned and pinned in self.exact_levels and pinned != "O0":
                return pinned
        return None

    def run_time_checks(self, init: InitializeSite, hoist: cst.If | None) -> list[str]:
        """Lines stopping a run that the rewrite would not reproduce: a computed O2/O3 opt level.
        O0/O1 are exact, whatever their loss scale, so nothing else stops."""
        if not init.guard_level or self._pinned_level(init, hoist) is not None:
            return []
        level = operand(init.level_expression)
        exact = sorted(self.exact_levels)
        names = " and ".join([", ".join(exact[:-1]), exact[-1]])
        missing = "/".join(sorted({"O2", "O3"} - self.exact_levels))
        after, last = f": migrated from apex for {names}; ", f'"native torch.amp has no {missing}"'
        if any(char in level for char in '"\\\n'):  # `cfg["opt_level"]` cannot sit in an f-string before 3.12
            first, applied = f'"opt_level %r{after}"', f" % ({level},)"
        else:
            first, applied = f'f"opt_level {{{level}!r}}{after}"', ""
        levels = ", ".join(f'"{name}"' for name in exact)
        room = self.tree.line_limit - self.tree.line_indent(hoist or init.statement)
        # `level != "O0"` around `initialize` goes without saying beside `level not in ("O0", "O1")`
        implied = {f'{level}!="O0"', f"{level}!='O0'", f'"O0"!={level}', f"'O0'!={level}"}
        flags = [flag for flag in self._flags(init, hoist) if flag.replace(" ", "") not in {c.replace(" ", "") for c in implied}]
        condition = fitted_conjunction([*flags, f"{level} not in ({levels})"], room - len("if :"))
        line = f"    raise RuntimeError({first[:-1]}{last[1:]}{applied})"
        if len(line) <= room:
            lines = [f"if {condition}:", line]
        else:  # the message over two lines, or three where the opt level's expression is long
            pieces = [first, last]
            if len(first) + 8 > room:
                pieces = [first[: first.index(": ") + 2] + '"', f'"{after[2:]}"', last]
            lines = [f"if {condition}:", "    raise RuntimeError(", *(f"        {piece}" for piece in pieces[:-1]),
                     f"        {pieces[-1]}{applied}", "    )"]
        if init.dynamic_o0 is not None:  # apex scaled the fp32 loss and skipped overflowing steps
            scale = [f'{init.dynamic_o0} == "dynamic"'] if init.dynamic_o0 else []  # "": `loss_scale="dynamic"` itself
            dynamic = fitted_conjunction([*self._flags(init, hoist), f'{level} == "O0"', *scale], room - len("if :"))
            lines += [f"if {dynamic}:", "    raise RuntimeError(", '        "opt_level O0 with a dynamic loss scale: migrated from apex without it; "',
                      '        "apex scaled the fp32 loss, the GradScaler is off for O0"', "    )"]
        return lines

    def _flags(self, init: InitializeSite, hoist: cst.If | None) -> list[str]:
        """The run-time conditions under which apex was initialized at all."""
        parts = []
        if hoist is not None:
            parts.append(as_bool(hoist.test, self.tree.boolean_options))
        if init.enabled is not None:
            parts.append(as_bool(init.enabled, self.tree.boolean_options))
        return parts

    def hoist_guard(self, init: InitializeSite, sites: list[cst.CSTNode], scaler: str, scope: str,
                     stand_in: str | None) -> tuple[cst.If | None, str | None, bool]:
        """The ``if flag:`` whose body holds initialize, when the scaler must exist outside it.

        Moved before the ``if`` as ``GradScaler(enabled=flag)``, the scaler exists on every path
        and does nothing where apex was not initialized. Where no such ``if`` can move: the
        disabled scaler that stands in until the block has run (``stand_in``), or whether the
        scaler is made in the block, its users asking whether it exists (the last of the three).
        """
        block = self.tree.parent.get(id(init.statement))
        owner = self.tree.parent.get(id(block))
        if isinstance(owner, (cst.FunctionDef, cst.Module)) or isinstance(block, cst.Module) \
                or body_through_withs(self.tree.parent, init.statement) is not None:
            return None, stand_in, False  # `with` blocks always run their body
        if isinstance(owner, cst.ClassDef):
            raise Unplannable(init.call, "`amp.initialize` runs in a class body, where its methods cannot see a scaler")
        if all(self.tree.inside(site, block) for site in sites):
            return None, stand_in, False  # the scaler is only used where it exists
        # `if amp: level = "O1"; amp.initialize(..., opt_level=level)`: the block sets what the
        # call reads, so the scaler cannot be made before the `if`
        body = list(block.body)
        set_before = set().union(*(assigned_names(s) for s in body[: body.index(init.statement)])) if init.statement in body else set()
        options = [arg.value for position, arg in enumerate(init.call.args)
                   if (arg.keyword is None and position >= 2) or (arg.keyword is not None and arg.keyword.value not in ("models", "optimizers"))]
        reads_block = any(set_before & read_names(option) for option in options)  # the scaler is made from the options
        flag = flag_if(self.tree, init.statement, self.sites.calls["initialize"])
        # `def _wrap_model(self, model, training=True): if self.use_apex and training:`: a test of
        # a parameter itself may differ from call to call (evaluation passes False), where a
        # scaler made before the `if` would be made again, disabled, over the live one (a setting
        # read from one, `args.fp16`, is the run's)
        per_call = scope != "local" and flag is not None and tests_a_parameter(self.tree, flag)
        # a local made before the `if` set in another block (`else:` of `if torch.cuda.device_count()
        # > 1:`) that its users are not all in would not exist on the other paths (an `initialize`
        # in every arm makes one in each: `several_initialize`; an attribute has its stand-ins)
        unchecked = scope != "local" or len(self.sites.calls["initialize"]) > 1 or flag is None
        reaches = unchecked or body_through_withs(self.tree.parent, flag) is not None or all(
            self.tree.inside(site, self.tree.parent.get(id(flag))) for site in sites)
        if flag is not None and not reads_block and not per_call and reaches:
            alone = len(block.body) == 1 and init.restore is None and flag.orelse is None
            if nodes.is_pure(flag.test) or alone:
                return flag, stand_in, False
        # A run-once guard (`if not self.initialized:`), an elif, a loop or a try: the scaler is
        # created where apex was initialized. apex needed that to have run before any scale_loss,
        # but the forward pass may run on paths where it did not, so autocast cannot ask the
        # scaler whether it is on.
        if scope in ("global", "module") and self.tree.import_anchor() is not None:
            return None, "module", False  # disabled at module level until the block has run
        if stand_in in ("init", "class"):
            return None, stand_in, False  # `__init__` (or the class) makes a disabled scaler that stands in until this block runs
        if scope == "local":
            return None, "local", False  # a disabled one is made at the top of the function
        if not scaler.startswith("self."):
            # A local created in the block may not exist where autocast asks it.
            raise Unplannable(init.call, "`amp.initialize` runs inside a block (a run-once guard, an elif, a loop "
                               "or a try) that the code using the scaler is not in")
        self.draft.unsafe.append(
            "the scaler is created where `amp.initialize` ran, inside a block; its users assume that ran first "
            "(as apex did); autocast is on only where it did"
        )
        return None, stand_in, True

    def _throwaway_optimizers(self, target: cst.BaseExpression, optimizers: cst.Arg | None) -> bool:
        """``model, _ = amp.initialize(model, [])``: no optimizer given, its empty result bound to
        ``_``, which nothing in the file reads (``for _ in range(n)`` elsewhere only binds it)."""
        if not (isinstance(target, cst.Tuple) and len(target.elements) == 2 and optimizers is not None
                and isinstance(optimizers.value, (cst.List, cst.Tuple)) and not optimizers.value.elements):
            return False
        second = target.elements[1].value
        if not (isinstance(second, cst.Name) and second.value == "_"):
            return False
        return not self.tree.per_scope(("reads of _",), lambda: any(
            isinstance(node, ast.Name) and node.id == "_" and isinstance(node.ctx, ast.Load)
            for node in ast.walk(ast.parse(self.tree.module.code))))

    def _o0_keeps_state(self, init: InitializeSite) -> bool:
        """O0 with ``amp.state_dict``/``load_state_dict``: a disabled GradScaler stands in (its
        state is empty, as O0 scaled nothing), created where ``initialize`` ran, on every path."""
        states = self.sites.calls["state_dict"] + self.sites.calls["load_state_dict"]
        return bool(states) and isinstance(self.tree.parent.get(id(init.statement)), (cst.IndentedBlock, cst.Module)) and not isinstance(
            self.tree.parent.get(id(self.tree.parent.get(id(init.statement)))), (cst.If, cst.Else, cst.For, cst.While, cst.With, cst.Try))

    def free_scaler_name(self) -> str:
        return next((name for name in (*SCALER_NAMES, "amp_grad_scaler") if name not in self.tree.names), "amp_grad_scaler_")

    def scaler_name(self, init: InitializeSite | None, sites: list[cst.CSTNode]) -> tuple[str | None, str, str | None]:
        """The GradScaler's name, where it lives, and "init" where a disabled one is made in
        ``__init__`` until the method that makes it has run ("class": as a class attribute)."""
        name = self.free_scaler_name()
        if init is None:
            return name, "module", None
        if init.level == "O0" and not self._o0_keeps_state(init):
            return None, "none", None
        function = self.tree.function(init.statement)
        if function is not None and self.tree.first_param(function) == "self":
            # Methods of one class share the scaler as an attribute, where the class holds the
            # model, or where it exists from the object's construction (made there, or a
            # disabled one standing in from `__init__`); else a module global stands in.
            owner = self.tree.owner_class(function)
            if owner is not None and all(self.tree.owner_class(self.tree.function(site)) is owner and self.tree.first_param(self.tree.function(site)) == "self" for site in sites):
                attribute = next(name for name in (*SCALER_NAMES, "amp_grad_scaler") if name not in self.tree.attributes)
                stand_ins = StandInPlanning(self.context)
                if stand_ins.runs_at_construction(function, owner):
                    return f"self.{attribute}", "self", None
                if stand_ins.class_stand_in(owner, init):
                    return f"self.{attribute}", "self", "class"  # no `__init__` of its own
                if init.on_self or stand_ins.init_can_stand_in(owner):
                    return f"self.{attribute}", "self", "init" if stand_ins.default_in_init(owner, function, init) else None
        if all(self.tree.function(site) is function for site in sites):
            return name, "local", None
        if function is None:
            return name, "module", None
        return name, "global", None
