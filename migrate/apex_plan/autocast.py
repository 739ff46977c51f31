"""The autocast region: from the model's forward call to the loss apex's casts produced."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.conditions import StepConditions
from migrate.apex_plan.context import Step
from migrate.apex_plan.earlier_regions import computed_in_a_region, continues_a_region
from migrate.apex_plan.loss_slice import backward_slice, carried, function_slice
from migrate.apex_plan.own_autocast import enclosing_autocast
from migrate.apex_plan.syntax import (
    assigned_names,
    assigns,
    calls,
    read_names,
)
from migrate.apex_plan.vocabulary import (
    AUTOCAST,
    INITIALIZE,
    ScaleLossSite,
    alias_present,
    as_bool,
    attribute_set,
    grouped_text,
)
from migrate.flow.bindings import bound_value
from migrate.flow.reaching import binding_nodes, reaching
from migrate.loop_feeds import fed_lines
from migrate.names import qualified_names
from migrate.tree_walk import descendants


class AutocastPlanning(Step):
    """The autocast region: from the model's forward call to the loss apex's casts produced.

    It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the ``Draft``.
    """

    def plan_autocast(self, scale: ScaleLossSite) -> None:
        loss = nodes.code(scale.loss)
        loss_text = " ".join(loss.split())  # as a message or a comment says it: one line
        if self._plan_region(scale.statement, loss, scale):
            self._plan_callers_forwards(scale)
            return
        callers = self._callers_handing(scale)
        if callers and self._scaler_visible_at([s for s, _ in callers]) and id(scale.call) not in self.sites.alias_of \
                and not any(id(s) in self.draft.replacements for s, _ in callers):
            # `def optimize(self, loss)` called as `self.optimize(loss)`: the forward is the callers'.
            if all(self._plan_region(statement, handed, scale) for statement, handed in callers):
                return
        block = self.tree.parent.get(id(scale.statement))
        window = self.draft.window(block, scale.statement)
        sliced = self._slices_around(scale)
        # `def update(self, out, y)`: the loss from what the callers' forward passes made
        handed = self._plan_callers_forwards(scale) if sliced else None
        # a loss only read and divided (`losses = self.outputs["loss"]`) computes nothing autocast would cast
        if handed is not None or any(type(node) is cst.Call for statements in sliced for s in statements for node in descendants(s)):
            if handed is None and not continues_a_region(self.tree, self.draft.regions, sliced[0]):
                # at its own line: another `scale_loss` of the file may well have its forward
                self.draft.unsafe_at(scale.statement, f"the model's forward call is not seen next to `amp.scale_loss` at line {self.tree.line(scale.call)}: "
                                                      f"autocast covers what `{loss_text}` is computed from in that block")
            for statements in sliced:
                self._wrap(statements, scale, loss)
            return
        body = list(block.body)
        before = body[: body.index(scale.statement)]
        if not window and before and id(before[-1]) in self.sites.scale_loss_statements:
            return  # `a, b = out.x, out.y` and a backward pass for each: autocast went before the first
        if computed_in_a_region(self.tree, self.draft.regions, scale.loss, scale.statement):
            return  # `for key in losses: ... scale_loss(losses[key], d_opt)`: an earlier region computed it
        reason = "no forward pass next to `amp.scale_loss`: put the forward pass under `torch.autocast` by hand"
        self.draft.unsafe.append(reason)
        self.draft.marked_reasons.append(reason)  # the marker below says what to do
        self.draft.leave_marker(scale.statement, f"compute `{loss_text}` (the forward pass) under {AUTOCAST.format(enabled='')}: "
                                                   f"apex {self.setup.level if self.setup.level in ('O2', 'O3') else 'O1'} cast it")

    def _slices_around(self, scale: ScaleLossSite) -> list[list[cst.BaseStatement]]:
        """What the loss is computed from before the scaled backward: in its block or, where that
        holds none of it, in a block around it (``loss = F.mse_loss(out, y)`` then ``if
        self.use_amp:`` holding ``amp.scale_loss``), climbing out of ``if`` statements only; and
        once found, what it carries on from above the ``if`` around it (``slices_above``)."""
        current = scale.statement
        while True:
            block = self.tree.parent.get(id(current))
            if not isinstance(block, cst.IndentedBlock):
                return []
            window = self.draft.window(block, current)
            start = backward_slice(window, read_names(scale.loss))[0]
            if start is not None:
                return [window[start:], *self.slices_above(window[start:])]
            owner = self._statement_holding(block)
            if not isinstance(owner, cst.If):
                return []
            current = owner

    def slices_above(self, region: list[cst.BaseStatement]) -> list[list[cst.BaseStatement]]:
        """What ``region``, in an arm, carries on from above the ``if`` holding it, and from above
        each ``if`` around that: ``loss = F.mse_loss(out, y)`` above ``if self.use_amp:``, whose
        arm computes ``loss = loss / n``. apex cast that too. Only what computes, not data moved
        (``y = y.cuda()``); one slice for each block."""
        slices, wanted = [], carried(region)
        for window in self._windows_above(region):
            if not wanted:
                break
            start, wanted = backward_slice(window, wanted, computing=True)
            if start is not None:
                slices.append(window[start:])
        return slices

    def _windows_above(self, region: list[cst.BaseStatement]):
        """The statements above the ``if`` holding ``region``, then above each ``if`` around that,
        for as long as an ``if`` in a block holds the last."""
        current = region[0]
        while True:
            owner = self._statement_holding(self.tree.parent.get(id(current)))
            block = self.tree.parent.get(id(owner))
            if not isinstance(owner, cst.If) or not isinstance(block, cst.IndentedBlock):
                return
            yield self.draft.window(block, owner)
            current = owner

    def _statement_holding(self, block: cst.CSTNode) -> cst.CSTNode | None:
        """The statement whose block ``block`` is: for an arm, the whole ``if``/``elif`` chain."""
        owner = self.tree.parent.get(id(block))
        while isinstance(owner, cst.Else) or (isinstance(owner, cst.If) and isinstance(self.tree.parent.get(id(owner)), (cst.If, cst.Else))):
            owner = self.tree.parent.get(id(owner))
        return owner

    def _scaler_visible_at(self, statements: list[cst.CSTNode]) -> bool:
        """Whether an autocast at ``statements`` may ask the scaler whether it is on (where it may
        be off, its ``enabled=`` does)."""
        return not self.setup.may_be_disabled or self.setup.scaler.startswith("self.") or self.setup.scope in ("global", "module") or (
            self.setup.scope == "parameter"
            and all(self.tree.function(s) in self.setup.scaler_receivers or self.tree.inside(s, self.setup.scaler_maker)
                    for s in statements))

    def _plan_callers_forwards(self, scale: ScaleLossSite) -> bool | None:
        """Where the loss is computed from a parameter (``def update(self, fake, target)``) that a
        caller of the file makes by running a network (``fake = trainer.forward(x)``): apex cast
        that forward pass too, and the region here does not reach it, so each such caller's forward
        goes under an autocast of its own. None where no caller hands one in; False where one
        could not (another file's, or the scaler not seen there): the fix is unsafe, saying so."""
        function = self.tree.function(scale.statement)
        if function is None:
            return None
        wanted = read_names(scale.loss)
        for line in function_slice(function, wanted):
            wanted |= read_names(line)
        params = [param.name.value for param in function.params.params]
        handed = wanted & set(params) - {"self", "cls"}
        if not handed:
            return None
        skip = 1 if self.tree.owner_class(function) is not None else 0
        defined = self.tree.per_scope(("functions defined",), lambda: _by_name(
            node for node in descendants(self.tree.module) if type(node) is cst.FunctionDef and isinstance(node.body, cst.IndentedBlock)))
        made: list[tuple[cst.Call, str, cst.BaseExpression]] = []  # the calls handing in a network's output
        for call in descendants(self.tree.module):
            if type(call) is not cst.Call or nodes.call_name(call) != function.name.value or self.tree.inside(call, function):
                continue
            for name in sorted(handed):
                arg = nodes.argument(call, params.index(name) - skip, name)
                if arg is not None and self._made_by_a_network(arg.value, call, defined):
                    made.append((call, name, arg.value))
        # `output = self.model(x)` then `loss = self.backward_from(output, y)`: the caller's forward
        # goes under an autocast of its own, enabled as the one here
        statements = [self.tree.statement(call) for call, _, _ in made]
        # only a call known to be of this function (`self.update(...)` in its class, `update(...)`),
        # not another object's method of the same name
        plannable = self._scaler_visible_at(statements) and not any(
            id(statement) in self.draft.replacements or self.draft.touched(statement) for statement in statements) and all(
            self.tree.helper(call) is function for call, _, _ in made)
        for (call, name, value), statement in zip(made, statements):
            if not (plannable and self._plan_region(statement, nodes.code(value), scale)):
                self.draft.unsafe.append(
                    f"the loss is computed from `{name}`, handed in at line {self.tree.line(call)} from a forward pass "
                    "outside autocast (apex cast it too): put that forward pass under `torch.autocast` by hand")
                return False
        for handed_in in self.handed_elsewhere:  # the same, by a caller in another file of the project
            if handed_in.function != function.name.value:
                continue
            name = params[handed_in.key + skip] if isinstance(handed_in.key, int) and handed_in.key + skip < len(params) else handed_in.key
            if name in handed and (f"self.{handed_in.maker}" in self.setup.model_codes or self._runs_a_model(handed_in.maker, defined)):
                self.draft.unsafe.append(
                    f"the loss is computed from `{name}`, handed in at {handed_in.place} from `{handed_in.maker}(...)`, a forward "
                    "pass outside autocast (apex cast it too): put that forward pass under `torch.autocast` by hand")
                return False
        return True if made else None

    def _runs_a_model(self, maker: str, defined: dict) -> bool:
        """Whether a function of the file named ``maker`` returns what an initialized model computed
        (a model as ``initialize`` was given it, or a name its function gives one): ``return
        self.gen(x)``, or ``fake = self.gen(x)`` then ``return fake, x``; not one that scales a loss
        itself (``pred = trainer.gen_update(x)``: the rewrite puts its forward pass under autocast)."""
        for function in defined.get(maker, ()):
            if any(self.tree.inside(call, function) for call in self.sites.calls["scale_loss"]):
                continue
            models = self.tree.models_seen_from(function.body.body[0], self.setup.model_codes)
            returned = [node.value for node in descendants(function.body, nodes.not_a_definition)
                        if type(node) is cst.Return and node.value is not None]
            wanted = set().union(*map(read_names, returned))
            if any(_calls_a_model(node, models) for node in (*returned, *function_slice(function, wanted))):
                return True
        return False

    def _made_by_a_network(self, value: cst.BaseExpression, call: cst.CSTNode, defined: dict, depth: int = 0) -> bool:
        """Whether ``value``, handed in at ``call``, is computed by a call of a model (``self.gen(z)``,
        ``trainer.gen(z)``), or of a function of the file that runs one (``trainer.forward(x)`` whose
        ``forward`` runs ``self.gen``), itself or through the bindings of the name that reach the
        call (``flow.reaching``); not data moved (``x.cuda()``), loaded or parsed."""
        statement = self.tree.statement(call)
        models = self.tree.models_seen_from(statement, self.setup.model_codes)

        fed = fed_lines(self.tree.provider.cache or {})  # an agent's `select_action` whose run `loop_feeds` plans

        def runs(node: cst.CSTNode) -> bool:  # a model, or a function of the file whose body calls one
            return _calls_a_model(node, models) or any(
                self._runs_a_model(nodes.call_name(inner), defined) and self.tree.line(inner) not in fed
                for inner in descendants(node, nodes.not_a_definition) if type(inner) is cst.Call)

        if nodes.code(value) in models:
            return False  # the model itself, handed in: not what it computed

        if not isinstance(value, cst.Name):
            return runs(value)
        graph = self.tree.control_flow(statement, exceptions=True)
        if not graph.holds(statement):
            return False
        # what each binding that reaches gives the name: a loop's iterable, not its body; and
        # what that computed from, a few bindings back (`hidden = self.model(x)`, `out = hidden * 2`)
        for binding in reaching(graph, value.value, statement).bindings:
            for node in binding_nodes(binding, value.value):
                bound = node.iter if type(node) is cst.For else bound_value(node, value.value)
                if runs(bound):
                    return True
                if depth < 3 and bound is not None and type(node) is not cst.For and any(
                        self._made_by_a_network(cst.Name(name), node, defined, depth + 1)
                        for name in sorted(read_names(bound)) if name != value.value and name.isidentifier()):
                    return True
        return False

    def slice_start(self, window: list[cst.BaseStatement], loss: cst.BaseExpression, forward_only: bool = False) -> int | None:
        """The first statement of ``window`` in the backward slice of ``loss``: what the loss is
        computed from, through the names each statement binds (``out = {"l": f(self.model(x))}``
        then ``loss = sum(out.values())``). apex cast everything after ``initialize``; the region
        covers at least what flows into the loss. None where nothing there binds what it reads.
        ``forward_only``: the first such statement that runs a network (``teacher(x)``,
        ``self.head(h)``, ``args.flownet(x)`` where the file puts it in ``eval()``), not one that
        only prepares inputs (``batch[0]``, ``model.parse_batch(b)``)."""
        networks = self.tree.networks if forward_only else None
        return backward_slice(window, read_names(loss), networks)[0]

    def _plan_region(self, statement: cst.CSTNode, loss: str, scale: ScaleLossSite) -> bool:
        """Autocast around the statements before ``statement`` from the model's forward call on
        (in its block, or a block around it); whether that call was found."""
        current = statement
        models = self.tree.models_seen_from(statement, self.setup.model_codes)
        inner: list[list[cst.BaseStatement]] = []  # the windows of the blocks climbed out of
        while True:
            block = self.tree.parent.get(id(current))
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                return False
            window = self.draft.window(block, current)
            start = next((i for i, s in enumerate(window) if self.tree.calls_model(s, models, self.sites.ids)), None)
            if start is not None:
                # and what the loss is computed from before it (a teacher's forward, a model the
                # file reaches under another name): apex cast all of it
                sliced = self.slice_start(window, nodes.parse_expression(loss, self.tree.module), forward_only=True)
                region = window[min(start, sliced if sliced is not None else start):]
                self._wrap(region, scale, loss)
                self._wrap_inner_slices(inner, scale, loss)
                for above in self.slices_above(region) if not inner else ():
                    self._wrap(above, scale, loss)
                for above in self._forwards_above(region, models):
                    self._wrap(above, scale, loss)
                return True
            body = list(block.body)
            before = body.index(window[0] if window else current) - 1
            if before >= 0 and id(body[before]) in self.draft.regions and not any(assigns(s, loss) for s in window):
                # the forward another backward pass went under autocast for (a GAN's D and G steps)
                self._wrap_inner_slices(inner, scale, loss)
                return True
            inner.append(window)
            owner = self._statement_holding(block)
            if not isinstance(owner, (cst.If, cst.Try, cst.With)):
                return False
            current = owner

    def _forwards_above(self, region: list[cst.BaseStatement], models: set[str]) -> list[list[cst.BaseStatement]]:
        """The forward passes above each ``if`` around ``region`` whose outputs it reads (``feat =
        backbone(x)`` above ``if use_head: loss = head(feat)``): apex cast them too. For each
        block, from the first such pass to the ``if``."""
        wanted = set().union(*(read_names(statement) for statement in region))
        slices = []
        for window in self._windows_above(region):
            if not wanted:
                break
            start = None
            for index in range(len(window) - 1, -1, -1):
                if assigned_names(window[index]) & wanted:
                    if self.tree.calls_model(window[index], models, self.sites.ids):
                        start = index
                    wanted |= read_names(window[index])
            if start is not None and not any(id(statement) in self.draft.regions for statement in window[start:]):
                slices.append(window[start:])
        return slices

    def _wrap_inner_slices(self, windows: list[list[cst.BaseStatement]], scale: ScaleLossSite, loss: str) -> None:
        """A region of its own around what the loss is computed from in each arm between the
        forward's region and the scaled backward (``logits = model(x)``, then
        ``if accumulate: loss = criterion(logits, y) / n`` and the backward in that arm): apex cast
        the loss computation too (cross-entropy in float32)."""
        handed = nodes.parse_expression(loss, self.tree.module)  # as the caller names it (`self.backward(objective)`)
        for window in windows:
            start = self.slice_start(window, handed)
            if start is not None:
                self._wrap(window[start:], scale, loss)

    def _repeats_the_region(self, call: cst.Call) -> bool:
        """Whether the file's own ``autocast`` says what the region says: on, CUDA, float16. Inside
        it the rewrite computes as the original did, apex's casts aside as everywhere else."""
        names = qualified_names(self.tree.provider, call.func)
        if names & {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}:
            device, keywords = None, {"enabled", "dtype"}
        elif names & {"torch.autocast", "torch.amp.autocast"}:
            device, keywords = nodes.argument(call, 0, "device_type"), {"device_type", "enabled", "dtype"}
            if device is None or nodes.literal_string(device.value) != "cuda":
                return False
        else:
            return False
        if any(arg.keyword is None and arg is not device for arg in call.args) or any(
                arg.keyword is not None and arg.keyword.value not in keywords for arg in call.args):
            return False
        enabled, dtype = nodes.argument(call, None, "enabled"), nodes.argument(call, None, "dtype")
        return (enabled is None or nodes.code(enabled.value) == "True") and (
            dtype is None or nodes.code(dtype.value) in ("torch.float16", "torch.half"))

    def _callers_handing(self, scale: ScaleLossSite) -> list[tuple[cst.CSTNode, str]]:
        """Where the loss ``scale`` scales is a parameter: each call of its function in the file,
        and the name handed in for it (``self.optimize(loss)``); empty unless all are names."""
        function = self.tree.function(scale.statement)
        if function is None or not isinstance(scale.loss, cst.Name):
            return []
        if scale.loss.value not in {param.name.value for param in function.params.params}:
            return []
        found = [(self.tree.statement(node), self.tree.arguments(function, node).get(scale.loss.value))
                 for node in self.tree.calls_of(function)]
        if not all(isinstance(value, (cst.Name, cst.Attribute)) for _, value in found):
            return []
        return [(statement, nodes.code(value)) for statement, value in found]

    def _widen_own_autocast(self, statements: list[cst.BaseStatement], enabled: str) -> bool:
        """A file with a native path beside apex's (``with torch.cuda.amp.autocast(enabled=native):``
        around the forward) reuses its own region: it is turned on also where the scaler is,
        instead of a second region around it that the inner one would switch off. Whether it did."""
        if len(statements) != 1 or not isinstance(statements[0], cst.With) or len(statements[0].items) != 1:
            return False
        call = statements[0].items[0].item
        if not (isinstance(call, cst.Call) and nodes.call_name(call) == "autocast"):
            return False
        names = qualified_names(self.tree.provider, call.func)
        cuda = "torch.cuda.amp.autocast" in names or "torch.cuda.amp.autocast_mode.autocast" in names or (
            names & {"torch.autocast", "torch.amp.autocast"} and nodes.literal_string(getattr(call.args[0], "value", None) if call.args else None) == "cuda")
        positional = [arg for arg in call.args if arg.keyword is None]
        own = nodes.argument(call, None, "enabled")
        dtype = nodes.argument(call, None, "dtype")
        if not cuda or own is None or len(positional) > (0 if "torch.cuda.amp.autocast" in names else 1):
            return False
        if dtype is not None and nodes.code(dtype.value) not in ("torch.float16", "torch.half"):
            self.draft.unsafe_at(call, f"the file's own autocast at line {self.tree.line(call)} computes in {nodes.code(dtype.value)}, where apex O1 used float16")
        widened = own.with_changes(value=nodes.parse_expression(f"{grouped_text(nodes.code(own.value))} or {grouped_text(enabled)}", self.tree.module))
        self.draft.replace(own, widened)
        self.draft.regions.update(id(statement) for statement in statements)
        self.draft.kind(own, INITIALIZE, "the forward pass of an `amp.initialize`d model runs under apex's casts",
                   "Turn the file's own autocast on where the GradScaler is")
        return True

    @staticmethod
    def _alias_enabled(alias: str) -> str:
        """Whether what received the scaler has an enabled one (the region runs all the same)."""
        return f"{alias_present(alias)} and {alias}.is_enabled()"

    def _wrap(self, statements: list[cst.BaseStatement], scale: ScaleLossSite, loss: str) -> None:
        # Stop at the last statement that computes the loss or calls the model: what follows
        # (``optimizer.zero_grad()``, logging) stays outside the autocast region.
        models = self.tree.models_seen_from(scale.statement, self.setup.model_codes)
        # the names the loss is read from too: `losses` of `scale_loss(losses[0], ...)`
        read = read_names(nodes.parse_expression(loss, self.tree.module))
        relevant = [i for i, s in enumerate(statements)
                    if assigns(s, loss) or assigned_names(s) & read or self.tree.calls_model(s, models, self.sites.ids)]
        if relevant:
            statements = statements[: relevant[-1] + 1]
        enabled = f"{self.setup.scaler}.is_enabled()" if self.setup.may_be_disabled and not self.setup.in_block else None
        if id(scale.call) in self.sites.alias_of:
            enabled = self._alias_enabled(self.sites.alias_of[id(scale.call)])
        if enabled is not None and self._widen_own_autocast(statements, enabled):
            return
        outer = enclosing_autocast(self.tree, statements[0])
        if outer is not None and self.setup.may_be_disabled:
            # a region of ours inside the file's own one, off where the scaler is, would switch it off
            if id(outer) in self.draft.regions or (enabled is not None and self._widen_own_autocast([outer], enabled)):
                return
            self.draft.unsafe_at(outer.items[0].item, f"the file's own `autocast` at line {self.tree.line(outer)} holds the forward: "
                                 "a region inside it, off where the GradScaler is, would switch it off")
        inner = [call for statement in statements for call in calls(statement, lambda name: name == "autocast")
                 if not self._repeats_the_region(call)]
        if inner:
            # apex cast by patching functions, whatever native autocast said: a region the file
            # turns native autocast off in (or to another dtype) now computes differently.
            self.draft.unsafe_at(inner[0], f"the file's own `autocast` at line {self.tree.line(inner[0])} is inside the region: "
                               "there native autocast follows it, where apex's casts did not")
        enabled = f", enabled={self.setup.scaler}.is_enabled()" if self.setup.may_be_disabled else ""
        arms = self._arms_condition(scale, statements)
        if arms is not None:
            arms = as_bool(nodes.parse_expression(arms, self.tree.module), self.tree.boolean_options)
            enabled = f"{enabled} and {grouped_text(arms)}" if enabled else f", enabled={arms}"
        if self.setup.in_block:
            # The block that creates the scaler may not have run (`if use_amp and not ready:`):
            # then there is no scaler, and apex was not on either.
            enabled = f", enabled={attribute_set(self.setup.scaler)} and {self.setup.scaler}.is_enabled()"
        if id(scale.call) in self.sites.alias_of:
            enabled = ", enabled=" + self._alias_enabled(self.sites.alias_of[id(scale.call)])

        first = statements[0]
        self.draft.replace(first, self.under_autocast(statements, enabled))
        self.draft.kind(first, INITIALIZE, "the forward pass of an `amp.initialize`d model runs under apex's casts", "Wrap the forward pass and the loss in `torch.autocast`")
        self.move_into_region(statements[1:], "the forward pass of an `amp.initialize`d model runs under apex's casts")
        self.draft.regions.add(id(first))
        self.draft.region_enabled[id(first)] = enabled

    def _arms_condition(self, scale: ScaleLossSite, statements: list[cst.BaseStatement]) -> str | None:
        """In a file that scales the loss but initializes nothing (``initialize`` is elsewhere, its
        flag unseen): the test of the arms the scaled backward runs in below the region's block
        (``elif not cfg.amp == "None":`` beside a native arm and a plain one), under which apex
        had been initialized, as the file reads it, less the tests of what the region assigns. None
        where there is none left, a test calls something, or a loop is on the way."""
        if self.sites.calls["initialize"]:
            return None
        region_block = self.tree.parent.get(id(statements[0]))
        tests: list[str] = []
        current: cst.CSTNode = scale.statement
        while self.tree.parent.get(id(current)) is not region_block:
            block = self.tree.parent.get(id(current))
            owner = self.tree.parent.get(id(block))
            if not isinstance(owner, (cst.If, cst.Else)):
                return None
            test = StepConditions(self.context).branch_condition(owner)
            if test is None:
                return None
            tests.append(test)
            while isinstance(owner, cst.Else) or isinstance(self.tree.parent.get(id(owner)), (cst.If, cst.Else)) and isinstance(owner, cst.If) \
                    and self.tree.parent.get(id(owner)).orelse is owner:
                owner = self.tree.parent.get(id(owner))
            current = owner
        # a test of what the region computes (`if loss is not None:`) is asked after it: left out
        assigned = set().union(*(assigned_names(statement) for statement in statements))
        tests = [test for test in tests if not read_names(nodes.parse_expression(test, self.tree.module)) & assigned]
        if not tests:
            return None
        return " and ".join(grouped_text(test) for test in reversed(tests))

    def under_autocast(self, statements: list[cst.BaseStatement], enabled: str = "") -> cst.With:
        """``with torch.autocast(...):`` holding ``statements``, with the lines that stood above the first."""
        head = nodes.parse_statements(f"with {AUTOCAST.format(enabled=enabled)}:\n    pass\n", self.tree.module)[0]
        if self.tree.line_indent(statements[0]) + len(nodes.code(head).splitlines()[0]) > self.tree.line_limit:
            # `with torch.autocast(` / its arguments on one line, or one a line / `):`, as a formatter writes it
            call = head.items[0].item
            indent = self.tree.indent_unit(statements[0])
            arguments = ", ".join(nodes.code(arg).rstrip(", ") for arg in call.args)
            room = self.tree.line_limit - self.tree.line_indent(statements[0]) - len(indent)
            layout = f"\n{indent}{arguments}\n" if len(arguments) <= room else "".join(
                f"\n{indent}{nodes.code(arg).rstrip(', ')}," for arg in call.args) + "\n"
            head = nodes.parse_statements(f"with torch.autocast({layout}):\n    pass\n", self.tree.module, indent)[0]
        body = [nodes.with_leading(statements[0], cst.SimpleStatementLine([])), *statements[1:]]
        return head.with_changes(body=head.body.with_changes(body=body), leading_lines=statements[0].leading_lines)

    def move_into_region(self, statements: list[cst.BaseStatement], message: str) -> None:
        """``statements`` leave their place: the autocast block that holds them replaces another."""
        for statement in statements:
            self.draft.replace(statement, cst.RemoveFromParent())
            self.draft.kind(statement, INITIALIZE, message, "Moved under `torch.autocast`")
        self.draft.regions.update(id(statement) for statement in statements)


def _calls_a_model(node: cst.CSTNode, models: set[str]) -> bool:
    """Whether ``node`` calls one of ``models`` (``self.gen(z)``; ``trainer.gen(z)`` for ``self.gen``)."""
    return any(type(inner) is cst.Call and (nodes.code(inner.func) in models or (
        isinstance(inner.func, cst.Attribute) and f"self.{inner.func.attr.value}" in models))
        for inner in descendants(node, nodes.not_a_definition))


def _by_name(functions) -> dict[str, list[cst.FunctionDef]]:
    found: dict[str, list[cst.FunctionDef]] = {}
    for function in functions:
        found.setdefault(function.name.value, []).append(function)
    return found
