"""O1 inference: ``amp.initialize`` readies models for inference and only the lines after it,
to the end of its function, run after it. apex cast every op from there on, as an autocast around
those lines does (``else: model = amp.initialize(model, opt_level="O1")``, then the evaluation).
The legacy handle left unused (a test script's ``amp_handle = amp.init(enabled=fp16)``, then the
evaluation) switched the same casts on, for the rest of the process."""
from __future__ import annotations

import re

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.autocast import AutocastPlanning
from migrate.apex_plan.context import Step
from migrate.apex_plan.hidden_readers import helpers_reached
from migrate.apex_plan.initialize import InitializePlanning
from migrate.apex_plan.loss_slice import calls_model as passes_through_model
from migrate.apex_plan.syntax import SUSPENDS, assigned_names, backward_calls, calls, contains, defines, read_names, reads_any
from migrate.step_model.vocabulary import moves_only
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.unused_optimizers import optimizers_unused
from migrate.apex_plan.vocabulary import INITIALIZE, InitializeSite, as_bool, conjunction, operand
from migrate.tree_walk import descendants

# What an inference `initialize` leaves for autocast: the statement it goes with, the lines after
# it (one region), or the arms that run on its way only (a region each), and the regions' `enabled`.
Tail = tuple[cst.CSTNode, list[cst.BaseStatement], str]
ArmsTail = tuple[cst.CSTNode, list[list[cst.BaseStatement]], str]

_TRAINING_CALLS = frozenset({"step", "scale_loss", "autocast"})
_TRAINING_NAME = re.compile(r"train|fit", re.IGNORECASE)
# what a script may still call once its main function returned: none computes with tensors
_IDLE_CALLS = frozenset({"empty_cache", "synchronize", "destroy_process_group", "barrier", "print", "exit"})
# what a line run on every way may call after an inference `initialize` in one arm: it readies the
# model or reports, and computes nothing apex's casts reach
_READYING_CALLS = frozenset({"DataParallel", "DistributedDataParallel", "device_count", "is_available", "get_rank",
                             "get_world_size", "info", "warning", "debug", "len", "str", "int", "format", "device"})


