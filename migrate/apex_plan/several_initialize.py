"""Several ``amp.initialize`` calls in one file: which one makes the scaler, and what the others are.

A second identical call (re-initialising before loading a checkpoint) starts a fresh scaler, as
apex started a fresh loss scaler; a call for other models with the same options right after the
first (a GAN's second network, an EMA copy) or an O1 copy readied for inference under the same
tests (a teacher) just goes: apex kept one loss scaler for all and cast every model alike. Any
other extra call makes the rewrite unsafe.
"""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.conditions import flag_if, tests_a_parameter
from migrate.apex_plan.context import Step
from migrate.apex_plan.initialize import InitializePlanning
from migrate.apex_plan.syntax import backward_calls, imports_apex
from migrate.apex_plan.vocabulary import AUTOCAST, INITIALIZE, InitializeSite, normal
from migrate.tree_walk import walk


# Why a model readied for inference at O1 (or a level known at run time) is an unsafe removal.
INFERENCE_CAST = "`amp.initialize` without optimizers (inference ran under apex's casts): put it under `torch.autocast` by hand"


# Why a model readied for inference at O3, not kept as ``model.half()``, is an unsafe removal.
INFERENCE_IN_HALF = "`amp.initialize` without optimizers at O3: apex ran the model in float16, weights and inputs"


def inference_step(init: InitializeSite) -> str:
    """What to do where a call readying a model for inference is removed: apex cast (O1) or
    halved (O2, O3) that model from there on."""
    model = nodes.argument(init.call, 0, "models").value
    named = model.elements[0].value if isinstance(model, (cst.List, cst.Tuple)) and len(model.elements) == 1 else model
    models = " ".join(nodes.code(named).split())  # `[self.model]` is `self.model`
    if isinstance(named, cst.Call) and init.restore and not init.restore.startswith("return "):
        # `model, opt = amp.initialize(model.cuda(), opt)`: what computes is `model`
        models = init.restore.split(" = ", 1)[0].split(",")[0].strip(" ()[]")
    enabled = nodes.argument(init.call, 2, "enabled")
    flag = " ".join(nodes.code(enabled.value).split()) if enabled is not None else "True"
    where, autocast = ("", AUTOCAST.format(enabled="")) if flag == "True" else (f" where `{flag}`", AUTOCAST.format(enabled=f", enabled={flag}"))
    if init.level in ("O2", "O3"):
        return f"apex {init.level} ran `{models}` in float16{where}, weights and inputs: call `.half()` on both, or run it under {autocast}"
    return f"run `{models}` under {autocast} where it computes: apex cast it from here on"


def marks_inference(init: InitializeSite) -> bool:
    """Whether a call readying a model for inference is removed with a marker: apex cast it."""
    return init.inference and init.level != "O0"


def halved(init: InitializeSite) -> bool:
    """O3 for inference whose model becomes ``model.half()``: a model by name, its result assigned."""
    model = nodes.argument(init.call, 0, "models").value
    assigned = isinstance(init.statement, cst.SimpleStatementLine) and isinstance(init.statement.body[0], cst.Assign)
    return init.inference and init.level == "O3" and bool(init.restore or assigned) and isinstance(model, (cst.Name, cst.Attribute))


