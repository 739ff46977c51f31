"""Gradients read between the scaled backward and the step, and ``amp.master_params``."""
from __future__ import annotations

import textwrap

import libcst as cst

from migrate import apex_nodes as nodes
from migrate import grad_readers
from migrate.apex_plan.conditions import StepConditions, delayed_unscale, on_delayed_passes, unscaled_there
from migrate.apex_plan.context import Step
from migrate.apex_plan.hidden_readers import helpers_reached, reads_grads
from migrate.apex_plan.optimizer_params import model_parameters
from migrate.apex_plan.syntax import backward_calls, with_first_line_comment
from migrate.apex_plan.vocabulary import (
    EACH,
    MASTER_COPIES,
    MASTER_PARAMS,
    NORM_OF_SCALED_MARK,
    SCALE_AWARE_MARK,
    SCALE_LOSS,
    ScaleLossSite,
    Unplannable,
    alias_present,
)
from migrate.flow.control import Edge, Graph
from migrate.tree_walk import descendants


_COMPOUND = (cst.For, cst.While, cst.With, cst.If)  # statements whose blocks a marker may go into

class GradientPlanning(Step):
    """Gradients read between the scaled backward and the step, and ``amp.master_params``.

    It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the ``Draft``.
    """

    def plan_grad_readers(
        self,
        scale: ScaleLossSite,
        optimizer: str,
        passed: list[tuple[list[cst.BaseStatement], list[str | None]]],
        container: cst.CSTNode,
        steps: list[tuple[cst.SimpleStatementLine, int]],
        every_step: list[tuple[cst.SimpleStatementLine, int]] | None = None,
        guards: frozenset[int] = frozenset(),
        present: tuple[str, ...] = (),
    ) -> None:
        """``scaler.unscale_(optimizer)`` before the first statement reading gradients on the way to the step
        (under ``present`` too: that what received the scaler holds one, where the step asks it).

        apex unscaled when ``scale_loss`` exited, so clipping ``model.parameters()`` or a gradient
        norm taken there saw true gradients; natively they stay scaled until ``unscale_`` or the
        step. Unscaling is only right where the step then always follows: a reader on a path
        that may end without a step (accumulation with the step under ``if boundary:``), or
        between two scaled backward passes, makes the fix unsafe.
        """
        conditions_of = StepConditions(self.context)
        own = grad_readers.own_leaf_tensors(self.tree.function(scale.statement) or self.tree.module)
        holders = frozenset({"self", *self.setup.model_codes})  # what holds the gradients, handed on

        def reads(statement: cst.CSTNode, after_a_backward: bool = True) -> bool:
            """Out of sight too (``hidden_readers``) only after a backward pass: before one, a
            statement handing the model on (``DataParallel(model)``) reads nothing scaled."""
            if not after_a_backward:
                return grad_readers.reads_grads(statement, own)
            return reads_grads(self.tree, statement, holders, self.sites.ids, own)

        found: list[tuple[cst.BaseStatement, str | None]] = []  # (statement, condition)
        among_backwards: set[int] = set()  # readers in a statement that also scales (a loop of micro-batches)
        before_another: set[int] = set()  # readers between two scaled backward passes
        for between, conditions in passed:
            for statement in between:
                if self.scales_again(statement, scale):
                    before_another.update(id(reader) for reader, _ in found)
                    if self._reads_before_another_backward(statement, scale, reads):
                        found.append((statement, conditions_of.step_condition(conditions, scale.call, optimizer)))
                        among_backwards.add(id(statement))
                        before_another.add(id(statement))
                elif reads(statement):
                    found.append((statement, conditions_of.step_condition(conditions, scale.call, optimizer)))
        condition = conditions_of.step_condition([*present, *(passed[-1][1] if passed else [])], scale.call, optimizer)
        inner = self._paths_to_steps(container, steps)
        if len(inner) == 1:
            scaled = bool(passed)  # whether a backward pass ran on the way
            for siblings in reversed(inner[0]):
                for sibling in siblings:
                    if self.scales_again(sibling, None):
                        # read before any backward pass: not between one and the step; read
                        # between two, it saw the first one's gradients (out of sight too: a
                        # regulariser's update before an auxiliary loss's backward)
                        if scaled:
                            before_another.update(id(reader) for reader, _ in found)
                        found, after_one, scaled = found if scaled else [], scaled, True
                        # a loop of micro-batches (in an arm too) reads after its own backward
                        # passes (a closure `limit_norm(0.5)` after `self.backward(loss)`)
                        looped = any(isinstance(node, (cst.For, cst.While)) for node in descendants(sibling, nodes.not_a_definition))
                        if reads(sibling, after_a_backward=after_one or looped):
                            found.append((sibling, condition))
                            among_backwards.add(id(sibling))
                    elif reads(sibling, after_a_backward=scaled):
                        found.append((sibling, condition))
        # Where `scaler.step` and `update()` follow, on the function's control flow: the steps, or
        # a test of the gradients read here (`if isfinite(norm):`), after which the update follows either way.
        # An exception a handler in the loop takes between `unscale_` and the update (the
        # out-of-memory retry loop) would make the next `unscale_` raise: that way counts too.
        graph = self.tree.control_flow(steps[0][0], exceptions=True)
        targets = [line for line, _ in every_step or steps if graph.holds(line)] + [g for g in self._guards(guards) if graph.holds(g)]
        # a reader in an arm that never runs with the scaled backward (the fp32 arm of `if fp16:`) reads what it always read
        found = [(reader, condition) for reader, condition in found if not self.tree.never_together(reader, scale.statement)]
        readers = [(reader, reader_condition, id(reader) not in among_backwards and self._step_follows(graph, reader, targets, scale))
                   for reader, reader_condition in found]
        if len(inner) > 1 and any(reads(s, after_a_backward=False) for path in inner for siblings in path for s in siblings):
            readers.append((container, condition, False))
        # an iteration ended by a jump (not by an exception: apex kept no scale for that either)
        leaving = self._leaves_before_the_step(self.tree.control_flow(steps[0][0], exceptions=False), scale, targets) if passed else None
        if leaving is not None and not on_delayed_passes(self.tree, scale.call, leaving):
            self.draft.unsafe.append(
                f"the iteration may end at line {self.tree.line(leaving)} (`{nodes.code(leaving).strip()}`), after the scaled backward and before "
                f"`{optimizer}.step()`: apex lowered the loss scale after an overflow as `amp.scale_loss` exited; "
                f"natively `{self.scaler_of(scale.call)}.update()` runs after the step, so there the scale is not lowered"
            )
        if not readers:
            return
        if not all(follows for _, _, follows in readers):
            # a clip in an arm that never runs with the scaled backward (the native or fp32 arm of
            # `if native: ... elif apex: ... else: ...` after the same test) reads what it always read
            found_clips = [grad_readers.scale_aware_clips(reader, reads, self.context.gradient_norms | self.tree.gradient_norms) for reader, _, _ in readers]
            clips = [None if found is None else [clip for clip in found if not self.tree.never_together(clip, scale.statement)]
                     for found in found_clips]
            conditions = [condition for (_, condition, _), kept, found in zip(readers, clips, found_clips) if found is None or kept]
            clips = [kept for kept, found in zip(clips, found_clips) if found is None or kept]  # none left: not a reader
            if not clips:
                return  # every clip is in an arm the scaled backward never runs with
            if all(clips):
                delayed = None
                if delayed_unscale(scale.call) is not None and not all(unscaled_there(self.tree, scale.call, clip) for calls in clips for clip in calls):
                    # apex left the gradients scaled on a `delay_unscale=True` pass: a clip there
                    # cut the scaled gradients at the bare threshold (all but erasing them); the
                    # scale-aware clip cuts the true ones, as was surely meant, but not as it ran
                    delayed = "on delay_unscale passes apex clipped the scaled gradients at the bare threshold; this clips the true ones"
                    reason = f"a clip runs after `amp.scale_loss(..., delay_unscale=...)`: {delayed}"
                    self.draft.unsafe.append(reason)
                    self.draft.marked_reasons.append(reason)
                self._plan_scale_aware(scale, [(call, condition) for calls, condition in zip(clips, conditions) for call in calls], delayed)
                return
            reason = (f"gradients are read where `{optimizer}.step()` does not always follow (apex had unscaled them): "
                      f"call `{self.setup.scaler}.unscale_({optimizer})` by hand where they are final")
            # where the step does follow (a clip at the accumulation boundary, in a block holding the
            # step), `amp.master_params` still unscales
            refused = [reader for reader, _, follows in readers
                       if not follows and not any(self.tree.inside(step, reader) for step, _ in steps)]
            self.draft.unscale_refused.update(self._reached(refused))
            # between two scaled backward passes no gradients are final: the read divides the scale out itself
            mixing = (f"gradients are read between two scaled backward passes (apex had unscaled them): an `unscale_` "
                      f"there would mix scaled and unscaled gradients; read them divided by `{self.setup.scaler}.get_scale()`")
            marks = {False: (reason, f"this reads gradients still scaled by the loss scale (apex had unscaled them; "
                                     f"`{optimizer}.step()` may not follow): call `{self.setup.scaler}.unscale_({optimizer})` "
                                     "by hand where they are final"),
                     True: (mixing, f"this reads gradients still scaled by the loss scale (apex had unscaled them), and another "
                                     f"scaled backward adds to them before `{optimizer}.step()`: an `unscale_` here would mix "
                                     f"scaled and unscaled gradients; read them divided by `{self.setup.scaler}.get_scale()`")}
            for refused_reader in refused:
                for reader in self._reading_statements(refused_reader, reads):
                    self.draft.mark(reader, *marks[id(refused_reader) in before_another])
            if not refused:
                self.draft.unsafe.append(reason)
            return
        first, condition, _ = readers[0]
        unscale = self._unscale_each(self.scaler_of(scale.call), optimizer, steps)
        # `if clip: clip_grad_norm_(...)` alone: unscale in the branches that read, as one would write it;
        # before the `if` where a test of what it read skips the step (`if isfinite(norm):`): the
        # update after that test needs the inf checks `unscale_` records, whether the clip ran or not
        places = self._first_readers(first, scale.statement) if len(readers) == 1 and not self._guards(guards) else [first]
        for place in places:
            line = unscale
            if condition is not None and (condition, True) not in self.tree.arm_tests(place):  # not in `if fp16:` already
                line = f"if {condition}:\n" + textwrap.indent(unscale, "    ")
            self.draft.insert_once(place, line)
        self.draft.unscale_covered.update(self._reached(reader for reader, _, _ in readers))

    def _reading_statements(self, reader: cst.BaseStatement, reads) -> list[cst.BaseStatement]:
        """Where markers about ``reader`` go: in each arm of an ``if``, and in the body of a loop
        of micro-batches (or a ``with``), the first statement that reads gradients after a
        backward pass (and so on inward); else ``reader`` itself."""
        return self._readers_inside(reader, reads) or [reader]

    def _readers_inside(self, statement: cst.BaseStatement, reads) -> list[cst.BaseStatement]:
        if not isinstance(statement, _COMPOUND):
            return []
        blocks, arm = [statement.body], getattr(statement, "orelse", None)
        while isinstance(arm, (cst.If, cst.Else)):
            blocks.append(arm.body)
            arm = getattr(arm, "orelse", None) if isinstance(arm, cst.If) else None
        found = []
        for block in blocks:
            for inner in block.body if isinstance(block, cst.IndentedBlock) else ():
                if self.scales_again(inner, None):  # a loop of micro-batches reads inside, after its backward
                    deeper = self._readers_inside(inner, reads)
                elif reads(inner, after_a_backward=True):
                    deeper = self._readers_inside(inner, reads) or [inner]
                else:
                    continue
                if deeper:
                    found += deeper
                    break
        return found

    def _reads_before_another_backward(self, statement: cst.CSTNode, scale: ScaleLossSite, reads) -> bool:
        """Whether ``statement``, which may hold another backward pass, reads gradients before
        it on some way through (``if reg: reg.update(); ...; scale_loss(l_reg)``). A read after
        that backward pass is the later one's to unscale. (A method: a nested function calling
        itself is a cycle that would hold the file's tree.)"""
        if not self.scales_again(statement, scale):
            return reads(statement)
        if isinstance(statement, (cst.For, cst.While)):
            return False  # micro-batches in a loop of their own: the paths to the steps take them
        if not isinstance(getattr(statement, "body", None), cst.IndentedBlock):
            return reads(statement)  # a line that reads and scales: taken as reading first
        orelse = getattr(statement, "orelse", None)
        if isinstance(orelse, cst.If) and self._reads_before_another_backward(orelse, scale, reads):
            return True
        for arm in [statement.body, *([orelse.body] if isinstance(orelse, cst.Else) else [])]:
            for line in arm.body:
                if self._reads_before_another_backward(line, scale, reads):
                    return True
                if self.scales_again(line, scale):
                    break
        return False

    def _reached(self, readers) -> set[int]:
        """The readers, and the file's helpers they call: an ``amp.master_params`` read in one
        (``clip(max_norm)``) is unscaled, or not, by what is planned before its caller."""
        return {id(node) for reader in readers for node in (reader, *helpers_reached(self.tree, reader, self.sites.ids))}

    @staticmethod
    def _unscale_each(scaler: str, optimizer: str, steps: list[tuple[cst.SimpleStatementLine, int]]) -> str:
        """``scaler.unscale_(optimizer)``; for a list stepped in a loop (``for o in opts: o.step()``)
        or written out (``[opt_a, opt_b]``), one ``unscale_`` each: GradScaler takes one optimizer."""
        looped = next((line for line, index in steps if index == EACH and isinstance(line, cst.For)), None)
        if looped is not None:
            each = looped.target.value
            return f"for {each} in {optimizer}:\n    {scaler}.unscale_({each})"
        if optimizer.startswith(("[", "(")):
            elements = cst.parse_expression(optimizer)
            if isinstance(elements, (cst.List, cst.Tuple)):
                return "\n".join(f"{scaler}.unscale_({nodes.code(element.value)})" for element in elements.elements)
        return f"{scaler}.unscale_({optimizer})"

    def _plan_scale_aware(self, scale: ScaleLossSite, clips: list[tuple[cst.Call, str | None]], marker: str | None = None) -> None:
        """Clips where the step may not follow work on the scaled gradients (see ``grad_readers``);
        ``marker``, where that is not how apex ran them, is left as a ``TODO(ampmigrate)`` on each.
        A clip's condition is the test the scaled backward ran under (``if use_amp:`` beside a plain
        backward, with a scaler enabled either way): where it fails, the gradients are not scaled."""
        scaled_by, tests = f"{self.scaler_of(scale.call)}.get_scale()", []
        if id(scale.call) in self.sites.alias_of:  # the receiver may be None where amp was off: scale 1
            alias = self.sites.alias_of[id(scale.call)]
            scaled_by, tests = f"{alias}.get_scale()", [alias_present(alias)]
        masters = {id(call): call for call in self.sites.calls["master_params"]}
        for clip, condition in clips:
            when = [*tests, *([condition] if condition is not None and not condition.startswith("any(") else [])]
            when = [f"({test})" if " " in test and len(when) > 1 else test for test in when]
            factor = f"({scaled_by} if {' and '.join(when)} else 1.0)" if when else scaled_by
            params = clip.args[0].value if clip.args and clip.args[0].keyword is None else None
            generator = None
            if isinstance(params, cst.Call) and id(params) in masters:
                generator = self._master_params_generator(params)
                self.draft.master_params_in_clips.add(id(params))
            new = self._laid_out(clip, grad_readers.scale_aware(clip, factor, self.tree.parent.get(id(clip)), generator, self.tree.module))
            # Marked `# noqa: AMP101`: it reads scaled gradients, and rightly (AMP101 offers no fix
            # there, as no step may follow). One mark per statement.
            clips_them = grad_readers.is_clip(clip)
            node, statement = clip, self.tree.statement(clip)
            if id(statement) not in self.draft.replacements:
                mark = SCALE_AWARE_MARK if clips_them else NORM_OF_SCALED_MARK
                node, new = statement, with_first_line_comment(statement.deep_replace(clip, new), mark)
            self.draft.replace(node, new)
            if marker is not None:
                self.draft.leave_marker(node if node is statement else scale.statement, marker)
            done = (f"Clip the scaled gradients at the threshold times `{factor}`" if clips_them
                    else f"Divide the scaled gradients' norm by `{factor}`")
            self.draft.kind(node, SCALE_LOSS, "gradients read after `amp.scale_loss` were unscaled by apex",
                            f"{done}: the step may not follow, so they cannot be unscaled here")

    def _first_readers(self, statement: cst.BaseStatement, scaled: cst.CSTNode) -> list[cst.BaseStatement]:
        """Where gradients are first read in each branch of ``statement`` (itself, unless it is an
        ``if``), but in a branch that never runs with the scaled backward ``scaled`` (``else:`` of
        a later ``if fp16:``)."""
        if not isinstance(statement, cst.If):
            return [statement]
        found, branch = [], statement
        while branch is not None:
            if isinstance(branch, cst.If) and grad_readers.reads_grads(branch.test) or not isinstance(branch.body, cst.IndentedBlock):
                return [statement]
            first = next((s for s in branch.body.body if grad_readers.reads_grads(s)), None)
            if first is not None and not self.tree.never_together(first, scaled):
                found += self._first_readers(first, scaled)
            if nodes.code(statement.test) in self.setup.guard_tests:
                break  # past `if fp16:` the scaler is disabled: nothing to unscale
            branch = branch.orelse if isinstance(branch, cst.If) else None
        return found

    def _paths_to_steps(self, container: cst.CSTNode, steps: list[tuple[cst.SimpleStatementLine, int]]) -> list[list[list[cst.BaseStatement]]]:
        """For each step inside ``container``, innermost first: the statements before it in each enclosing block."""
        paths = []
        for line, _ in steps:
            path, node = [], line
            while node is not container:
                block = self.tree.parent[id(node)]
                body = list(block.body)
                owner = self.tree.parent.get(id(block))
                path.append(body[: body.index(node)])
                if owner is None:
                    break
                node = owner
                while not isinstance(self.tree.parent.get(id(node)), (cst.IndentedBlock, cst.Module)):
                    node = self.tree.parent[id(node)]
            paths.append(path)
        return paths

    def _guards(self, guards: frozenset[int]) -> list[cst.If]:
        return [guard for guard, _, _ in self.draft.gradient_guards.values() if id(guard) in guards]

    def _step_follows(self, graph: Graph, reader: cst.BaseStatement, targets: list[cst.CSTNode], scale: ScaleLossSite) -> bool:
        """Whether the step (or the update after a gradient guard) follows ``reader`` on every way
        on within the iteration they share, with no other backward pass on the way: only then may
        ``unscale_`` go before it (a second ``unscale_`` before the update raises; a backward
        after it adds scaled gradients to unscaled ones)."""
        if not graph.holds(reader) or not targets:
            return False
        within = graph.shared_loop(reader, targets[0])
        # the scaled backward's own `with` met again on the way: a loop of micro-batches inside the iteration
        return graph.always_reaches(reader, targets, within) and not graph.may_pass(
            reader, targets, lambda node: node is scale.statement or self._scales_at(node, scale), within)

    def _scales_at(self, node: cst.CSTNode, scale: ScaleLossSite) -> bool:
        """Whether the graph's ``node`` runs a backward pass other than ``scale``'s: a line, or a
        ``with`` header (a compound statement's body is a node of its own)."""
        if isinstance(node, cst.SimpleStatementLine):
            return self.scales_again(node, scale)
        if isinstance(node, cst.With):
            return any(self.scales_again(item, scale) for item in node.items)
        return False

    def _leaves_before_the_step(self, graph: Graph, scale: ScaleLossSite, targets: list[cst.CSTNode]) -> cst.CSTNode | None:
        """A ``continue``, ``break`` or ``return`` that ends the iteration after the scaled
        backward, before the step: one that a way from the backward reaches, and no way on from a step."""
        if not (graph.holds(scale.statement) and targets):
            return None
        within = graph.shared_loop(scale.statement, targets[0])
        after_a_step = {id(node) for target in targets for node in graph.reached(target, [], within)}
        for last, edge in graph.ways_out(scale.statement, targets, within):
            if edge is Edge.JUMP and id(last) not in after_a_step:
                return next((node for node in descendants(last) if type(node) in (cst.Continue, cst.Break, cst.Return)), last)
        return None

    def scales_again(self, statement: cst.CSTNode, scale: ScaleLossSite | None) -> bool:
        """Whether ``statement`` holds a backward pass other than ``scale``'s (a ``scale_loss`` or
        ``.backward()``), or calls a function of the file that scales one (``scaled_backward(loss, opt)``)."""
        others = [call for call in self.sites.calls["scale_loss"] if scale is None or call is not scale.call]
        if any(self.tree.inside(call, statement) for call in others) or backward_calls(statement):
            return True
        scaling = {id(function) for call in others if (function := self.tree.function(call)) is not None}
        return bool(scaling) and any(type(node) is cst.Call and id(self.tree.helper(node)) in scaling
                                     for node in descendants(statement, nodes.not_a_definition))

    def plan_master_params(self) -> None:
        # Blocks where `scaler.unscale_(opt)` is inserted, per optimizer: once per block, so that
        # each branch reading gradients (`if clip: clip_grad_norm_ ... else: grad_norm(...)`) reads
        # unscaled ones, and never twice on one path (GradScaler refuses a second unscale_).
        unscaled: dict[str, list[cst.CSTNode]] = {}
        for call in self.sites.calls["master_params"]:
            optimizer = nodes.argument(call, 0, "optimizer")
            if optimizer is None or nodes.has_star(call) or len(call.args) != 1:
                raise Unplannable(call, "`amp.master_params` is not called with one optimizer")
            if self.setup.level in ("O2", "O3") or (self.setup.level is None and not self.setup.level_guarded):
                self.draft.unsafe_at(call, MASTER_COPIES)
            if id(call) in self.draft.master_params_in_clips:
                continue
            opt = nodes.code(optimizer.value)
            generator = self._master_params_generator(call)
            statement = self.tree.statement(call)
            blocks = self.tree.enclosing_blocks(statement)
            done = unscaled.setdefault(opt, [])
            already = any(block is unscaled_block for block in blocks for unscaled_block in done)
            # In the `scale_loss` block apex had not unscaled yet: what reads gradients there reads
            # scaled ones, as it will natively.
            in_block = self.tree.inside_any(call, self.sites.scale_loss_statements)
            inspects_grads = self.feeds_grad_consumer(call, statement) and not in_block
            around = (statement, *self.tree.ancestors(statement))
            covered = any(id(node) in self.draft.unscale_covered for node in around)
            already = already or covered  # unscaled before the gradients are first read, on the way to the step
            if any(id(node) in self.draft.unscale_refused for node in around):
                # read where the step may not follow (a helper called after every micro-batch): an
                # `unscale_` here would run again before the update; the read sees scaled gradients
                node, new = self._fitted(call, generator)
                self.draft.replace(node, new)
                self.draft.kind(node, MASTER_PARAMS, "`amp.master_params` is apex mixed precision", "Use the optimizer's parameters")
                continue
            self.draft.kind(call, MASTER_PARAMS, "`amp.master_params` is apex mixed precision", "Use the optimizer's parameters")
            if self.setup.o0 or not inspects_grads or already or not isinstance(statement, cst.SimpleStatementLine):
                # in the block, its statement gets AMP101's mark on its first line: the call stays as laid out
                node, new = (call, generator) if in_block else self._fitted(call, generator)
                self.draft.replace(node, new)
                self.draft.kind(node, MASTER_PARAMS, "`amp.master_params` is apex mixed precision", "Use the optimizer's parameters")
                if inspects_grads and not self.setup.o0 and not already:
                    self.draft.unsafe_at(call, "gradients are read in a compound statement: call `scaler.unscale_(optimizer)` before it")
                continue
            if any(self.tree.inside(block, blocks[0]) for block in done):
                raise Unplannable(call, "gradients are read in a nested block before this: unscale once, by hand")
            done.append(blocks[0])
            unscale = nodes.parse_statements(f"{self.scaler_of(call)}.unscale_({opt})\n", self.tree.module)[0]
            updated = statement.deep_replace(*self._fitted(call, generator))
            new = cst.FlattenSentinel([nodes.with_leading(unscale, statement), updated.with_changes(leading_lines=())])
            self.draft.replace(statement, new)
            self.draft.kind(statement, MASTER_PARAMS, "`amp.master_params` is apex mixed precision", f"Call `{self.setup.scaler}.unscale_({opt})` first and use the optimizer's parameters")

    def _master_params_generator(self, call: cst.Call) -> cst.BaseExpression:
        """The optimizer's parameters, where ``amp.master_params(optimizer)`` stood."""
        optimizer = nodes.argument(call, 0, "optimizer").value
        initialize_calls = frozenset(map(id, self.sites.calls["initialize"]))
        model = model_parameters(self.tree, optimizer, call, initialize_calls) if self.setup.level in ("O0", "O1") else None
        if model is not None:  # `optimizer = SGD(model.parameters())` in this function: what a person writes
            return nodes.parse_expression(model, self.tree.module)
        opt = nodes.code(optimizer)
        generator = nodes.parse_expression(f'(p for group in {opt}.param_groups for p in group["params"])', self.tree.module)
        arg = self.tree.parent.get(id(call))
        outer = self.tree.parent.get(id(arg))
        if isinstance(arg, cst.Arg) and isinstance(outer, cst.Call) and len(outer.args) == 1 and arg.keyword is None:
            generator = generator.with_changes(lpar=[], rpar=[])
        return generator

    def _fitted(self, call: cst.Call, generator: cst.BaseExpression) -> tuple[cst.CSTNode, cst.CSTNode]:
        """What to replace, and with what, to put ``generator`` where ``call`` stood: the call
        alone, or the call holding it (``clip_grad_norm_(...)``) laid out one argument a line,
        where its line would grow past the file's line length."""
        arg = self.tree.parent.get(id(call))
        outer = self.tree.parent.get(id(arg))
        if not (isinstance(arg, cst.Arg) and isinstance(outer, cst.Call) and len(outer.args) > 1):
            return call, generator
        line = self.tree.line(call)  # the line that grows: the call's, wherever the outer call starts
        text = self.tree.source_lines[line - 1] if line is not None else ""
        grown = len(text) + len(nodes.code(generator)) - len(nodes.code(call))
        if grown <= self.tree.line_limit or any(isinstance(node, cst.Comment) for node in descendants(outer)):
            return call, generator  # it fits; or a comment is kept where it was written
        return outer, nodes.one_argument_a_line(outer.deep_replace(call, generator), self.tree.indent_unit(call))

    def _laid_out(self, clip: cst.Call, new: cst.BaseExpression) -> cst.BaseExpression:
        """``new`` (in place of ``clip``) with the clip's arguments one a line, where a line of its
        statement would pass the file's line length (and no comment sits inside the clip)."""
        statement = self.tree.statement(clip)
        if any(isinstance(node, cst.Comment) for node in descendants(clip)):
            return new
        indent = self.tree.line_indent(statement)
        lines = [line for line in nodes.code(statement.deep_replace(clip, new)).splitlines() if not line.lstrip().startswith("#")]
        mark = len("  # noqa: AMP101")  # the first line ends with it
        if max(indent + len(line) + (mark if index == 0 else 0) for index, line in enumerate(lines)) <= self.tree.line_limit:
            return new
        called = nodes.code(clip.func)
        inner = next((node for node in descendants(new) if isinstance(node, cst.Call) and nodes.code(node.func) == called), None)
        if inner is None or len(inner.args) < 2:
            return new
        return new.deep_replace(inner, nodes.one_argument_a_line(inner, self.tree.indent_unit(clip)))

    def feeds_grad_consumer(self, call: cst.Call, statement: cst.CSTNode) -> bool:
        """Whether the parameters go into something that reads gradients (clipping, norms)."""
        node = self.tree.parent.get(id(call))
        while node is not None and node is not statement:
            if isinstance(node, cst.Call) and any(word in nodes.call_name(node).lower() for word in ("clip", "norm", "grad")):
                return True
            node = self.tree.parent.get(id(node))
        return False
