"""Forward passes without gradients in the training loop: under autocast too.

apex O1 cast every forward pass once ``initialize`` ran, not only the one whose loss is scaled.
A pass the loop runs with gradients off (a memory bank or pseudo-labels filled under
``torch.no_grad()`` after the step, targets computed by the model itself) fed the next losses in
float16; outside the region it now runs in float32, and training parts from apex's. Each such
``with torch.no_grad():`` block goes under an autocast of its own, enabled as the loop's region.
Under O1 apex cast torch's functions process-wide, so another network's pass (a teacher, a flow
network the file puts in ``eval()``) ran in float16 too; O2 and O3 cast only the models given.
"""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.autocast import AutocastPlanning
from migrate.apex_plan.context import Step
from migrate.apex_plan.half_inputs import fed_half, half_runs
from migrate.apex_plan.inference_tail import trains
from migrate.apex_plan.loss_slice import backward_slice, calls_model
from migrate.apex_plan.steering import objects_of, steers_training
from migrate.apex_plan.syntax import SUSPENDS, assigned_names, contains, defines, read_names
from migrate.apex_plan.vocabulary import INITIALIZE
from migrate.loop_feeds import SETTING as LOOP_FEEDS, Feed
from migrate.names import qualified_names
from migrate.step_model.shapes import parameters_of
from migrate.tree_walk import descendants

# What turns gradients off for a block: `with torch.no_grad():` and its kin.
_GRADIENTS_OFF = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad",
                            "torch.autograd.grad_mode.no_grad", "torch.autograd.grad_mode.inference_mode"})
_MESSAGE = "a forward pass without gradients in the training loop ran under apex's casts"
_STEERING = "an evaluation whose result steers the training (a scheduler's step, an early stop) ran under apex's casts"
_HALF_OUTSIDE = ("a forward pass here mixes float16 and float32 (a network cast with `.half()`, or `.half()` inputs) "
                 "outside autocast: apex's casts made the types meet, natively it raises")
_FEEDS_REGION = "a forward pass outside the region whose result the loss reads ran under apex's casts"
_FED_HALF = ("a forward pass mixing float16 and float32 (`x.half()` inputs, or a network cast with `.half()`) ran under "
             "apex's casts: outside autocast it raises")