class SeveralInitializePlanning(Step):
    """Several ``amp.initialize`` calls in one file: repeats, joined models, inference-only copies.

    It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the ``Draft``.
    """

    def repeats(self, first: InitializeSite, again: InitializeSite) -> bool:
        """``again`` initializes as ``first`` did (re-initialising before loading a checkpoint), in
        its function, outside any block that could make the scaler's flag differ: apex started
        a fresh loss scaler there, as a fresh GradScaler does."""
        same = normal(nodes.code(first.call)) == normal(nodes.code(again.call)) and first.restore == again.restore
        function = self.tree.function(first.statement)
        at_top = isinstance(self.tree.parent.get(id(first.statement)), cst.Module) or (
            function is not None and self._at_top(first.statement, function))
        return same and at_top and function is self.tree.function(again.statement)

    def elsewhere(self, first: InitializeSite, others: list[InitializeSite], hoist: cst.If | None,
                  scope: str) -> dict[int, cst.If | None]:
        """Of ``others``, the calls with ``first``'s options in another function, each with the
        ``if`` its scaler is hoisted out of (or None): placed as ``first`` is, at the top of its
        function or alone under an ``if`` of the same test there (``hoist``'s), and the scaler one
        every function sees (a module global, or ``self``'s in methods). apex started a fresh loss
        scaler at each call, as a GradScaler made there again does."""
        mine, function = self._options(first), self.tree.function(first.statement)
        if mine is None or function is None or first.inference or scope not in ("global", "self"):
            return {}
        if not self._at_top(hoist or first.statement, function) or (scope == "self" and not self._method(function)):
            return {}
        found: dict[int, cst.If | None] = {}
        for again in others:
            theirs = self.tree.function(again.statement)
            if (again.inference or self._options(again) != mine or theirs is None or theirs is function
                    or (scope == "self" and not self._method(theirs))):
                continue
            if hoist is None and self._at_top(again.statement, theirs):
                found[id(again)] = None
                continue
            around = self.tree.parent.get(id(self.tree.parent.get(id(again.statement))))
            if (hoist is not None and isinstance(around, cst.If) and around.orelse is None and self._at_top(around, theirs)
                    and normal(nodes.code(around.test)) == normal(nodes.code(hoist.test))
                    and (nodes.is_pure(around.test) or len(around.body.body) == 1)):
                found[id(again)] = around
        return found

    def mirrored(self, first: InitializeSite, apart: list[InitializeSite], hoist: cst.If | None) -> dict[int, cst.If | None] | None:
        """Where ``first`` and the calls ``apart`` from it sit in the arms of one ``if``/``elif``/
        ``else`` chain at the top of their function (``if multi_gpu: initialize; DDP(...) else:
        initialize``), one in each arm, with the same options and placed alike (in the arm, or
        alone under an ``if`` of ``hoist``'s test there): each of ``apart``, with the ``if`` its
        scaler is hoisted out of. The scaler is then made in every arm, so it exists after the
        chain whichever ran, as apex's loss scaler did. None where they are not so."""
        mine, function = self._options(first), self.tree.function(first.statement)
        if mine is None or function is None or first.inference:
            return None
        chain = self._arm_chain(hoist or first.statement, function)
        if chain is None:
            return None
        found: dict[int, cst.If | None] = {}
        for again in apart:
            if again.inference or self._options(again) != mine or self.tree.function(again.statement) is not function:
                return None
            placed: cst.CSTNode = again.statement
            if hoist is not None:
                placed = self.tree.parent.get(id(self.tree.parent.get(id(again.statement))))
                if not (isinstance(placed, cst.If) and placed.orelse is None
                        and normal(nodes.code(placed.test)) == normal(nodes.code(hoist.test))
                        and (nodes.is_pure(placed.test) or len(placed.body.body) == 1)):
                    return None
            if self._arm_chain(placed, function) != chain:
                return None
            found[id(again)] = placed if hoist is not None else None
        arms_held = {id(self.tree.parent.get(id(placed))) for placed in (hoist or first.statement, *(
            value if value is not None else next(a.statement for a in apart if id(a) == key) for key, value in found.items()))}
        return found if len(arms_held) == len(chain) == 1 + len(found) else None

    def _arm_chain(self, statement: cst.CSTNode, function: cst.FunctionDef) -> tuple[int, ...] | None:
        """The blocks of the ``if``/``elif``/``else`` chain whose arm holds ``statement`` directly
        (as ids), the chain at the top of ``function`` and ending in ``else``; None otherwise."""
        found = self._chain_of(statement)
        if found is None or not self._at_top(found[0], function):
            return None
        return tuple(id(block) for block in found[1])

    def _chain_of(self, statement: cst.CSTNode) -> tuple[cst.If, list[cst.IndentedBlock]] | None:
        """The ``if``/``elif``/``else`` chain whose arm holds ``statement`` directly, ending in
        ``else``, and the blocks of its arms; None otherwise (a way through no arm)."""
        block = self.tree.parent.get(id(statement))
        owner = self.tree.parent.get(id(block))
        if not isinstance(block, cst.IndentedBlock) or not isinstance(owner, (cst.If, cst.Else)):
            return None
        top = owner
        while isinstance(self.tree.parent.get(id(top)), cst.If) and self.tree.parent.get(id(top)).orelse is top:
            top = self.tree.parent.get(id(top))
        if not isinstance(top, cst.If):
            return None
        blocks, arm = [], top
        while isinstance(arm, cst.If):
            blocks.append(arm.body)
            arm = arm.orelse
        if not isinstance(arm, cst.Else):
            return None  # a way through no arm would make no scaler
        return top, [*blocks, arm.body]

    def chained_under_flag(self, first: InitializeSite, apart: list[InitializeSite], scope: str) -> tuple[cst.If, cst.If] | None:
        """Where ``first`` and the calls ``apart`` from it are each alone in one arm of an
        ``if``/``elif``/``else`` chain of plain tests, with the same options and nothing to restore
        (``if t_cfg: [model, t_model], optimizer = amp.initialize([model, t_model], optimizer,
        opt_level="O1")`` ``else: model, optimizer = amp.initialize(model, optimizer, opt_level="O1")``),
        and the chain is alone under an ``if flag:`` whose test says whether apex ran
        (``conditions.flag_if``): that ``if`` and the chain. Whichever arm ran, apex made its one
        loss scaler alike and cast every model, so the chain is one ``initialize`` under the flag:
        the scaler is made before the ``if``, enabled by its test, and the chain goes."""
        mine = self._options(first)
        if mine is None or any(site.inference or site.restore is not None or self._options(site) != mine for site in (first, *apart)):
            return None
        found = self._chain_of(first.statement)
        if found is None:
            return None
        chain, blocks = found
        arms = {id(self.tree.parent.get(id(site.statement))) for site in (first, *apart)}
        if len(blocks) != 1 + len(apart) or arms != {id(block) for block in blocks} or any(
                len([line for line in block.body if not _imports_amp(line)]) != 1 for block in blocks):
            return None
        tests, arm = [], chain
        while isinstance(arm, cst.If):
            tests.append(arm.test)
            arm = arm.orelse
        flag = flag_if(self.tree, chain, self.sites.calls["initialize"])
        if flag is None or list(flag.body.body) != [chain] or flag.orelse is not None or not all(map(nodes.is_pure, [flag.test, *tests])):
            return None
        # a test of a parameter may differ from call to call: a scaler made before the `if` would be made again, disabled
        return None if scope != "local" and tests_a_parameter(self.tree, flag) else (flag, chain)

    def remove_chain(self, chain: cst.If) -> None:
        """The chain ``chained_under_flag`` found goes: its arms held only ``initialize``."""
        self.draft.replace(chain, cst.RemoveFromParent())
        self.draft.kind(chain, INITIALIZE, "`amp.initialize` is apex mixed precision", "Remove it: the scaler is made before the `if`")

    def chain_made_in(self, first: InitializeSite, hoist: cst.If | None) -> cst.If:
        """The ``if`` chain whose arms ``mirrored`` found making the scaler: it exists after it."""
        node = self.tree.parent.get(id(self.tree.parent.get(id(hoist or first.statement))))
        while isinstance(self.tree.parent.get(id(node)), (cst.If, cst.Else)) or isinstance(node, cst.Else):
            node = self.tree.parent.get(id(node))
        return node

    def each_its_own(self, first: InitializeSite, again: list[InitializeSite], sites: list[cst.CSTNode]) -> bool:
        """Every use of the scaler (``sites``) is in a function that makes one (``first``'s, or
        one of ``again``, the calls ``elsewhere`` found): each makes a local scaler of its own,
        as a person would write it, not a module global assigned through ``global``."""
        makers = {id(self.tree.function(site.statement)) for site in (first, *again)}
        return bool(again) and all(id(self.tree.function(site)) in makers for site in sites)

    def _at_top(self, statement: cst.CSTNode, function: cst.FunctionDef) -> bool:
        return self.tree.parent.get(id(self.tree.parent.get(id(statement)))) is function

    def _method(self, function: cst.FunctionDef) -> bool:
        return isinstance(self.tree.parent.get(id(self.tree.parent.get(id(function)))), cst.ClassDef)

    def note_inference(self, inits: list[InitializeSite]) -> None:
        if any(init.inference and init.level not in ("O0", "O3") for init in inits):
            self.draft.unsafe.append(INFERENCE_CAST)
        if any(init.inference and init.level == "O3" and not halved(init) for init in inits):  # no casts: all in float16
            self.draft.unsafe.append(INFERENCE_IN_HALF)

    def remove(self, init: InitializeSite, joined: bool) -> None:
        """``init``, a call besides the one making the scaler, goes: with an ``if args.fp16:``
        holding it alone where it joins that one. Readying a model for inference
        (``marks_inference``), it leaves a marker where it stood, in its ``if``, saying what to do
        there (in another function than the training one, the file's marker would not say where)."""
        marked = not joined and marks_inference(init)
        InitializePlanning(self.context).plan_initialize_removal(init, with_guard=joined or (init.inference and not marked))
        if marked:
            reason = INFERENCE_IN_HALF if init.level == "O3" else INFERENCE_CAST
            self.draft.unsafe.append(reason)
            self.draft.marked_reasons.append(reason)
            self.draft.leave_marker(init.statement, inference_step(init))

    @staticmethod
    def _options(site: InitializeSite) -> list[str] | None:
        """``initialize``'s options besides its models and optimizers, by name; None when some
        are given by position."""
        extra = [arg for arg in site.call.args if arg.keyword is None or arg.keyword.value not in ("models", "optimizers")]
        positional = [arg for arg in extra if arg.keyword is None]
        if len(positional) > (1 if site.inference else 2):
            return None
        return sorted(normal(nodes.code(arg)) for arg in extra if arg.keyword is not None)

    def inference_beside(self, main: InitializeSite, other: InitializeSite) -> bool:
        """``other`` readies a model for inference only (a teacher, an EMA copy) at O1 with the
        options of ``main``, the training ``initialize``, in its function, under every test
        ``main`` runs under: O1's casts are global once ``main`` has run, so ``other`` adds none,
        and the model runs where apex cast it no differently than the training models' other
        uses (in the autocast region or not). Before ``main``, nothing may run that model."""
        if not other.inference or main.inference or main.level != "O1" or other.level != "O1" or other.enabled is not None:
            return False
        mine = self._options(main)
        function = self.tree.function(main.statement)
        if mine is None or mine != self._options(other) or function is None or self.tree.function(other.statement) is not function:
            return False
        main_tests, other_tests = self._tests_around(main.statement, function, loops=False), self._tests_around(other.statement, function, loops=True)
        if main_tests is None or other_tests is None or not main_tests <= other_tests:
            return False
        if self.tree.order[id(other.statement)] > self.tree.order[id(main.statement)]:
            return True
        between = [s for s in self._statements_of(function) if self.tree.order[id(other.statement)] < self.tree.order[id(s)] < self.tree.order[id(main.statement)]]
        return not any(self.tree.calls_model(s, other.model_codes, self.sites.ids) for s in between)

    def _tests_around(self, statement: cst.CSTNode, function: cst.FunctionDef, loops: bool) -> set[str] | None:
        """The tests of the ``if`` arms (pure, no ``else``/``elif`` arm) that hold ``statement`` in
        ``function``; loops and ``with`` blocks between are allowed with ``loops``; None otherwise."""
        tests = set()
        node = self.tree.parent.get(id(statement))
        while node is not None and node is not function:
            if isinstance(node, cst.If):
                if not nodes.is_pure(node.test):
                    return None
                tests.add(normal(nodes.code(node.test)))
            elif isinstance(node, (cst.For, cst.With)) and loops:
                pass
            elif not isinstance(node, (cst.IndentedBlock, cst.SimpleStatementSuite)):
                return None  # an else arm, a try, a while: not a plain test
            node = self.tree.parent.get(id(node))
        return tests if node is function else None

    @staticmethod
    def _statements_of(function: cst.FunctionDef) -> list[cst.SimpleStatementLine]:
        found = []

        class _Lines(cst.CSTVisitor):
            def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
                found.append(node)

        walk(function, _Lines())
        return found

    def joins(self, first: InitializeSite, other: InitializeSite) -> bool:
        """``other`` initializes other models with ``first``'s options right after it, in its block
        or under a plain test there (a GAN's generator and discriminator; an EMA or teacher copy
        run forward only): apex kept one loss scaler for all, as one GradScaler does, and cast
        every model alike, as the autocast region does for the models it runs."""
        mine = self._options(first)
        if mine is None or mine != self._options(other) or (first.inference and not other.inference):
            return False
        block = self.tree.parent.get(id(first.statement))
        statement: cst.CSTNode = other.statement
        while self.tree.parent.get(id(statement)) is not block:
            owner = self.tree.parent.get(id(self.tree.parent.get(id(statement))))
            if not (isinstance(owner, cst.If) and nodes.is_pure(owner.test)):
                return False
            statement = owner
        body = list(block.body)
        between = body[body.index(first.statement) + 1 : body.index(statement)] if statement in body else None
        return between is not None and not any(backward_calls(s, nested=True) for s in between)


def _imports_amp(line: cst.CSTNode) -> bool:
    """``from apex import amp`` (or ``import apex``) alone on its line, beside ``initialize`` in an arm: it goes with the arm."""
    small = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
    # `import apex, os` also imports what stays
    return small is not None and imports_apex(small) and (isinstance(small, cst.ImportFrom) or len(small.names) == 1)
