"""``amp.scale_loss`` and the optimizer steps that follow it: ``scaler.scale``, ``scaler.step``, ``scaler.update``."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate import grad_readers
from migrate.apex_plan.conditions import StepConditions, in_failing_arm, never_runs, where_absent
from migrate.apex_plan.context import Context, Step
from migrate.apex_plan.gradients import GradientPlanning
from migrate.apex_plan.hidden_readers import updates_otherwise
from migrate.apex_plan.fresh_losses import fresh_loss, refusal
from migrate.apex_plan.native_scalings import natively_scaled
from migrate.apex_plan.gradient_guards import plan_gradient_guards
from migrate.apex_plan.per_loss import loss_id_of
from migrate.apex_plan.step_sites import accumulates, steps_after, steps_each, steps_in, steps_in_file, steps_of_callers
from migrate.apex_plan.skipped_backwards import backward_runs_before
from migrate.apex_plan.syntax import (
    ReplaceByIdentity,
    assigned_names,
    backward_calls,
    final_exits,
    loop_exit,
)
from migrate.apex_plan.vocabulary import (
    EACH,
    HOLDS_GRADIENTS,
    HOLDS_GRADIENTS_EACH,
    PLAIN_STEP_MARK,
    PLAIN_STEP_REASON,
    SCALE_LOSS,
    SCALE_LOSS_KEYWORDS,
    TRANSPARENT,
    ScaleLossSite,
    Unplannable,
    alias_present,
    attribute_set,
    either,
    normal,
    update_lines,
)
from migrate.rule import Replacement
from migrate.step_model.shapes import parameters_of
from migrate.tree_walk import descendants


class StepPlanning(Step):
    """``amp.scale_loss`` and the optimizer steps that follow it: ``scaler.scale``, ``scaler.step``, ``scaler.update``.

    It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the ``Draft``.
    """

    def __init__(self, context: Context) -> None:
        super().__init__(context)
        self.gradients = GradientPlanning(context)
        self.conditions = StepConditions(context)

    def read_scale_loss(self, call: cst.Call) -> ScaleLossSite:
        item = self.tree.parent.get(id(call))
        statement = self.tree.parent.get(id(item))
        if not (isinstance(item, cst.WithItem) and isinstance(statement, cst.With) and item.item is call):
            raise Unplannable(call, "`amp.scale_loss` is not used as a `with` statement (it is entered by hand or returned)")
        if len(statement.items) != 1 or statement.asynchronous is not None:
            raise Unplannable(call, "`amp.scale_loss` shares its `with` statement with other context managers")
        if item.asname is None or not isinstance(item.asname.name, cst.Name):
            raise Unplannable(call, "`amp.scale_loss` does not bind the scaled loss to a name")
        if nodes.has_star(call):
            raise Unplannable(call, "`amp.scale_loss` takes `*args`/`**kwargs`")
        unknown = nodes.keyword_names(call) - SCALE_LOSS_KEYWORDS
        if unknown:
            raise Unplannable(call, f"`amp.scale_loss` has arguments apex does not take: {sorted(unknown)!r}")
        loss = nodes.argument(call, 0, "loss")
        optimizers = nodes.argument(call, 1, "optimizers")
        if loss is None or optimizers is None:
            raise Unplannable(call, "`amp.scale_loss` is called without a loss and an optimizer")
        fresh = fresh_loss(self.tree, statement, loss.value)
        if fresh is not None:
            raise Unplannable(call, refusal(fresh))
        delay_check = nodes.argument(call, None, "delay_overflow_check")
        if delay_check is not None and nodes.code(delay_check.value) not in ("False", "0"):
            self.draft.unsafe.append("`delay_overflow_check` has no native equivalent")
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
            footer = [line for line in body.footer if line.comment]  # `#loss.backward()` after the last line
            if footer:
                last = statements[-1]
                statements[-1] = last.with_changes(leading_lines=[*last.leading_lines, *footer])
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
        return ScaleLossSite(call, statement, loss.value, listed, scaled, backward_args, statements, loss_id_of(call))

    def _read_elsewhere(self, name: str, statement: cst.With) -> bool:
        """Whether ``name`` (the scaled loss) is used outside every ``with amp.scale_loss`` of its function."""
        scope = self.tree.function(statement) or self.tree.module
        withs = self.sites.scale_loss_statements
        return self.tree.per_scope(("read elsewhere", id(scope), name, withs), lambda: any(
            not self.tree.inside_any(node, withs) for node in self._names_in(scope).get(name, ())))

    def _names_in(self, scope: cst.CSTNode) -> dict[str, list[cst.Name]]:
        """The names in ``scope``, by identifier."""
        def names() -> dict[str, list[cst.Name]]:
            found: dict[str, list[cst.Name]] = {}
            for node in descendants(scope):
                if type(node) is cst.Name:
                    found.setdefault(node.value, []).append(node)
            return found

        return self.tree.per_scope(("names", id(scope)), names)

    def _backwards_in(self, scope: cst.CSTNode) -> list[cst.Call]:
        """``backward_calls(scope, nested=True)``, worked out once per scope."""
        return self.tree.per_scope(("backwards", id(scope)), lambda: backward_calls(scope, nested=True))

    def plan_scale_loss(self, scale: ScaleLossSite) -> None:
        loss = nodes.code(scale.loss)
        if isinstance(scale.loss, (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp, cst.Lambda)):
            loss = f"({loss})"
        scaled = loss if self.setup.o0 else f"{self.scaler_of(scale.call)}.scale({nodes.code(scale.loss)})"
        if scale.backward_args is not None:
            args = ", ".join(nodes.code(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT)).strip() for arg in scale.backward_args)
            new = nodes.parse_statements(f"{scaled}.backward({args})\n", self.tree.module)[0]
            self.draft.replace(scale.statement, self._keep_comments(new, scale.statement))
            return
        first = nodes.parse_statements(f"{scale.scaled_name} = {scaled}\n", self.tree.module)[0]
        header = getattr(scale.statement.body, "header", None)
        if header is not None and header.comment:  # `with amp.scale_loss(...) as scaled:  # apex`
            first = first.with_changes(trailing_whitespace=header)
        self.draft.replace(scale.statement, cst.FlattenSentinel([nodes.with_leading(first, scale.statement), *scale.body]))

    @staticmethod
    def _keep_comments(new: cst.SimpleStatementLine, statement: cst.With) -> cst.SimpleStatementLine:
        """The one-line replacement of a ``with`` keeps the comments that were on and in it."""
        leading = list(statement.leading_lines)
        trailing = new.trailing_whitespace
        body = statement.body
        if isinstance(body, cst.IndentedBlock):
            inner = body.body[0]
            leading += [line for line in (*inner.leading_lines, *body.footer) if line.comment]
            trailing = body.header if body.header.comment else inner.trailing_whitespace
            if body.header.comment and getattr(inner, "trailing_whitespace", trailing).comment:  # both kept: the inner one above
                leading.append(cst.EmptyLine(comment=inner.trailing_whitespace.comment))
        elif body.trailing_whitespace.comment:
            trailing = body.trailing_whitespace
        return new.with_changes(leading_lines=leading, trailing_whitespace=trailing)

    def plan_steps(self, scale: ScaleLossSite, optimizer: cst.BaseExpression) -> list[tuple[cst.SimpleStatementLine, int, str | None]]:
        """Where ``optimizer.step()`` follows the scaled backward, and the test it must keep, if any."""
        wanted = nodes.code(optimizer)
        other = updates_otherwise(self.tree.function(scale.statement) or self.tree.module, wanted)
        if other is not None:
            raise Unplannable(other, f"`{nodes.code(other.func)}()` uses the gradients, which apex had unscaled; "
                                     "GradScaler unscales them for `step()` only")
        current: cst.CSTNode = scale.statement
        conditions: list[str | None] = []  # the tests of the branches climbed out of
        passed: list[tuple[list[cst.BaseStatement], list[str | None]]] = []  # run between the backward and the step
        while True:
            block = self.tree.parent.get(id(current))
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                break
            body = list(block.body)
            found: list[tuple[cst.SimpleStatementLine, int]] = []
            between: list[cst.BaseStatement] = []
            for sibling in body[body.index(current) + 1 :]:
                found = steps_in(sibling, wanted)
                if found:
                    break
                between.append(sibling)
            passed.append((between, list(conditions)))
            if found:
                self._no_closure(found)
                if any(self.tree.in_handler(line, scale.statement) for line, _ in found):
                    self.draft.unsafe.append(f"`{wanted}.step()` runs in a `finally:`/`except:`, also where nothing was scaled")
                condition = self.conditions.step_condition(conditions, scale.call, wanted)
                guards = self._gradient_guards(sibling, between, found, scale)
                for guard in guards:
                    self._guard_updates(guard, scale, condition)
                self.gradients.plan_grad_readers(scale, wanted, passed, sibling, found, guards=frozenset(map(id, guards)))
                later, alone = steps_after(body, sibling, wanted)  # `if accumulating and boundary:` step, then `if not accumulating:`
                if not alone:
                    self.draft.unsafe.append(f"`{wanted}.step()` runs again at line {self.tree.line(later[0][0])}: where both steps run "
                                             "after one backward pass, the second unscales the gradients again")
                self._no_closure(later)
                return [(line, index, self.conditions.step_condition(conditions, scale.call, wanted, at=line)) for line, index in found + later]
            owner = self.tree.parent.get(id(block))
            if isinstance(owner, (cst.If, cst.Else)):
                conditions.append(self.conditions.branch_condition(owner))
            elif not isinstance(owner, TRANSPARENT) and not accumulates(owner, wanted, conditions):
                break
            while isinstance(owner, (cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally)) or (
                isinstance(self.tree.parent.get(id(owner)), (cst.If, cst.Else)) and isinstance(owner, cst.If)
            ):
                owner = self.tree.parent.get(id(owner))
            current = owner
        stepped = {wanted: steps_in_file(self.tree.module, wanted)}
        if not stepped[wanted]:
            # a helper handed the optimizer (`def loss_backwards(loss, optimizer)`): its callers step
            # what they hand it (`loss_backwards(loss, opt)`, then `opt.step()`)
            stepped = steps_of_callers(self.tree, self.tree.function(scale.statement), wanted)
        anywhere = [hit for hits in stepped.values() for hit in hits]
        self._no_closure(anywhere)
        if not anywhere:
            raise Unplannable(scale.call, f"no `{wanted}.step()` follows `amp.scale_loss`, so the scaler cannot step the optimizer")
        name_of = {id(line): name for name, hits in stepped.items() for line, _ in hits}
        # Every `optimizer.step()` of the file then goes through the scaler: right as long as no
        # backward pass of the file skips the scaler while it is enabled.
        # what received the scaler (`self.amp = scaler if use_amp else None`) is None where apex was
        # off: a backward there stays plain, and the steps ask for it as the scaled backward did
        alias = self.sites.alias_of.get(id(scale.call))
        present = [alias_present(alias)] if alias else []
        plains = [plain for plain in self.plain_backwards() if not (alias and where_absent(self.tree, plain, alias))]
        if plains:
            self.draft.unsafe.append(
                f"`{wanted}.step()` is not next to `amp.scale_loss`, and apex left the backward pass at line {self.tree.line(plains[0])} "
                "unscaled: the rewrite scales it, as every `{wanted}.step()` in the file goes through the scaler".replace("{wanted}", wanted)
            )
            for plain in plains:
                self._scale_plain_backward(plain, scale)
        if any(self.tree.in_handler(line, scale.statement) for line, _ in anywhere):
            self.draft.unsafe.append(f"`{wanted}.step()` runs in a `finally:`/`except:`, also where nothing was scaled")
        if any(self.tree.exclusive(line, scale.statement) and not self._scaled_before(line, name_of[id(line)]) for line, _ in anywhere):
            self.draft.unsafe.append(f"a `{wanted}.step()` sits in another branch than the scaled backward: it may run before anything is scaled")
        # a step no backward pass surely comes before (a threshold test around it, a helper
        # returning early) asks whether its optimizer holds gradients, as `scaler.step` raises otherwise
        ways = {id(line): present if backward_runs_before(self.tree, line) else [*present, None] for line, _ in anywhere}
        for line, index in anywhere:
            name = name_of[id(line)]
            condition = self.conditions.step_condition(ways[id(line)], scale.call, name, skipped=line)
            container = self.tree.function(line) or self.tree.module
            guards = self._gradient_guards(*self._top_statement(container, line), [(line, index)], scale)
            for guard in guards:
                self._guard_updates(guard, scale, condition)
            self.gradients.plan_grad_readers(scale, name, [], container, [(line, index)], stepped[name],
                                             guards=frozenset(map(id, guards)), present=tuple(present))
        return [(line, index, self.conditions.step_condition(ways[id(line)], scale.call, name_of[id(line)], at=line, skipped=line))
                for line, index in anywhere]

    def _guard_updates(self, guard: cst.If, scale: ScaleLossSite, condition: str | None) -> None:
        """The scaler's ``update()`` after a gradient guard, under the test of the scaled backward
        passes that lead to it (both arms': either)."""
        known = self.draft.gradient_guards.get(id(guard))
        merged = condition if known is None else either(known[2], condition)
        self.draft.gradient_guards[id(guard)] = (guard, self.scaler_of(scale.call), merged)

    def _top_statement(self, container: cst.CSTNode, line: cst.CSTNode) -> tuple[cst.CSTNode, list[cst.BaseStatement]]:
        """The statement of ``container``'s own body holding ``line``, and those before it."""
        body = list(container.body.body if isinstance(container, cst.FunctionDef) else container.body)
        top = next(node for node in (line, *self.tree.ancestors(line)) if any(node is s for s in body))
        return top, body[:body.index(top)]

    def _gradient_guards(self, sibling: cst.CSTNode, between: list[cst.BaseStatement],
                         found: list[tuple[cst.SimpleStatementLine, int]], scale: ScaleLossSite) -> list[cst.If]:
        """``norm = clip_grad_norm_(...); if math.isfinite(norm): opt.step()``: the ``if``s on the
        way from ``sibling`` down to the steps that skip them on a test of what was read from the
        gradients after this backward (control dependent on a gradient reader, not on a counter).
        Where apex skipped the step on an overflow and lowered the scale as ``scale_loss`` exited,
        natively ``unscale_`` before the read and ``update()`` after the ``if`` do it whichever
        arm runs; the arms may not end the iteration or scale again, or the update would be
        skipped or come too late."""
        guards: list[cst.If] = []
        for line, _ in found:
            node = self.tree.parent.get(id(line))
            while node is not None:
                if isinstance(node, cst.If):
                    top = self.tree.chain_top(node)
                    if not any(top is guard for guard in guards):
                        holder = self.tree.parent.get(id(top))
                        body = list(getattr(holder, "body", ()))
                        at = next((i for i, statement in enumerate(body) if statement is top), len(body))
                        before = between if top is sibling else body[:at]
                        kind = self._tests_gradients_read(top, before, scale)
                        if kind == "exact":
                            guards.append(top)
                        elif kind == "inexact":
                            self.draft.inexact_gradient_guards[id(top)] = top
                if node is sibling:
                    break
                node = self.tree.parent.get(id(node))
        return guards

    def _tests_gradients_read(self, branch: cst.If, before: list[cst.BaseStatement], scale: ScaleLossSite) -> str | None:
        """Whether ``branch`` tests what a gradient reader before it assigned: "exact" where that
        reader is a statement of the block (``norm = clip_grad_norm_(...)``) or an ``if`` of it
        (``if args.clip > 0: norm = ...``) and no arm scales again or ends the iteration but at
        its end (``else: return False``): ``unscale_`` before the reader and ``update()`` after
        the ``if``, or before each arm's exit, keep apex's scale whichever way the test goes;
        "inexact" where not; None where the test is on something else (a counter: accumulation)."""
        tested = {node.value for node in descendants(branch.test) if type(node) is cst.Name}
        read_into = {target for reader in before if grad_readers.reads_grads(reader) for target in assigned_names(reader)}
        if not read_into & tested:
            return None
        always = {target for reader in before if grad_readers.reads_grads(reader) and (
                      isinstance(reader, cst.SimpleStatementLine)
                      or (isinstance(reader, cst.If) and loop_exit(reader) is None and not self.gradients.scales_again(reader, scale)))
                  for target in assigned_names(reader)}
        if always & tested and final_exits(branch) is not None and not self.gradients.scales_again(branch, scale):
            return "exact"
        return "inexact"

    def plan_gradient_guards(self) -> None:
        """``update()`` after each exact gradient guard, a marker at each inexact one (see ``_gradient_guards``)."""
        plan_gradient_guards(self.draft, self.tree, self.updates)

    def under_gradient_guard(self, line: cst.CSTNode) -> bool:
        return any(self.tree.inside(line, guard) for guard, _, _ in self.draft.gradient_guards.values())

    def _scaled_before(self, line: cst.CSTNode, wanted: str) -> bool:
        """Whether a ``scale_loss`` of ``wanted`` runs before ``line`` in a block holding it
        (``if delayed: scale_loss(delay_unscale=True) else: scale_loss(); opt.step()``)."""
        for call in self.sites.calls["scale_loss"]:
            statement = self.tree.statement(call)
            block = self.tree.parent.get(id(statement))
            optimizers = nodes.argument(call, 1, "optimizers")
            if optimizers is None or normal(nodes.code(optimizers.value)) != normal(wanted) or not self.tree.inside(line, block):
                continue
            body = list(block.body)
            if any(self.tree.inside(line, later) for later in body[body.index(statement) + 1:]):
                return True
        return False

    def plain_backwards(self, beside: cst.CSTNode | None = None) -> list[cst.Call]:
        """Each ``.backward()`` outside ``amp.scale_loss`` that may run while the scaler is
        enabled, in the file's order; with ``beside``, those in its function
        and those in a function of the file it calls (``self._backward(aux)``), where the call can
        run in the same pass (not in another arm, nor where a test around ``beside`` fails:
        ``else:`` of ``if scaler: ... elif use_apex:`` against a later ``elif use_apex:``)."""
        withs = self.sites.scale_loss_statements
        candidates = self.tree.per_scope(
            ("plain backwards", withs, self.setup.guard_tests),
            lambda: [call for call in self._backwards_in(self.tree.module)
                     if not self.tree.inside_any(call, withs) and not in_failing_arm(self.tree, call, self.setup.guard_tests) and not never_runs(self.tree, call)
                     and not self._scales_within(call) and not natively_scaled(self.tree, call)
                     and not self._scaled_by_callers(call) and not self.conditions.warm_up(call)])
        if beside is None:
            return candidates
        scope = self.tree.function(beside) or self.tree.module
        calls = [call for call in nodes.own_code(scope)
                 if type(call) is cst.Call and not self.tree.never_together(call, beside)]
        called = {id(helper) for call in calls if (helper := self.tree.helper(call)) is not None}
        return [call for call in candidates
                if (self.tree.inside(call, scope) and not self.tree.never_together(call, beside))
                or id(self.tree.function(call)) in called]

    def _scaled_by_callers(self, backward: cst.Call) -> bool:
        """``scaled_loss.backward()`` on a parameter every call of its function hands the loss
        ``amp.scale_loss`` scaled (``with amp.scale_loss(loss, opt) as scaled_loss:
        self._backward(scaled_loss)``): the scaled one, not a plain backward to scale again."""
        receiver = backward.func.value if isinstance(backward.func, cst.Attribute) else None
        function = self.tree.function(backward)
        if not isinstance(receiver, cst.Name) or function is None:
            return False
        if receiver.value not in {param.name.value for param in parameters_of(function)}:
            return False
        handed = [(call, self.tree.arguments(function, call).get(receiver.value)) for call in self.tree.calls_of(function)]
        scaled = [isinstance(value, cst.Name) and value.value in self._scaled_names_around(call) for call, value in handed]
        if any(scaled) and not all(scaled):
            raise Unplannable(backward, f"`{nodes.code(backward.func)}()` is handed the loss `amp.scale_loss` scaled by one "
                                        "call and an unscaled one by another: one GradScaler cannot tell them apart")
        return any(scaled)

    def _scaled_names_around(self, node: cst.CSTNode) -> set[str]:
        """The names ``with amp.scale_loss(...) as name:`` binds around ``node``."""
        names = set()
        for call in self.sites.calls["scale_loss"]:
            statement = self.tree.statement(call)
            if isinstance(statement, cst.With) and self.tree.inside(node, statement.body):
                names |= {item.asname.name.value for item in statement.items
                          if item.asname is not None and isinstance(item.asname.name, cst.Name)}
        return names

    def _scale_plain_backward(self, plain: cst.Call, scale: ScaleLossSite) -> None:
        """``loss.backward()`` becomes ``scaler.scale(loss).backward()`` where the step after it goes
        through the scaler: a ``scaler.step`` in an iteration that scaled nothing raises (a disabled
        scaler's ``scale`` hands the loss back). Only where the scaler's name reaches it; the scaler
        of the same loss where an arm beside it scales it (apex's per-loss scalers)."""
        scaler = self.scaler_of(self.tree.scaled_in_another_arm(plain, self.sites.calls["scale_loss"]) or scale.call)
        # `self.scaler` is the same object in the scaling class and in a subclass of it (`class Trainer(BaseTrainer)`)
        owner, scaling = (self.tree.owner_class(self.tree.function(node)) for node in (plain, scale.call))
        same_class = owner is scaling or (owner is not None and any(cls is scaling for cls in self.tree.lineage(owner)))
        # a loss's own arguments are keywords (`retain_graph=True`, `**kwargs`); `engine.backward(loss)` is no tensor's
        by_keyword = all(arg.keyword is not None or arg.star for arg in plain.args)
        if (isinstance(plain.func, cst.Attribute) and by_keyword and id(plain) not in self.draft.replacements
                and (not scaler.startswith("self.") or same_class)):
            loss = nodes.code(plain.func.value)
            scaled = f"{scaler}.scale({loss})"
            if self.setup.in_block or scaler in self.sites.alias_of.values():  # may be missing: ask, as its steps do
                present = alias_present(scaler) if scaler in self.sites.alias_of.values() else attribute_set(scaler)
                scaled = f"({scaled} if {present} else {loss})"
            # its arguments stay (`loss.backward(**kwargs)`, `retain_graph=True`)
            self.draft.replace(plain, plain.with_changes(func=plain.func.with_changes(value=nodes.parse_expression(scaled, self.tree.module))))
            self.draft.kind(plain, SCALE_LOSS, "a backward pass beside `amp.scale_loss` is not scaled",
                            f"Use `{scaler}.scale({loss}).backward()`: its step goes through the scaler")

    def _scales_within(self, call: cst.Call) -> bool:
        """Whether ``call`` is of the file's own helper holding an ``amp.scale_loss`` (``self.backward(loss)``):
        the backward pass it makes is that one, scaled."""
        helper = self.tree.helper(call)
        return helper is not None and any(self.tree.inside(site, helper) for site in self.sites.calls["scale_loss"])

    def _no_closure(self, found: list[tuple[cst.SimpleStatementLine, int]]) -> None:
        for line, index in found:
            if index == EACH:
                continue  # its inner steps were checked by name
            if line.body[index].value.args:
                raise Unplannable(line, "`optimizer.step(closure)`: GradScaler does not support closures")

    def each_step_replacement(self, loop: cst.For, update: bool, condition: str | None, scaler: str) -> Replacement:
        """The loop stepping each optimizer through the scaler, and one ``update()`` after it."""
        if condition is not None and any(test.format(optimizer=nodes.code(loop.iter)) in condition
                                         for test in (HOLDS_GRADIENTS, HOLDS_GRADIENTS_EACH)):
            raise Unplannable(loop, "the optimizers are stepped in a loop under a condition the scaler cannot test again")
        # under the scaled backward's own test (`if self.amp is not None:`): each optimizer steps
        # through the scaler where it holds, plainly else, and the scaler updates once after them
        inner = {id(line): self.step_replacement(line, {index: False}, condition, scaler)
                 for line, index in steps_each(loop, nodes.code(loop.iter))}
        new = loop.visit(ReplaceByIdentity(inner))
        if not update:
            return new
        return cst.FlattenSentinel([new, *self.updates(scaler, condition)])

    def updates(self, scaler: str, condition: str | None) -> list[cst.BaseStatement]:
        """``scaler.update()`` (and apex's bounds of the scale after it), under ``condition`` when given."""
        lines = update_lines(scaler, self.setup.scale_bounds)
        text = "".join(f"{line}\n" for line in lines) if condition is None else f"if {condition}:\n" + "".join(f"    {line}\n" for line in lines)
        return nodes.parse_statements(text, self.tree.module)

    def step_replacement(self, line: cst.SimpleStatementLine, updates: dict[int, bool], condition: str | None, scaler: str) -> Replacement:
        smalls: list[cst.BaseSmallStatement] = []
        for i, small in enumerate(line.body):
            if i not in updates:
                smalls.append(small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT))
                continue
            call = small.value
            args = "".join(f", {nodes.code(arg)}" for arg in call.args)
            optimizer = nodes.code(call.func.value)
            new = [f"{scaler}.step({optimizer}{args})", *(update_lines(scaler, self.setup.scale_bounds) if updates[i] else [])]
            if condition is not None and len(line.body) == 1:
                body = "".join(f"    {text}\n" for text in new)
                plain = nodes.code(small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT))
                # not a test on the backward's own flag, or one joining several paths' tests: the plain
                # step is right by construction, where AMP102 (reading the arms) could take it for one
                # after a scaled backward and step it through a scaler that may be None there
                if HOLDS_GRADIENTS.format(optimizer=optimizer) in condition or isinstance(
                        nodes.parse_expression(condition, self.tree.module), cst.BooleanOperation):
                    plain = f"{PLAIN_STEP_REASON}\n    {plain}  {PLAIN_STEP_MARK}"
                text = f"if {condition}:\n{body}else:\n    {plain}\n"
                return nodes.with_leading(nodes.parse_statements(text, self.tree.module)[0], line)
            if len(line.body) == 1:  # the line keeps its comments; what follows it, its own lines
                statements = nodes.parse_statements("".join(f"{text}\n" for text in new), self.tree.module)
                first = line.with_changes(body=statements[0].body)
                return cst.FlattenSentinel([first, *statements[1:]]) if len(statements) > 1 else first
            smalls += [cst.Expr(nodes.parse_expression(text, self.tree.module)) for text in new if not text.startswith("#")]
        return line.with_changes(body=smalls)