class DetachedForwardPlanning(Step):
    """It reads the ``FileTree``, the classified sites, the frozen ``Setup`` and the regions the
    draft holds, and writes to the ``Draft``."""

    def plan_detached_forwards(self) -> None:
        """Each loop around a training region (the scaled backward's own, or its caller's where a
        helper scales the loss), and the no-grad blocks in it."""
        loops: dict[int, tuple[cst.For | cst.While, cst.CSTNode, set[str]]] = {}
        for key, enabled in self.draft.region_enabled.items():
            for anchor in self._in_loops(self.draft.replacements[key][0], enabled):
                loop = self.tree.outermost_loop(anchor)
                loops.setdefault(id(loop), (loop, anchor, set()))[2].add(enabled)
        for loop, first, enabled in loops.values():
            if len(enabled) != 1:
                continue  # regions enabled differently: which one a pass between them follows is not known
            if any(self.tree.inside(call, loop) for call in self.sites.calls["initialize"]):
                continue  # initialized in the loop (a run-once block): apex cast nothing before it
            (region_enabled,) = enabled
            models = self.tree.models_seen_from(first, self.setup.model_codes)
            if self._casts_every_network():
                models |= self.tree.networks
            for statements, message in self._detached_blocks(loop, loop.body, models):
                self._wrap(statements, region_enabled, message)
        # the loops of the functions calling a training function (`main()`'s epoch loop around
        # `train_one_epoch()`): only the evaluations steering the training from there
        callers: dict[int, tuple[cst.For | cst.While, set[str], set[str]]] = {}
        for key, enabled in self.draft.region_enabled.items():
            for loop, models in self._caller_loops(self.draft.replacements[key][0], enabled):
                if id(loop) not in loops:
                    found = callers.setdefault(id(loop), (loop, set(), set()))
                    found[1].update(models)
                    found[2].add(enabled)
        for loop, models, enabled in callers.values():
            if len(enabled) == 1 and not any(self.tree.inside(call, loop) for call in self.sites.calls["initialize"]):
                for statements, message in self._detached_blocks(loop, loop.body, models, steering_only=True):
                    self._wrap(statements, next(iter(enabled)), message)
        self._mark_half_runs_outside()
        self._mark_loop_feeds()

    def _mark_half_runs_outside(self) -> None:
        """A pass mixing float16 and float32 that no autocast holds after the rewrite (an export
        of a network cast to float16 after the loop, an evaluation fed ``x.half()``): apex's casts
        made it run, natively it raises. The rewrite is unsafe, and a marker says where."""
        every_network = self._apex_tests()
        scopes = [self.tree.module, *(node for node in descendants(self.tree.module) if type(node) is cst.FunctionDef)]
        for scope in scopes:
            for call in half_runs(self.tree, scope, set(self.setup.model_codes), every_network):
                if self._under_autocast(call, set()):
                    continue
                self.draft.mark(self.tree.statement(call), _HALF_OUTSIDE, "run it under `torch.autocast`, or give it inputs "
                                "and weights of one type: apex's casts made them meet")

    def _mark_loop_feeds(self) -> None:
        """Under O1, a method running a model this file initializes on ``self`` whose result a loop
        hands back to the training (``migrate.loop_feeds``: an agent's ``select_action`` filling the
        replay buffer ``train`` samples): apex ran it in float16, natively it runs in float32. Unless
        a region of this rewrite holds it, the rewrite is unsafe, marked at the model's run where this
        file holds the method, else at the training method's scaled backward."""
        if not self._casts_every_network():
            return
        for feed in map(Feed._make, (self.tree.provider.cache or {}).get(LOOP_FEEDS, ())):
            fed = self._call_at(feed.fed_line, lambda call: nodes.code(call.func).endswith(f".{feed.method}"))
            run = self._call_at(feed.run_line, lambda call: f".{feed.model}" in nodes.code(call.func))
            if (fed is not None and self._under_autocast(fed, set())) or (run is not None and self._in_region(run)):
                continue
            ran = (f"`{feed.method}` ({feed.run_at}) runs `self.{feed.model}`, and the loop at {feed.fed_at} hands what "
                   f"it returns to `{feed.trainer}`: apex's casts ran it in float16")
            reason = ran.replace("`, and the loop", "` outside autocast, and the loop", 1)
            step = f"run `self.{feed.model}` in `{feed.method}` ({feed.run_at}) under `torch.autocast`, as apex's casts did"
            trained = [call for call in self.sites.calls["scale_loss"]
                       if (function := self.tree.function(call)) is not None and function.name.value == feed.trainer]
            trainers = {id(self.tree.function(call)) for call in trained}
            enabled = {flag for key, flag in self.draft.region_enabled.items()
                       if id(self.tree.function(self.draft.replacements[key][0])) in trainers}
            if run is None:
                if trained:
                    self.draft.mark(self.tree.statement(trained[0]), reason, step)
                continue
            statement, method = self.tree.statement(run), self.tree.function(run)
            # the initializing class's own method (a base class's may serve subclasses without a scaler)
            owners = {self.tree.owner_class(self.tree.function(call)) for call in self.sites.calls["initialize"]}
            if len(enabled) == 1 and self.tree.owner_class(method) in owners and self.tree.first_param(method) == "self" \
                    and self._wrappable(statement) and not self._names_read(next(iter(enabled))) - {"self", "bool", "True"}:
                self._wrap([statement], next(iter(enabled)), ran)  # the method's own self holds the scaler
            else:
                self.draft.replace(statement, statement)
                self.draft.kind(statement, INITIALIZE, reason, step)
                self.draft.mark(statement, reason, step)

    def _in_region(self, node: cst.CSTNode) -> bool:
        return any(id(outer) in self.draft.regions for outer in (node, *self.tree.ancestors(node)))

    def _call_at(self, line: int, wanted) -> cst.Call | None:
        """The first call on ``line`` of this file that is ``wanted``; None for line 0 (another file's)."""
        if not line:
            return None
        return next((node for node in descendants(self.tree.module) if type(node) is cst.Call and self.tree.line(node) == line
                     and wanted(node)), None)

    def _under_autocast(self, node: cst.CSTNode, seen: set[int]) -> bool:
        """Whether a region of the rewrite holds ``node``, or every call of the function holding it
        (called somewhere in the file) stands under one."""
        if self._in_region(node):
            return True
        function = self.tree.function(node)
        if function is None or id(function) in seen or not (calls := self.tree.calls_of(function)):
            return False
        return all(self._under_autocast(call, seen | {id(function)}) for call in calls)

    def _caller_loops(self, first: cst.CSTNode, enabled: str) -> list[tuple[cst.For | cst.While, set[str]]]:
        """The loops of other functions of the file around a call of ``first``'s function (at
        module level, in a block of it too), with the names the models go by there, where ``enabled`` reads there as it
        does in that function: its names are the module's, or handed in under the same name."""
        function = self.tree.function(first)
        # defined at the module's top level, or in its blocks (`if __name__ == "__main__":`): its
        # free names are the module's
        if function is None or self.tree.function(self.tree.parent.get(id(function))) is not None \
                or self.tree.owner_class(function) is not None:
            return []
        roots = self._names_read(enabled) - {"bool", "True", "False"}
        local = assigned_names(function.body)
        models = self.tree.models_seen_from(first, self.setup.model_codes)
        found = []
        for call in self.tree.calls_of(function):
            loop, caller = self.tree.outermost_loop(call), self.tree.function(call)
            if loop is None or caller is function:
                continue
            given = self.tree.arguments(function, call)
            # a script's own loop (no caller): its names are the module's
            caller_local = set() if caller is None else assigned_names(caller.body) | {param.name.value for param in (
                *parameters_of(caller), caller.params.star_arg, caller.params.star_kwarg) if isinstance(param, cst.Param)}
            if all(nodes.code(given[root]) == root if root in given else root not in local | caller_local for root in roots):
                handed = {nodes.code(value) for name, value in given.items() if name in models}
                found.append((loop, handed | self.tree.models_seen_from(call, self.setup.model_codes)))
        return found

    def _in_loops(self, first: cst.CSTNode, enabled: str) -> list[cst.CSTNode]:
        """``first`` where a loop of its function holds it; else the calls of that function in a
        loop of a method of the same class (a trainer's ``run_forward(x)`` and
        ``backward_stored(x, y)`` called in ``train``'s loop, of the class or one derived from it),
        where ``enabled`` reads there as it does in ``first``'s method (``self.scaler``, or the
        module's scaler: its name is bound nowhere else in the file)."""
        if self.tree.outermost_loop(first) is not None:
            return [first]
        function = self.tree.function(first)
        if function is None:
            return []
        owner = self.tree.owner_class(function)
        if owner is None or self._names_read(enabled) - {"self", "bool", "True", self.setup.scaler}:
            return []
        return [call for call in self.tree.calls_of(function) if self.tree.outermost_loop(call) is not None
                and (caller := self.tree.owner_class(self.tree.function(call))) is not None and owner in self.tree.lineage(caller)]

    def _names_read(self, enabled: str) -> set[str]:
        """The plain names a region's ``, enabled=...`` reads (``scaler`` of ``scaler.is_enabled()``, not ``is_enabled``)."""
        expression = nodes.parse_expression(enabled.removeprefix(", enabled=") or "True", self.tree.module)
        attrs = {id(node.attr) for node in descendants(expression) if type(node) is cst.Attribute}
        return {node.value for node in descendants(expression) if type(node) is cst.Name and id(node) not in attrs}

    def _apex_tests(self) -> frozenset[str] | None:
        """Under O1, the spellings of the test guarding ``initialize`` (none where it is not
        guarded): a network cast to float16 under them (or unconditionally) ran under apex's casts.
        None under another level, where apex cast only the models it was given."""
        return self.setup.guard_tests if self._casts_every_network() else None

    def _casts_every_network(self) -> bool:
        """Whether apex ran O1 here: every ``initialize`` at O1 (written so, or by default), or at a
        level computed at run time where only O0 and O1 are migrated (O0 leaves the region off)."""
        for call in self.sites.calls["initialize"]:
            level = nodes.argument(call, 3, "opt_level")
            if level is None:
                continue
            if nodes.literal_string(level.value) is not None:
                if nodes.literal_string(level.value) not in ("O1", "01", "o1"):
                    return False
            elif not self.exact_levels <= {"O0", "O1"}:
                return False  # O2 accepted as autocast: apex cast only the models given there
        return True

    def _detached_blocks(self, loop: cst.For | cst.While, block: cst.BaseSuite, models: set[str], steering_only: bool = False):
        """Each ``with torch.no_grad():`` in ``block`` (or in the arms and loops inside it) that
        calls one of ``models`` itself, with the lines right after it that read what it bound; each
        evaluation handed a model whose result steers the training ``loop``; with what to say."""
        if not isinstance(block, cst.IndentedBlock):
            return
        body = list(block.body)
        half = set()  # names bound under autocast in this block: what a plain pass's loss may read
        for index, statement in enumerate(body):
            if id(statement) in self.draft.regions:
                half |= assigned_names(statement)
                continue
            if defines(statement):
                continue
            plain = [] if steering_only else self._plain_pass(body, index, models, half)
            if plain:
                half |= {name for line in plain for name in assigned_names(line)}
                yield plain, _MESSAGE
                continue
            feeding = [] if steering_only else self._feeding_pass(body, index, models, loop)
            if feeding:
                yield feeding, _FEEDS_REGION
                continue
            if self._steering_evaluation(statement, models, loop):
                yield [statement], _STEERING
                continue
            if self._wrappable(statement) and fed_half(self.tree, statement, models, self.sites.ids, self._apex_tests()) \
                    and not trains(self.tree, statement, models):
                yield [statement], _FED_HALF
                continue
            if isinstance(statement, cst.With) and self._gradients_off(statement) and not steering_only:
                if self._wrappable(statement) and calls_model(statement, models):
                    yield [statement, *self._readers_after(body[index + 1:], assigned_names(statement), models)], _MESSAGE
                continue
            for child in self._blocks_of(statement):
                yield from self._detached_blocks(loop, child, models, steering_only)

    def _steering_evaluation(self, statement: cst.CSTNode, models: set[str], loop: cst.For | cst.While) -> bool:
        """``val_loss = validate(model, val_loader)`` where ``scheduler.step(val_loss)`` or an early
        stop reads what it returns (``steering``): apex ran it in float16, and its result decides
        the training's course."""
        if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1 or type(statement.body[0]) is not cst.Assign:
            return False
        # the model itself handed on, not what a method of it gives (`clip_grad_norm_(net.parameters(), 1.0)`)
        handed = any(type(node) is cst.Call and any(type(arg.value) is not cst.Call and read_names(arg.value) & models
                                                    for arg in node.args)
                     for node in descendants(statement.body[0].value, nodes.not_a_definition)
                     ) or self.tree.calls_model(statement, models, self.sites.ids)  # `self.evaluate(val_data)`
        # not a training step of its own (`loss = train_step(model, batch)`): a step inside an outer region
        # would leave autocast's cached float16 weights stale for the passes after it (an evaluation's
        # own region, in a native-mode arm, updates nothing: it nests)
        return handed and self._wrappable(statement) and not trains(self.tree, statement, models, own_regions=False) and steers_training(
            loop, assigned_names(statement), self.tree.per_scope(("objects",), lambda: objects_of(self.tree.module)))

    def _plain_pass(self, body: list[cst.BaseStatement], index: int, models: set[str],
                    half: set[str]) -> list[cst.BaseStatement]:
        """Where ``body[index]`` is a plain backward pass (``loss_dis.backward()``, a loss another
        optimizer steps), the lines before it that compute its loss from a network's forward pass,
        or from what an earlier region bound (``half``): apex's casts ran those too. Empty where
        there are none, or a line of them is rewritten."""
        statement = body[index]
        if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
            return []
        call = getattr(statement.body[0], "value", None)
        if not (type(call) is cst.Call and isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"
                and type(call.func.value) is cst.Name):
            return []
        first = index  # the plain lines just before it that no other fix touches
        while first > 0 and type(body[first - 1]) is cst.SimpleStatementLine and id(body[first - 1]) not in self.draft.regions \
                and self._wrappable(body[first - 1]):
            first -= 1
        start = backward_slice(body[first:index], {call.func.value.value})[0]
        lines = [] if start is None else body[first + start:index]
        return lines if any(calls_model(line, models) or read_names(line) & half for line in lines) else []

    def _feeding_pass(self, body: list[cst.BaseStatement], index: int, models: set[str],
                      loop: cst.For | cst.While) -> list[cst.BaseStatement]:
        """Where ``body[index]`` runs a network outside every region (``clean = model(x)`` before an
        inner loop of adversarial steps whose region reads it), with the lines right after it that
        compute from it: those a region of ``loop`` reads. Empty where no region reads them."""
        statement = body[index]
        if type(statement) is not cst.SimpleStatementLine or not _runs_forward(statement, models) \
                or not self._wrappable(statement) or defines(statement) or trains(self.tree, statement, models):
            return []
        lines = [statement, *self._readers_after(body[index + 1:], assigned_names(statement), models)]
        bound = set().union(*map(assigned_names, lines))
        read = set().union(*(read_names(self.draft.replacements[key][1]) for key in self.draft.region_enabled
                             if self.tree.inside(self.draft.replacements[key][0], loop)))
        return lines if bound & read else []

    @staticmethod
    def _blocks_of(statement: cst.CSTNode) -> list[cst.BaseSuite]:
        """The blocks a compound statement runs (an ``if``'s arms, a loop's body, a ``try``'s parts)."""
        if isinstance(statement, cst.If):
            blocks, arm = [statement.body], statement.orelse
            while arm is not None:
                blocks.append(arm.body)
                arm = arm.orelse if isinstance(arm, cst.If) else None
            return blocks
        if isinstance(statement, (cst.For, cst.While, cst.With)):
            return [statement.body]
        if isinstance(statement, cst.Try):
            return [statement.body, *(handler.body for handler in statement.handlers),
                    *(part.body for part in (statement.orelse, statement.finalbody) if part is not None)]
        return []

    def _gradients_off(self, statement: cst.With) -> bool:
        def turns_off(item: cst.WithItem) -> bool:
            if not isinstance(item.item, cst.Call):
                return False
            # `torch` may come from a star import (`from utils import *`): then the text decides
            names = qualified_names(self.tree.provider, item.item.func) or {nodes.code(item.item.func)}
            return bool(names & _GRADIENTS_OFF)
        return any(map(turns_off, statement.items))

    def _wrappable(self, statement: cst.CSTNode) -> bool:
        """Nothing inside is rewritten, is a region, turns autocast on or off itself, or suspends."""
        if self.draft.touched(statement) or contains(statement, SUSPENDS):
            return False
        return not any(id(node) in self.draft.regions or (type(node) is cst.Call and nodes.call_name(node) == "autocast")
                       for node in descendants(statement))

    def _readers_after(self, following: list[cst.BaseStatement], bound: set[str],
                       models: set[str]) -> list[cst.BaseStatement]:
        """The lines after the block up to the last that computes from what it bound, directly or
        through what the lines before it bound (``bank = out / out.norm()``; a validation's losses
        on its passes' outputs a few lines on, ``loss_vgg = vgg_loss(target, output)``): apex cast
        those ops too, and a float16 output handed to a float32 network outside autocast raises.
        The lines between go with them; the span ends before a line that trains or is not wrappable."""
        taken, last = [], 0
        for statement in following:
            if not self._wrappable(statement) or defines(statement) or id(statement) in self.draft.regions \
                    or trains(self.tree, statement, models):
                break
            taken.append(statement)
            if read_names(statement) & bound:
                bound = bound | assigned_names(statement)
                last = len(taken)
        return taken[:last]

    def _wrap(self, statements: list[cst.BaseStatement], enabled: str, message: str) -> None:
        regions = AutocastPlanning(self.context)
        first = statements[0]
        self.draft.replace(first, regions.under_autocast(statements, enabled))
        self.draft.kind(first, INITIALIZE, message, "Run it under `torch.autocast`, as the training forward pass")
        regions.move_into_region(statements[1:], message)
        self.draft.regions.add(id(first))


def _runs_forward(statement: cst.CSTNode, models: set[str]) -> bool:
    """A call of the network itself (``model(x)``, ``model.forward(x)``, ``model.module(x)``), not
    of another method of it (``model.init_hidden(n)`` makes zeros apex's casts did not touch)."""
    return any(type(node) is cst.Call and (nodes.code(node.func) in models or (
        type(node.func) is cst.Attribute and node.func.attr.value in ("forward", "module") and nodes.code(node.func.value) in models))
        for node in descendants(statement, nodes.not_a_definition))
