"""AMP018: an apex-availability flag that is always True, folded into the code that tests it."""
from __future__ import annotations

from pathlib import PurePath

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider

from migrate import apex_nodes as nodes
from migrate.importers import SETTING as IMPORTED_ELSEWHERE
from migrate.prefilter import APEX_FLAG_NAME
from migrate.rule import Invalid, Rule, Valid
from migrate.rules._known_tests import arm_that_runs, decided_by, in_place_of, known_test
from migrate.tree_walk import descendants
from migrate.types import FixSafety



class ApexFlagConstant(Rule):
    """What it does:
    Finds a module-level apex-availability flag (``has_apex``, ``APEX_AVAILABLE``, ``HAS_AMP``,
    ...) that the file now only ever sets to ``True``: what is left once the ``try: import apex
    / except ImportError: HAS_APEX = False`` guard goes (AMP001). Its tests are folded: ``if
    has_apex:`` keeps its body, ``if not has_apex:`` its ``else``, an ``elif has_apex:`` becomes
    ``else:``, and ``has_apex and x`` becomes ``x``, ``128 if has_apex else 64`` becomes ``128``,
    and an ``enabled=has_apex`` of an autocast or GradScaler goes (True is its default); a
    comparison with a bool literal or None (``has_apex is False``, ``HAS_AMP == True``)
    and ``bool(has_apex)`` fold the same way. Once nothing reads it, the flag goes too,
    and so does a disabled GradScaler that stood in until an ``if has_apex:`` block made the
    scaler (``ampmigrate`` writes one there), where the block now runs right after it.

    Why is this bad?
    A flag that cannot be False is a branch that cannot run: dead code that still reads as if
    apex were optional, and that the next reader has to prove dead again.

    Fix safety:
    Safe: the flag is True wherever it is read, so each test had one outcome. Not offered where
    the flag may be set from elsewhere: a package's ``__init__.py``, a name in ``__all__``, a
    function that declares it ``global``, or any binding that is not the constant ``True`` (a
    ``False`` written just before, as a default, is dropped with it). A parameter or local of
    the same name is another variable, and left alone. A flag another module of the project
    imports (``from train import HAS_APEX``, ``train.HAS_APEX``) is folded here but stays set.
    """

    CODE = "AMP018"
    FIX = "folds an always-true has_apex-style flag into the code that tests it"
    FIX_SAFETY = FixSafety.ALWAYS
    MESSAGE = "this apex-availability flag is always True here"
    TRIGGERS = ("apex", "amp")
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ScopeProvider, ParentNodeProvider)
    VALID = [
        Valid("try:\n    import apex\n    HAS_APEX = True\nexcept ImportError:\n    HAS_APEX = False\n\nif HAS_APEX:\n    print(1)\n"),
        Valid("HAS_APEX = True\n\ndef disable():\n    global HAS_APEX\n    HAS_APEX = False\n\nif HAS_APEX:\n    print(1)\n"),
        Valid("use_fp16 = True\nif use_fp16:\n    print(1)\n"),
        Valid("has_apex = True\n__all__ = ['has_apex']\nif has_apex:\n    print(1)\n"),
    ]
    INVALID = [
        Invalid(
            "has_apex = False\n"
            "has_apex = True\n"
            "\n"
            "def train(args, loss, scaler, optimizer):\n"
            "    if has_apex and args.fp16:\n"
            "        scaler.scale(loss).backward()\n"
            "    else:\n"
            "        loss.backward()\n"
            "    if not has_apex:\n"
            "        print('apex is not installed')\n",
            "\n"
            "def train(args, loss, scaler, optimizer):\n"
            "    if args.fp16:\n"
            "        scaler.scale(loss).backward()\n"
            "    else:\n"
            "        loss.backward()\n",
        ),
        Invalid(
            "APEX_AVAILABLE = True\n"
            "\n"
            "def setup(args):\n"
            "    if args.native:\n"
            "        mode = 'native'\n"
            "    elif APEX_AVAILABLE:\n"
            "        mode = 'apex'\n"
            "    else:\n"
            "        mode = 'fp32'\n"
            "    if APEX_AVAILABLE:\n"
            "        print('mixed precision:', mode)\n"
            "    return mode\n",
            "\n"
            "def setup(args):\n"
            "    if args.native:\n"
            "        mode = 'native'\n"
            "    else:\n"
            "        mode = 'apex'\n"
            "    print('mixed precision:', mode)\n"
            "    return mode\n",
        ),
        Invalid(  # the disabled scaler standing in until the folded block ran goes with the test
            "has_apex = True\n"
            "\n"
            "def setup(cfg):\n"
            "    # mixed precision\n"
            '    scaler = torch.amp.GradScaler("cuda", enabled=False)  # until the block that creates it runs\n'
            "    if has_apex:\n"
            "        level = 'O1' if cfg.fp16 else 'O0'\n"
            '        scaler = torch.amp.GradScaler("cuda", enabled=level != "O0")\n'
            "    return scaler\n",
            "\n"
            "def setup(cfg):\n"
            "    # mixed precision\n"
            "    level = 'O1' if cfg.fp16 else 'O0'\n"
            '    scaler = torch.amp.GradScaler("cuda", enabled=level != "O0")\n'
            "    return scaler\n",
        ),
        Invalid(  # read before the block makes it again: the stand-in stays
            "has_apex = True\n"
            "\n"
            "def setup(cfg):\n"
            '    scaler = torch.amp.GradScaler("cuda", enabled=False)\n'
            "    if has_apex:\n"
            "        log(scaler)\n"
            '        scaler = torch.amp.GradScaler("cuda")\n'
            "    return scaler\n",
            "\n"
            "def setup(cfg):\n"
            '    scaler = torch.amp.GradScaler("cuda", enabled=False)\n'
            "    log(scaler)\n"
            '    scaler = torch.amp.GradScaler("cuda")\n'
            "    return scaler\n",
        ),
        Invalid(  # a conditional expression, and the `enabled=` whose default is True
            "IS_AMP_AVAILABLE = True\n"
            "BATCH = (128 if IS_AMP_AVAILABLE else 64) * GPUS\n"
            "\n"
            "def evaluate(model, batch):\n"
            '    with torch.autocast("cuda", dtype=torch.float16, enabled=bool(IS_AMP_AVAILABLE)):\n'
            "        return model(batch)\n",
            "BATCH = 128 * GPUS\n"
            "\n"
            "def evaluate(model, batch):\n"
            '    with torch.autocast("cuda", dtype=torch.float16):\n'
            "        return model(batch)\n",
        ),
        Invalid(  # read as a value too: the tests fold, the flag stays
            "has_amp = True\n"
            "if has_amp:\n"
            "    print('AMP on')\n"
            "log(amp=has_amp)\n",
            "has_amp = True\n"
            "print('AMP on')\n"
            "log(amp=has_amp)\n",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> bool:
        if PurePath(self.context.filename).name == "__init__.py":
            return False
        scope = self.get_metadata(ScopeProvider, node)
        for name, lines in _constant_flags(node).items():
            targets = {id(line.body[0].targets[0].target) for line in lines}
            bindings = scope.assignments[name]
            if any(id(binding.node) not in targets for binding in bindings):
                continue  # bound elsewhere too: a `global` in a function, a loop, an import
            reads = [n for n in descendants(node) if isinstance(n, cst.Name) and n.value == name
                     and id(n) not in targets and self._is_the_flag(n, scope)]
            self._fold(name, reads, lines)
        return False

    def _is_the_flag(self, read: cst.Name, module_scope) -> bool:
        """Whether ``read`` names the module's flag, not a parameter or local of the same name."""
        scope = self.get_metadata(ScopeProvider, read, None)
        return scope is not None and all(binding.scope is module_scope for binding in scope[read.value])

    def _fold(self, name: str, reads: list[cst.CSTNode], lines: list[cst.SimpleStatementLine]) -> None:
        folded: list[cst.CSTNode] = []
        for read in reads:
            found = self._foldable(read) if isinstance(read, cst.Name) else None
            if found is None:
                continue
            node, replacement = found
            if any(_within(node, other, self) or _within(other, node, self) for other in folded):
                continue  # nested in another fold: the next round takes it
            folded.append(node)
            stand_in = self._stand_in_overwritten(node, replacement)
            if stand_in is not None:  # its comments stay, above what follows
                first, *rest = replacement.nodes
                replacement = cst.FlattenSentinel([first.with_changes(
                    leading_lines=[*stand_in.leading_lines, *first.leading_lines]), *rest])
                self.report(stand_in, "this disabled GradScaler stood in until the block below made the scaler; "
                            "with its test folded, that block always runs first", replacement=cst.RemoveFromParent(),
                            fix_message="Remove the stand-in")
            self.report(node, f"`{name}` is always True here, so this test has one outcome",
                        replacement=replacement, fix_message=f"Fold `{name}`, which is always True")
        if reads:
            return
        # Another module importing it (`from train import HAS_APEX`) sees it once this one has run:
        # its last line, `= True`, stays; a `False` default before it goes.
        kept = lines[-1:] if name in self.context.settings.get(IMPORTED_ELSEWHERE, ()) else []
        for line in lines:
            if line not in kept:
                self.report(line, f"`{name}` is set and never read" + (" here" if kept else ""),
                            replacement=cst.RemoveFromParent(), fix_message=f"Remove `{name}`")

    def _foldable(self, read: cst.Name) -> tuple[cst.CSTNode, object] | None:
        """The node that reading the constant lets go, and what replaces it."""
        call = self._enabled_by(read)
        if call is not None:
            return call, _without_enabled(call)
        decided = decided_by(read, self._parent_of, True)
        if decided is not None and isinstance(decided[0], cst.If):
            return decided[0], self._if_folded(*decided)
        return decided

    def _enabled_by(self, read: cst.Name) -> cst.Call | None:
        """The autocast or GradScaler that ``read`` makes the ``enabled=`` of, True (``enabled=has_amp``,
        ``enabled=bool(has_amp)``, ``known_test``'s spellings): True is their default, so the keyword can go."""
        test, holds = known_test(read, self._parent_of, True)
        argument = self._parent_of(test)
        if not (holds and isinstance(argument, cst.Arg) and argument.keyword is not None and argument.keyword.value == "enabled"):
            return None
        call = self._parent_of(argument)
        if isinstance(call, cst.Call) and nodes.code(call.func).rsplit(".", 1)[-1] in _ENABLED_BY_DEFAULT:
            return call
        return None

    def _if_folded(self, statement: cst.If, body_runs: bool):
        if not body_runs and isinstance(statement.orelse, cst.If):
            return statement.orelse  # `if not flag: ... elif x:` -> `if x:`
        kept = arm_that_runs(statement, body_runs)
        if isinstance(self._parent_of(statement), cst.If):  # an `elif` arm: it becomes the `else`, or goes
            if not kept:
                return statement.orelse if statement.orelse is not None else cst.RemovalSentinel.REMOVE
            return cst.Else(body=cst.IndentedBlock(body=kept))
        return in_place_of(statement, kept) if kept else cst.RemoveFromParent()

    def _parent_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.get_metadata(ParentNodeProvider, node, None)

    def _stand_in_overwritten(self, folded: cst.CSTNode, replacement) -> cst.SimpleStatementLine | None:
        """The line before a folded ``if has_apex:`` that made a disabled GradScaler
        (``scaler = torch.amp.GradScaler("cuda", enabled=False)``) where the kept body makes the
        scaler again before anything reads it: once the test is gone, nothing reads the stand-in."""
        if not isinstance(folded, cst.If) or not isinstance(replacement, cst.FlattenSentinel):
            return None
        block = self.get_metadata(ParentNodeProvider, folded, None)
        body = list(getattr(block, "body", ()))
        index = next((i for i, statement in enumerate(body) if statement is folded), 0)
        if index == 0:
            return None
        before = body[index - 1]
        assign = before.body[0] if isinstance(before, cst.SimpleStatementLine) and len(before.body) == 1 else None
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.value, cst.Call)
                and nodes.code(assign.value.func).endswith("GradScaler")
                and any(arg.keyword is not None and arg.keyword.value == "enabled" and nodes.code(arg.value) == "False"
                        for arg in assign.value.args)):
            return None
        target = nodes.code(assign.targets[0].target)
        for statement in replacement.nodes:
            line = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
            if isinstance(line, cst.Assign) and [nodes.code(t.target) for t in line.targets] == [target] \
                    and not _reads(line.value, target):
                return before
            if _reads(statement, target):
                return None
        return None