class InferenceTailPlanning(Step):
    """It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the
    ``Draft`` (the region through ``AutocastPlanning``'s own steps)."""

    def inference_tail(self, init: InitializeSite, imported_elsewhere: frozenset[str] = frozenset()) -> Tail | ArmsTail | None:
        """Where ``init`` readies models for inference at O1 and only the lines after it, to the end
        of its function, run after it: apex cast every op from there on, as autocast around those
        lines does (``else: model = amp.initialize(model, opt_level="O1")``, then the evaluation).
        Its optimizers, where it was given some, are used nowhere after it (``unused_optimizers``);
        its level may be known at run time, where it is O0 or O1 (then the region is on for O1).

        The statement ``init`` leaves (itself, or the ``if flag:`` whose arm it ends), the lines
        after it that go under autocast, and the region's ``enabled`` (the flag's test, or none).
        ``imported_elsewhere``: the file's functions other files import."""
        level_on = self._level_on(init)
        if level_on is None or init.enabled is not None or not (init.inference or optimizers_unused(self.tree, init)):
            return None
        if init.restore is not None and init.restore.startswith("return "):
            return None
        if any("." in code for code in init.model_codes):
            return None  # a model kept on an object may run elsewhere, later
        anchor, tests = init.statement, [level_on] if level_on else []
        block = self.tree.parent.get(id(anchor))
        owner = self.tree.parent.get(id(block))
        if (list(block.body)[-1] is init.statement and init.restore is None and isinstance(owner, cst.If) and owner.body is block
                and nodes.is_pure(owner.test)
                and isinstance(self.tree.parent.get(id(owner)), (cst.IndentedBlock, cst.Module))):  # not an `elif`
            # `if has_amp: model = amp.initialize(model, ...)` last in its arm, then the evaluation:
            # autocast on the lines after the `if`, when its test held.
            anchor, block = owner, self.tree.parent.get(id(owner))
            tests.insert(0, as_bool(owner.test, self.tree.boolean_options))
        enabled = f", enabled={conjunction(tests)}" if tests else ""
        body = list(block.body)
        rest = body[body.index(anchor) + 1 :]
        if not rest:
            arms = self._arms_on_its_way(block, init.model_codes, read_names(init.level_expression) if level_on else set())
            return (anchor, arms, enabled) if arms and not (enabled and anchor is not init.statement and self.tree.changes_its_test(
                anchor, [s for arm in arms for s in arm])) else None
        holders = holders_of(self.tree, rest, init.model_codes)
        training = next((index for index, statement in enumerate(rest) if trains(self.tree, statement, init.model_codes, holders)), None)
        if training is not None:
            # `train(args, model)` after the evaluation: its own regions, nested in this one, would
            # keep autocast's cast weights from one step to the next (cleared where the outermost
            # region exits); the region stops before it, where nothing after it runs the model
            if any(self._runs_model(s, init.model_codes) for s in rest[training + 1:]):
                return None
            rest = rest[:training]
        if not any(self._runs_model(s, init.model_codes) for s in rest):
            return None
        if any(defines(s) or contains(s, SUSPENDS) for s in rest):
            return None
        if any(self._returns_models(s, init.model_codes) for s in rest) and not self._callers_drop_models(rest, init.model_codes, imported_elsewhere):
            return None  # its caller may run the model it gets back, outside
        if enabled and (anchor is not init.statement and self.tree.changes_its_test(anchor, rest)
                        or level_on and read_names(init.level_expression) & {n for s in rest for n in assigned_names(s)}):
            return None  # the flag, or the level, may differ by the time the lines after it run
        return (anchor, rest, enabled) if self._runs_last(block) else None

    def _runs_model(self, statement: cst.CSTNode, models: set[str]) -> bool:
        """Whether ``statement`` runs one of ``models``: a call of it or of what it is handed to, or
        of one of its methods that computes (``model.encode_q(ids, mask)``), also in the file's helpers."""
        return self.tree.calls_model(statement, models, self.sites.ids) or any(
            passes_through_model(each, models) for each in [statement, *helpers_reached(self.tree, statement, frozenset())])

    def _arms_on_its_way(self, arm: cst.IndentedBlock, models: set[str], level: set[str]) -> list[list[cst.BaseStatement]] | None:
        """Where ``arm``, ending with the inference ``initialize``, is an arm of ``if flag: ... else:
        ...`` (``if args.do_train:`` readies for training, ``else:`` for inference) and the lines after
        that ``if``, to the end of the function, run the model only in the arms of a later ``if`` on
        the same test that run on this way (``if args.do_train: train ... elif args.do_predict:
        predict(model)``): those arms, each a region. Every other line after it only readies the
        model or reports (``model = torch.nn.DataParallel(model)``), and nothing after it changes the
        flag or the level."""
        owner = self.tree.parent.get(id(arm))
        branch = self.tree.parent.get(id(owner)) if isinstance(owner, cst.Else) else owner
        if not isinstance(branch, cst.If) or not nodes.is_pure(branch.test) or (owner is branch and branch.body is not arm):
            return None
        block = self.tree.parent.get(id(branch))
        if not isinstance(block, (cst.IndentedBlock, cst.Module)) or not self._runs_last(block):
            return None  # an `elif`, or a block that runs again
        holds = owner is branch  # the flag's value on this way
        if not holds and not isinstance(branch.orelse, cst.Else):
            return None
        body = list(block.body)
        after = body[body.index(branch) + 1 :]
        flags = read_names(branch.test) | level
        holders = holders_of(self.tree, after, models)
        arms: list[list[cst.BaseStatement]] = []
        for statement in after:
            if defines(statement) or contains(statement, SUSPENDS) or flags & assigned_names(statement) or self._returns_models(statement, models):
                return None
            if isinstance(statement, cst.If) and nodes.code(statement.test) == nodes.code(branch.test):
                run = self._arms_run(statement, holds)
                if run is None:
                    return None
                arms += run
            elif not self._readies(statement, models) or trains(self.tree, statement, models, holders):
                return None  # it may compute where apex cast it, outside the regions
        arms = [arm for arm in arms if arm]
        if not any(self._runs_model(s, models) for arm in arms for s in arm) or any(
                trains(self.tree, s, models, holders) or self._returns_models(s, models) for arm in arms for s in arm):
            return None
        return arms

    def _arms_run(self, branch: cst.If, holds: bool) -> list[list[cst.BaseStatement]] | None:
        """The bodies of ``branch``'s arms that may run where its test ``holds`` (or not): its own
        body, or each arm of its ``elif``/``else`` chain (whose tests read the same each time)."""
        if holds:
            return [list(branch.body.body)]
        found: list[list[cst.BaseStatement]] = []
        rest = branch.orelse
        while isinstance(rest, cst.If):
            if not nodes.is_pure(rest.test):
                return None  # a test that computes would run outside the regions
            found.append(list(rest.body.body))
            rest = rest.orelse
        if isinstance(rest, cst.Else):
            found.append(list(rest.body.body))
        return found

    def _readies(self, statement: cst.CSTNode, models: set[str]) -> bool:
        """Whether ``statement`` only wraps or moves the model and reports (``if n_gpu > 1: model =
        torch.nn.DataParallel(model)``, ``model.to(device)``, ``logger.info(...)``): none of its calls computes."""
        return all(moves_only(call) or nodes.call_name(call) in _READYING_CALLS | _IDLE_CALLS
                   for call in calls(statement, lambda name: True)) and not passes_through_model(statement, models)

    def _level_on(self, init: InitializeSite) -> str | None:
        """The test under which ``init``'s level is O1: "" where it is O1 as written, ``level !=
        "O0"`` where it is known at run time and can be only O0 or O1; None where it can be
        another (O2 and O3 cast the model itself, not what runs)."""
        if init.level_expression is None:
            return "" if init.level == "O1" else None
        possible = InitializePlanning(self.context).possible_levels(init.level_expression)
        if not init.guard_level and (possible is None or "O1" not in possible or not possible <= {"O0", "O1"}):
            return None  # a guarded level stops O2/O3 at run time (`run_time_checks`), as for training
        return f'{operand(init.level_expression)} != "O0"'

    def _callers_drop_models(self, rest: list[cst.BaseStatement], models: set[str], imported_elsewhere: frozenset[str]) -> bool:
        """Whether what ``rest`` returns reaches no code that could run a model: the function, at
        module level and imported by no other file, hands its models back in the same places of a
        tuple (``return model, results``) and each call of it in the file drops them there
        (``_, results = evaluate(cfg)``): the one name bound there is read nowhere."""
        function = self.tree.function(rest[0])
        if function is None or self.tree.parent.get(id(function)) is not self.tree.module or function.name.value in imported_elsewhere:
            return False
        returned = [node.value for s in rest for node in descendants(s, nodes.not_a_definition) if type(node) is cst.Return]
        if not returned or not all(isinstance(value, cst.Tuple) and len(value.elements) == len(returned[0].elements)
                                   and not any(isinstance(e, cst.StarredElement) for e in value.elements) for value in returned):
            return False
        places = {i for value in returned for i, element in enumerate(value.elements) if read_names(element.value) & models}
        uses = [node for node in descendants(self.tree.module) if type(node) is cst.Name and node.value == function.name.value
                and node is not function.name]
        calls = self.tree.calls_of(function)
        if not calls or len(calls) != len(uses):
            return False  # handed on (`launch(evaluate)`), or called through something else
        for call in calls:
            assign = self.tree.parent.get(id(call))
            if not isinstance(assign, cst.Assign) or assign.value is not call or len(assign.targets) != 1:
                return False
            target = assign.targets[0].target
            if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != len(returned[0].elements):
                return False
            dropped = [target.elements[i].value for i in places]
            caller = self.tree.function(call)
            if not all(isinstance(name, cst.Name) for name in dropped) or (caller is None and any(n.value != "_" for n in dropped)):
                return False
            if caller is not None and reads_any(caller, {name.value for name in dropped}, self.tree.parent):
                return False
        return True

    def handle_tail(self, call: cst.Call, imported_elsewhere: frozenset[str]) -> tuple[Tail, str | None] | None:
        """Where the legacy handle (``amp_handle = amp.init(enabled=fp16)``, never used) switched
        apex's casts on in a function and only the lines after it, to the end of that function, run
        after it: those lines under autocast (``enabled`` as the handle was), and why that may differ
        (None where the function is the script's last act: apex's casts stayed on after it returned,
        for the rest of the process, where nothing else runs). ``imported_elsewhere``: the file's
        functions other files import."""
        if nodes.has_star(call) or (banned := nodes.argument(call, 4, "allow_banned")) is not None and nodes.code(banned.value) != "False":
            return None  # apex let banned functions (binary_cross_entropy) take float16; autocast raises there
        statement = self.tree.statement(call)
        function = self.tree.function(statement)
        block = self.tree.parent.get(id(statement))
        if function is None or not self._runs_last(block):
            return None
        body = list(block.body)
        rest = body[body.index(statement) + 1 :]
        if not rest or any(defines(s) or contains(s, SUSPENDS) or trains(self.tree, s, set()) for s in rest):
            return None  # a training step keeps apex's casts on its own regions
        enabled = nodes.argument(call, 0, "enabled")
        on = "" if enabled is None or nodes.code(enabled.value) == "True" else f", enabled={as_bool(enabled.value, self.tree.boolean_options)}"
        why = None if self._script_ends_with(function, imported_elsewhere) else (
            f"the legacy `amp.init()` handle (line {self.tree.line(call)}) switched apex's casts on for the rest of the "
            f"process: autocast covers the rest of `{function.name.value}` only, and this file does not show that nothing "
            "runs after it returns")
        return (statement, rest, on), why

    def _runs_last(self, block: cst.CSTNode) -> bool:
        """Whether ``block`` ends its function (or the module): it, and each block around it, the last that runs in its own
        (an arm of an ``if``, a ``with``; not a loop, which runs what came before again, nor a ``try``)."""
        current = block
        while not isinstance(current, cst.Module):
            statement = self.tree.parent.get(id(current))
            if isinstance(statement, cst.FunctionDef):
                return True
            while isinstance(statement, cst.Else) or isinstance(self.tree.parent.get(id(statement)), (cst.If, cst.Else)):
                statement = self.tree.parent.get(id(statement))  # an `else`/`elif` arm: the whole `if` decides
            if not isinstance(statement, (cst.If, cst.With)):
                return False
            current = self.tree.parent.get(id(statement))
            if not isinstance(current, (cst.IndentedBlock, cst.Module)) or list(current.body)[-1] is not statement:
                return False
        return True  # the module's own lines: the script's last

    def _script_ends_with(self, function: cst.FunctionDef, imported_elsewhere: frozenset[str]) -> bool:
        """Whether ``function`` (at module level, imported by no other file) is called only by the
        file's last statement, or the last of its closing ``if __name__ == "__main__":`` block
        (``main()``, ``sys.exit(main(args))``), or one followed there only by lines that compute
        nothing (``torch.cuda.empty_cache()``, ``print("done")``): the process ends after it returns."""
        name = function.name.value
        if self.tree.parent.get(id(function)) is not self.tree.module or name in imported_elsewhere:
            return False
        closing = list(self.tree.module.body)
        last = closing[-1]
        if isinstance(last, cst.If) and last.orelse is None and nodes.code(last.test).replace("'", '"') == '__name__ == "__main__"':
            closing = list(last.body.body)
        uses = [node for node in descendants(self.tree.module) if type(node) is cst.Name and node.value == name and node is not function.name]
        calling = next((statement for statement in closing if uses and self.tree.inside(uses[0], statement)), None)
        return calling is not None and isinstance(calling, cst.SimpleStatementLine) and len(calling.body) == 1 and all(
            self.tree.inside(use, calling) and isinstance(call := self.tree.parent.get(id(use)), cst.Call) and call.func is use
            for use in uses) and all(_idle(statement) for statement in closing[closing.index(calling) + 1 :])

    @staticmethod
    def _returns_models(statement: cst.CSTNode, models: set[str]) -> bool:
        """A ``return`` that may hand a model back (``return results`` with numbers only does not)."""
        return any(
            node.value is None or bool(read_names(node.value) & models)
            for node in descendants(statement, lambda node: type(node) is not cst.FunctionDef)
            if type(node) is cst.Return
        )

    def plan_inference_tail(self, init: InitializeSite, tail: Tail | ArmsTail) -> None:
        """The lines after ``init`` (or after the ``if flag:`` whose arm it ends) go under autocast;
        the call goes (its models are the ones passed in, as under O1)."""
        anchor, rest, enabled = tail
        placed = nodes.parse_statements(init.restore + "\n", self.tree.module) if init.restore else []
        checks = InitializePlanning(self.context).run_time_checks(init, anchor if anchor is not init.statement else None)
        placed += nodes.parse_statements("\n".join(checks) + "\n", self.tree.module) if checks else []
        if anchor is not init.statement:  # the `if` keeps what else it holds
            kept = [statement for statement in anchor.body.body if statement is not init.statement]
            if kept or anchor.orelse is not None:
                placed.insert(0, anchor.with_changes(body=anchor.body.with_changes(body=kept or [cst.SimpleStatementLine([cst.Pass()])])))
        message, moved = "`amp.initialize` readies the models for inference under apex's casts", "what runs after `amp.initialize` ran under apex's casts"
        if rest and isinstance(rest[0], list):  # the arms that run on its way, a region each
            arm_of_anchor = list(self.tree.parent[id(anchor)].body)
            self.draft.replace(anchor, cst.FlattenSentinel(placed) if placed else cst.RemoveFromParent() if len(arm_of_anchor) > 1
                               else nodes.with_leading(cst.SimpleStatementLine([cst.Pass()]), anchor))
            self.draft.kind(anchor, INITIALIZE, message, "Run the arms that run after it on its way under `torch.autocast`: apex cast every op from there on")
            regions = AutocastPlanning(self.context)
            for arm in rest:
                self.draft.replace(arm[0], cst.FlattenSentinel([regions.under_autocast(arm, enabled)]))
                self.draft.kind(arm[0], INITIALIZE, moved, "Moved under `torch.autocast`")
                regions.move_into_region(arm[1:], moved)
                self.draft.regions.add(id(arm[0]))
            return
        self._under_autocast(anchor, placed, rest, enabled, message, moved)

    def plan_handle_tail(self, tail: Tail) -> None:
        """The legacy handle's statement goes, and the lines after it go under autocast."""
        anchor, rest, enabled = tail
        self._under_autocast(anchor, [], rest, enabled, "the legacy `amp.init()` handle switches apex's casts on",
                             "what runs after `amp.init()` ran under apex's casts")

    def _under_autocast(self, anchor: cst.CSTNode, placed: list[cst.BaseStatement], rest: list[cst.BaseStatement], enabled: str,
                        message: str, moved: str) -> None:
        """``anchor`` becomes ``placed`` then an autocast region holding ``rest``."""
        regions = AutocastPlanning(self.context)
        region = regions.under_autocast(rest, enabled)
        placed = [*placed, region]
        # The first line takes the place of `anchor`; the region keeps the blank lines above the
        # lines it holds.
        placed = [nodes.with_leading(statement, anchor) if i == 0 else statement if statement is region
                  else nodes.with_leading(statement, cst.SimpleStatementLine([])) for i, statement in enumerate(placed)]
        self.draft.replace(anchor, cst.FlattenSentinel(placed))
        self.draft.kind(anchor, INITIALIZE, message, "Run the lines after it under `torch.autocast`: apex cast every op from there on")
        regions.move_into_region(rest, moved)


def trains(tree: FileTree, statement: cst.CSTNode, models: set[str], holders: frozenset[str] = frozenset(), own_regions: bool = True) -> bool:
    """Whether ``statement``, or a function of the file it reaches, runs a backward pass, steps,
    scales a loss or enters an autocast region of its own; or hands one of ``models`` to a
    function not of the file that is named for training (``fit(model, loader)``, ``run_training(model)``),
    or calls such a method of what was made from one (``Bot(model, optimizer).train()``; of
    ``holders``, the names bound to such objects: ``bot = Bot(model, optimizer)``, ``bot.train()``).
    ``own_regions``: whether a region of its own counts (not for an evaluation, which updates no
    weight inside an outer region: ``with torch.cuda.amp.autocast():`` in its native-mode arm)."""
    reached = [statement, *helpers_reached(tree, statement, frozenset())]
    training_calls = _TRAINING_CALLS if own_regions else _TRAINING_CALLS - {"autocast"}
    return any(backward_calls(each) or calls(each, lambda name: name in training_calls) for each in reached) or any(
        tree.helper(call) is None and _TRAINING_NAME.search(nodes.code(call.func).rsplit(".", 1)[-1])
        and (any(nodes.code(arg.value) in models for arg in call.args) or isinstance(call.func, cst.Attribute) and (
            nodes.code(call.func.value) in holders or isinstance(call.func.value, cst.Call) and bool(read_names(call.func.value) & models)))
        for call in calls(statement, lambda name: True))


def holders_of(tree: FileTree, statements: list[cst.BaseStatement], models: set[str]) -> frozenset[str]:
    """The names ``statements`` bind to what a call not of the file made from one of ``models``
    (``bot = Bot(model, optimizer)``), but for the model's own wrappers and moves."""
    found = set()
    for statement in statements:
        for node in descendants(statement, nodes.not_a_definition):
            if (type(node) is cst.Assign and isinstance(node.value, cst.Call) and tree.helper(node.value) is None
                    and not moves_only(node.value) and nodes.call_name(node.value) not in _READYING_CALLS
                    and any(nodes.code(arg.value) in models for arg in node.value.args)):
                found.update(nodes.code(target.target) for target in node.targets)
    return frozenset(found - models)


def _idle(statement: cst.CSTNode) -> bool:
    """Whether ``statement`` only calls what computes nothing apex's casts reach (``torch.cuda.empty_cache()``)."""
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
        and nodes.code(small.value.func).rsplit(".", 1)[-1] in _IDLE_CALLS for small in statement.body)