# Calls whose ``enabled=`` defaults to True: an always-true flag there is the default.
_ENABLED_BY_DEFAULT = frozenset({"autocast", "GradScaler"})


def _without_enabled(call: cst.Call) -> cst.Call:
    """``call`` without its ``enabled=`` argument; a new last argument takes its comma, so a
    trailing comma and the line breaks of a wrapped call stay as they were."""
    args = list(call.args)
    index = next(i for i, arg in enumerate(args) if arg.keyword is not None and arg.keyword.value == "enabled")
    removed = args.pop(index)
    if args and index == len(args):
        args[-1] = args[-1].with_changes(comma=removed.comma)
    return call.with_changes(args=args)


def _reads(node: cst.CSTNode, code: str) -> bool:
    return any(isinstance(n, (cst.Name, cst.Attribute)) and nodes.code(n) == code for n in descendants(node))


def _within(inner: cst.CSTNode, outer: cst.CSTNode, rule: Rule) -> bool:
    node = inner
    while node is not None:
        if node is outer:
            return True
        node = rule.get_metadata(ParentNodeProvider, node, None)
    return False


def _constant_flags(module: cst.Module) -> dict[str, list[cst.SimpleStatementLine]]:
    """Module-level flags named for apex, set on top-level lines to ``True`` last (a ``False``
    default just before is allowed) and not exported, with those lines."""
    exported = {nodes.literal_string(e.value) for n in descendants(module) if isinstance(n, cst.Assign)
                and any(nodes.code(t.target) == "__all__" for t in n.targets) and isinstance(n.value, (cst.List, cst.Tuple))
                for e in n.value.elements}
    lines: dict[str, list[cst.SimpleStatementLine]] = {}
    for statement in module.body:
        name = _assigned_name(statement)
        if name and APEX_FLAG_NAME.match(name) and name not in exported:
            lines.setdefault(name, []).append(statement)
    flags = {}
    for name, found in lines.items():
        values = [_assigns_constant(line, name) for line in found]
        if values[-1] == "True" and values.count("True") == 1 and set(values) <= {"True", "False"}:
            flags[name] = found
    return flags


def _assigned_name(statement: cst.CSTNode) -> str | None:
    if (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1
            and isinstance(statement.body[0].targets[0].target, cst.Name)):
        return statement.body[0].targets[0].target.value
    return None


def _assigns_constant(statement: cst.CSTNode, name: str) -> str | None:
    if _assigned_name(statement) != name:
        return None
    value = statement.body[0].value
    return value.value if isinstance(value, cst.Name) and value.value in ("True", "False") else "other"
