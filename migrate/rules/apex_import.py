"""AMP001: apex imports: unused ones and dead ``try: ... except ImportError:`` guards removed,
unresolvable imports reported."""
from __future__ import annotations

import re
from pathlib import PurePath

import libcst as cst
from libcst.metadata import GlobalScope, ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider

from migrate import apex_nodes as nodes
from migrate.import_fallbacks import arm_change, fallback_change_first
from migrate import quiet
from migrate.apex_plan import MANUAL_STEP_MARKER
from migrate.apex_plan.module_fallbacks import if_with_dead_fallback
from migrate.importers import SETTING as IMPORTED_ELSEWHERE
from migrate.names import may_resolve_within, qualified_names
from migrate.rule import Invalid, Rule, Valid
from migrate.rules._known_tests import A_MODULE, arm_that_runs, decided_by, in_place_of
from migrate.tree_walk import descendants
from migrate.types import FixSafety, ImportChange, Safety

class ApexImport(Rule):
    """What it does:
    Once the apex names an import brought in are no longer used, the rewrites' import cleanup
    removes the import itself (``from apex import amp``, ``import apex.amp as apex_amp``,
    ``import apex``, and so on, resolved by qualified name). This rule removes the apex imports
    that nothing in the file used in the first place (``from apex import optimizers`` left over
    from an experiment; ``from apex.fp16_utils import *`` where the file names none of what it
    brings in: ``FP16_Optimizer``, ``network_to_half``, ``to_python_float`` and the rest; a name
    in a string standing alone as a statement, old code commented out in ``'''...'''``, uses
    nothing), and finishes the job on the guards around an import: a ``try:`` left
    holding only ``pass`` or constant flags (``APEX_AVAILABLE = True``) cannot raise, so its
    ``except ImportError:`` branch (or bare ``except:``, ``except NameError:``) is dead and the
    ``try`` is replaced by its body; an ``if args.fp16:`` holding only that ``try`` goes with
    it, and so does its ``else:`` where that only gives ``None`` to names nothing in the
    function reads (``else: amp = None``) and holds no comment. It also reports the imports no rewrite can follow:
    ``importlib.import_module("apex.amp")``, ``__import__("apex")``, and availability checks
    (``if amp is not None:``) that keep apex imported. Where such checks are all that reads
    apex's module (the rewrites took the rest), and the name is bound only by the import and
    ``amp = None`` fallbacks, each gives way to apex's arm: ``if amp is None: <fallback> else:
    <apex's arm>`` (``if not amp:``, ``if amp is not None:``, ``if amp:``, ``if bool(amp):``),
    ``bool(amp) and x`` or ``amp is not None and x`` become ``x``, ``x if amp else y`` becomes
    ``x``; the import goes with them.

    An unused import is left alone where it may be wanted all the same: in a class body (a class
    attribute), under ``if TYPE_CHECKING:`` (never imported at run time), in a ``try`` whose
    ``except ImportError:`` sets a fallback (an availability check: ``HAS_APEX = False``: reported
    without a fix, so that a file left needing apex says why) or returns one (``def
    apex_available(): ... except ImportError: return False``), and
    where a string that is Python code names it (``__all__``, a string annotation, ``eval``; not
    a message such as "please install apex").

    Why is this bad?
    An apex import, used or not, makes the file fail where apex is not installed. An import
    guard around nothing is noise, and an import the codemod cannot resolve hides apex use from it.

    Fix safety:
    Safe: a body of ``pass`` and constant assignments cannot raise, so the handlers never run;
    where apex is installed ``amp`` is never None, so apex's arm is the one that ran (where it
    was not, the fallback ran: the fix says so, as native torch.amp needs no install);
    an unused import's only effect is importing apex (which patches nothing until it is called).
    Unsafe where other modules may import the name from this one: in a package's ``__init__.py``,
    or marked ``# noqa: F401`` (kept on purpose). Where another file of the project does import
    it from this one, it is only reported (the rename rules bind ``FusedLayerNorm`` and the other
    classes with a native counterpart to it instead). The rest is reported without a fix.

    Options:
    None.
    """

    CODE = "AMP001"
    FIX = 'removes unused apex imports and the dead `try:` guards around them'
    FIX_SAFETY = FixSafety.SOMETIMES
    MESSAGE = "apex import"
    TRIGGERS = ("apex", "amp")
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ScopeProvider, ParentNodeProvider)
    VALID = [
        Valid("import apex\nfrom apex.amp import __version__\n\nprint(apex.amp.__version__.VERSION)\n"),
        Valid("try:\n    import torch_xla\nexcept ImportError:\n    pass\n"),
        Valid("try:\n    value = compute()\nexcept ImportError:\n    value = None\n"),
        Valid("try:\n    class Norm(Base):\n        pass\nexcept ImportError:\n    Norm = None\n"),
        Valid("try:\n    from apex import amp\nexcept ImportError:\n    amp = None\n"),
        Valid("def apex_available():\n    try:\n        import apex  # noqa: F401\n        from apex import amp  # noqa: F401\n\n"
              "        return True\n    except ImportError:\n        return False\n"),
        Valid("def has_apex():\n    try:\n        import apex\n    except ModuleNotFoundError:\n        return False\n    return True\n"),
        Valid("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from apex.optimizers import FusedLAMB\n\n"
              "def build(opt: 'FusedLAMB'):\n    return opt\n"),
        Valid("from apex.normalization import FusedLayerNorm\n\n__all__ = ['FusedLayerNorm']\n"),
        Valid("class Trainer:\n    from apex import amp\n\n    def step(self, loss):\n        self.amp.scale_loss(loss)\n"),
        Valid("import apex.amp\n\nmodel = apex.parallel.convert_syncbn_model(model)\n"),
    ]
    INVALID = [
        # the check stays (its answer may be read anywhere), said so that the file's need of apex is explained
        Invalid("try:\n    import apex\n    HAS_APEX = True\nexcept ImportError:\n    HAS_APEX = False\n"),
        Invalid(
            "import torch\n\ntry:\n    APEX_AVAILABLE = True\nexcept ImportError:\n    raise ImportError('Please install apex')\n"
            "log(apex=APEX_AVAILABLE)\n",
            "import torch\n\nAPEX_AVAILABLE = True\nlog(apex=APEX_AVAILABLE)\n",
        ),
        Invalid("import torch\n\ntry:\n    pass\nexcept ImportError:\n    amp = None\n", "import torch\n"),
        Invalid(
            "def train(args):\n    if args.fp16:\n        try:\n            pass\n        except ImportError:\n"
            "            raise ImportError('Please install apex')\n    else:\n        amp = None\n    return args\n",
            "def train(args):\n    return args\n",
        ),
        Invalid(
            "import torch\n\nif args.fp16:\n    try:\n        pass\n    except ImportError:\n        raise ImportError('Please install apex')\n",
            "import torch\n",
        ),
        Invalid("import torch\nfrom apex import optimizers\n\nopt = torch.optim.SGD(params, lr=0.1)\n",
                "import torch\n\nopt = torch.optim.SGD(params, lr=0.1)\n"),
        Invalid(
            "import torch\nfrom apex import amp, optimizers\n\nmodel = amp.initialize(model)\n",
            "import torch\nfrom apex import amp\n\nmodel = amp.initialize(model)\n",
        ),
        Invalid(
            "def main(args):\n    if args.fused:\n        from apex.optimizers import FusedAdam\n    return train(args)\n",
            "def main(args):\n    return train(args)\n",
        ),
        Invalid(
            "import torch\n\ntry:\n    from apex.parallel import SyncBatchNorm\nexcept ImportError:\n"
            "    raise ImportError('Please install apex')\n\nnorm = torch.nn.SyncBatchNorm(64)\n",
            "import torch\n\nnorm = torch.nn.SyncBatchNorm(64)\n",
        ),
        Invalid("import torch\nfrom apex import amp  # noqa: F401\n", "import torch\n", unsafe_fixes=True),
        Invalid("import torch\nfrom apex.fp16_utils import *\n\nx = torch.ones(1)\n", "import torch\n\nx = torch.ones(1)\n"),
        Invalid("import importlib\namp = importlib.import_module('apex.amp')\n"),
        Invalid("from importlib import import_module as load\n\namp = load('apex.amp')\n"),
        Invalid("apex = __import__('apex')\n"),
        Invalid("from apex import amp\n\nif amp is not None:\n    print('apex found')\n"
                "print(amp.__version__)\n"),
        Invalid(  # nothing else reads apex's module: its arm takes the test's place, the import goes
            "try:\n    from apex import amp\nexcept ImportError:\n    amp = None\n\n"
            "def setup(args):\n    if amp is None:\n        print('apex is not installed')\n"
            "        args.fp16 = False\n    else:\n        args.scaler = make_scaler(args)\n",
            "\ndef setup(args):\n    args.scaler = make_scaler(args)\n",
        ),
        Invalid("import torch\n\ntry:\n    import apex\nexcept:\n    print('No apex!')\n\nx = torch.ones(1)\n",
                "import torch\n\nx = torch.ones(1)\n"),
        Invalid("import torch\nfrom transformers.file_utils import is_apex_available\n\nif is_apex_available():\n"
                "    from apex import amp\n\nx = torch.ones(1)\n",
                "import torch\nfrom transformers.file_utils import is_apex_available\n\nx = torch.ones(1)\n"),
        Invalid("try:\n    from apex import amp\nexcept ImportError:\n    amp = None\n\n\ndef setup(amp_enabled):\n"
                "    if amp_enabled:\n        try:\n            pass\n        except NameError:\n"
                "            raise RuntimeError('Unable to import apex/amp')\n    return amp_enabled\n",
                "try:\n    from apex import amp\nexcept ImportError:\n    amp = None\n\n\ndef setup(amp_enabled):\n"
                "    return amp_enabled\n"),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        self._module = node
        self._only_tested: dict[str, bool] = {}  # a name -> whether only availability tests read it
        self._imported = nodes.apex_imports(node)  # the names apex imports bind, anywhere in the file
        self._used: set[str] = set()
        self._dotted: set[str] = set()  # `apex.amp.__version__`: a submodule reached through `import apex`
        self._aliases: list[tuple[cst.ImportAlias, str, ImportChange, cst.CSTNode]] = []
        self._stars: list[tuple[cst.ImportFrom, cst.CSTNode]] = []  # `from apex.fp16_utils import *` and its line
        self._probes: list[tuple[cst.ImportAlias, str, ImportChange, cst.Try]] = []  # kept by a `try` asking for apex
        self._in_strings = re.compile(rf"\b(?:{'|'.join(map(re.escape, self._imported))})\b") if self._imported else None

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        """``from apex.fp16_utils import *``: its names are known, so whether the file uses one is too."""
        if isinstance(node.names, cst.ImportStar) and not node.relative and node.module is not None \
                and nodes.code(node.module) == "apex.fp16_utils":
            statement = self._parent_of(node)
            if not _kept_on_purpose(statement, self._parent_of):
                self._stars.append((node, statement))

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        """Collects the file's apex imports, but those an unused import may be wanted in."""
        if not self._imported:
            return
        parent_of = self._parent_of
        statement = parent_of(node)
        imported = nodes.apex_import(statement, node)
        if imported is not None and not _kept_on_purpose(statement, parent_of):
            self._aliases.append((node, *imported, parent_of(statement)))
        elif imported is not None and isinstance(probe := _probing_try(statement, parent_of), cst.Try):
            self._probes.append((node, *imported[:2], probe))

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        """A string that is code naming an import counts as a use of it: ``__all__ = ["amp"]``,
        ``opt: "FusedLAMB"``, ``eval("amp.scale_loss")``."""
        if self._in_strings is None or not self._in_strings.search(node.value):
            return
        text = node.evaluated_value
        if isinstance(text, str) and _is_an_expression(text):
            self._used.update(self._in_strings.findall(text))

    def leave_Module(self, original_node: cst.Module) -> None:
        exported = self.context.settings.get(IMPORTED_ELSEWHERE, ())
        for alias, bound, change, line in self._aliases:
            if bound in self._used or f"{change.module}.{change.obj}" in self._dotted:
                continue  # used; or a submodule imported so that `apex.amp.__version__` reaches it
            if bound in exported:
                self.report(alias, f"`{_spelled(change)}` keeps the file depending on apex, and another file of the "
                            f"project imports `{bound}` from this module: migrate that file's uses of it first")
                continue
            reasons = []
            if PurePath(self.context.filename).name == "__init__.py":
                reasons.append(f"this is a package's `__init__.py`: other modules may import `{bound}` from it")
            if _noqa_f401(line):
                reasons.append("the import is marked `# noqa: F401`: it may be kept for other modules")
            self.report(
                alias,
                f"`{_spelled(change)}` is never used, and keeps the file depending on apex",
                replacement=alias,
                safety=Safety.UNSAFE if reasons else Safety.SAFE,
                fix_message="Remove the unused import",
                remove_imports=(change,),
                why_unsafe="; ".join(reasons),
            )

        for alias, bound, change, probe in self._probes:
            if bound not in self._used and f"{change.module}.{change.obj}" not in self._dotted:
                # said, so that a file left needing apex says why; the answer may be read anywhere
                fallback = nodes.import_error_fallback(probe)
                self.report(alias, f"`{_spelled(change)}` is never used; it stays, in a `try` that asks whether apex is "
                            f"installed (`{fallback}` where not): remove that check by hand once nothing reads its answer")

        if self._stars and not nodes.reads_any(original_node, nodes.FP16_UTILS_NAMES):
            for star, line in self._stars:
                reasons = ["the import is marked `# noqa: F401`: it may be kept for other modules"] if _noqa_f401(line) else []
                if PurePath(self.context.filename).name == "__init__.py":
                    reasons.append("this is a package's `__init__.py`: other modules may import its names from it")
                self.report(star, "`from apex.fp16_utils import *` brings in nothing the file uses, and keeps the file "
                            "depending on apex", replacement=cst.RemoveFromParent(),
                            safety=Safety.UNSAFE if reasons else Safety.SAFE, fix_message="Remove the unused import",
                            why_unsafe="; ".join(reasons))

    def _availability_fold(self, node: cst.Name) -> tuple[cst.CSTNode, object, cst.CSTNode | None] | None:
        """``if amp is None: <fallback> else: <apex's arm>`` (``if not amp:``, ``if amp:``, ``amp
        and x``, ``x if amp else y``, ...), where the module's ``amp`` is bound only by an apex
        import and ``amp = None`` fallbacks and every read of it is such a test: the node that goes, what
        replaces it (for an ``if``, apex's arm: nothing, or ``pass`` alone) and the arm that ran without apex."""
        decided = self._decided(node)
        if decided is None:
            return None
        scope = self.get_metadata(ScopeProvider, node, None)
        bindings = scope[node.value] if scope is not None else set()
        if not bindings or not all(isinstance(b.scope, GlobalScope) and self._apex_or_none(b.node) for b in bindings):
            return None
        if node.value not in self._only_tested:  # asked once per name: a walk of the whole module
            self._only_tested[node.value] = self._read_only_in_tests(node.value, next(iter(bindings)).scope)
        if not self._only_tested[node.value]:
            return None  # apex's module is still used elsewhere
        branch, body_runs = decided
        if not isinstance(branch, cst.If):
            return (*decided, None)
        dropped = branch.orelse if body_runs else branch
        kept = [line for line in arm_that_runs(branch, body_runs) if not _bare_pass(line)]
        if kept:
            return branch, in_place_of(branch, kept), dropped
        block = self._parent_of(branch)
        if len(getattr(block, "body", ())) == 1:  # alone: an `if args.apex:` around it goes too, or it is `pass`
            owner = self._parent_of(block)
            if (isinstance(owner, cst.If) and owner.body is block and owner.orelse is None
                    and not isinstance(self._parent_of(owner), cst.If) and len(getattr(self._parent_of(owner), "body", ())) > 1
                    and not any(isinstance(n, (cst.Call, cst.NamedExpr)) for n in descendants(owner.test))):
                return owner, cst.RemoveFromParent(), dropped
            return branch, nodes.with_leading(cst.SimpleStatementLine([cst.Pass()]), branch), dropped
        return branch, cst.RemoveFromParent(), dropped

    def _read_only_in_tests(self, name: str, global_scope) -> bool:
        """Whether every read of the module's ``name`` is an availability test ``_decided`` folds
        (a parameter or local of the same name is another variable)."""
        for other in descendants(self._module):
            if type(other) is not cst.Name or other.value != name:
                continue
            other_scope = self.get_metadata(ScopeProvider, other, None)
            if other_scope is None or not any(b.scope is global_scope for b in other_scope[name]):
                continue
            parent = self._parent_of(other)
            if not (isinstance(parent, (cst.ImportAlias, cst.AsName, cst.AssignTarget)) or self._decided(other) is not None):
                return False
        return True

    def _decided(self, node: cst.Name) -> tuple[cst.CSTNode, object] | None:
        """What apex's module being there decides (``decided_by``), but for an ``if`` that is an
        ``elif`` or has one: that chain stays an availability check."""
        decided = decided_by(node, self._parent_of, A_MODULE)
        if decided is not None and isinstance(decided[0], cst.If) and (
                isinstance(decided[0].orelse, cst.If) or isinstance(self._parent_of(decided[0]), cst.If)):
            return None
        return decided

    def _apex_or_none(self, bound: cst.CSTNode) -> bool:
        """Whether a binding of the name is an apex import or an assignment of ``None``."""
        if isinstance(bound, (cst.Import, cst.ImportFrom)):
            return nodes.code(bound).split()[1].startswith("apex")
        parent = self._parent_of(bound)
        assign = self._parent_of(parent) if isinstance(parent, cst.AssignTarget) else None
        return isinstance(assign, cst.Assign) and len(assign.targets) == 1 and nodes.is_none(assign.value)

    def _parent_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.get_metadata(ParentNodeProvider, node, None)

    def visit_Try(self, node: cst.Try) -> None:
        if node.finalbody is not None or not node.handlers:
            return
        if not all(map(nodes.guards_an_import, node.handlers)):
            return
        statements = list(node.body.body)
        if not all(isinstance(line, cst.SimpleStatementLine) for line in statements):
            return
        if any(empty.comment and MANUAL_STEP_MARKER in empty.comment.value for line in statements for empty in line.leading_lines):
            return  # a fix's `TODO(ampmigrate)` on what it left (a `pass`) says what changed: it stays
        smalls = [small for line in statements for small in line.body]
        # An alias can raise AttributeError (not on the torch versions it is written for): only
        # handlers that do not catch that may go with it.
        narrow = all(h.type is not None and "Exception" not in nodes.code(h.type) for h in node.handlers)
        if not all(isinstance(s, cst.Pass) or _constant_flag(s) or (narrow and _native_alias(s)) for s in smalls):
            return
        flags = [s for s in smalls if _constant_flag(s)]
        if flags and not any(map(_native_alias, smalls)) and not any(
            "apex" in name.lower() or "amp" in name.lower() for s in flags for name in _targets(s)
        ):
            return
        kept = [line for line in statements if not all(isinstance(s, cst.Pass) for s in line.body)]
        if node.orelse is not None:
            kept += list(node.orelse.body.body)
        target: cst.CSTNode = node
        guard = nodes.guarding_if(node, lambda n: self.get_metadata(ParentNodeProvider, n, None))
        if not kept and guard is not None:
            target = guard  # `if args.fp16:` around nothing but the dead guard goes too
        elif not kept and (dead := if_with_dead_fallback(node, self._parent_of)) is not None:
            target = dead  # and with an `else: amp = None` nothing reads
        if kept:
            kept[0] = nodes.with_leading(kept[0], node)
            replacement = cst.FlattenSentinel(kept)
        else:
            replacement = cst.RemoveFromParent()
        message = "this `try` guards an apex import that is gone: its `except` branch can no longer run"
        change = fallback_change_first(self.context.first_source, self._module, node)
        if change is not None:
            message += f"; {change}"
        self.report(
            target,
            message,
            replacement=replacement,
            safety=Safety.SAFE,
            fix_message="Replace the `try` statement by its body",
        )

    def visit_Call(self, node: cst.Call) -> None:
        if not may_resolve_within(self, node.func, ("importlib", "builtins")):
            return  # nearly every call: `torch.…`, `self.…`, the file's own functions
        function = qualified_names(self, node.func)
        if not function & {"importlib.import_module", "builtins.__import__"}:
            return
        module = nodes.literal_string(node.args[0].value) if node.args else None
        if module is not None and (module == "apex" or module.startswith("apex.")):
            self.report(node, f"`{module}` is imported dynamically, so its uses cannot be resolved or rewritten; "
                        "import it with an import statement, or migrate its uses by hand")

    def visit_Attribute(self, node: cst.Attribute) -> None:
        root = node.value
        while type(root) is cst.Attribute:
            root = root.value
        if type(root) is cst.Name and root.value in self._imported:
            self._dotted.add(nodes.code(node))

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self._imported and _is_a_use(node, self._parent_of):
            self._used.add(node.value)
        if not may_resolve_within(self, node, ("apex",)) or not qualified_names(self, node) & {"apex", "apex.amp"}:
            return
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, (cst.AssignTarget, cst.Attribute, cst.ImportAlias, cst.AsName)):
            return
        tested = (isinstance(parent, (cst.If, cst.While, cst.IfExp, cst.Assert)) and parent.test is node) or isinstance(
            parent, (cst.Comparison, cst.UnaryOperation, cst.BooleanOperation)
        )
        if (fold := self._availability_fold(node)) is not None:
            branch, replacement, dropped = fold
            test, change = self._decided(node)[0], arm_change(self.context.first_source, self._module, dropped)
            asked = nodes.code(test.test) if isinstance(test, cst.If) else node.value  # not an `if args.amp:` around it
            self.report(branch, f"`{asked}` only asks whether apex is installed, and nothing else in the "
                        "file uses apex's module any more", replacement=replacement, safety=Safety.SAFE,
                        remove_imports=tuple(self._imported.get(node.value, ())),
                        fix_message="Keep apex's arm" + (f" (note: {change})" if change else ""))
        elif tested:
            self.report(node, "this availability check keeps apex imported: test a flag of your own "
                        "(e.g. `args.fp16`) once the file no longer uses apex")


def _bare_pass(line: cst.CSTNode) -> bool:
    """``pass`` with no comment above it: a ``pass`` under a ``TODO(ampmigrate)`` marker (where
    the rewrite removed the arm's last statement) stays, or the marker would go with the arm."""
    return (isinstance(line, cst.SimpleStatementLine) and all(isinstance(small, cst.Pass) for small in line.body)
            and not any(empty.comment is not None for empty in line.leading_lines))


def _spelled(change: ImportChange) -> str:
    """The import statement of one name: ``from apex import amp as A``."""
    head = f"import {change.module}" if change.obj is None else f"from {change.module} import {change.obj}"
    return head + (f" as {change.asname}" if change.asname else "")


def _kept_on_purpose(statement: cst.CSTNode, parent_of) -> bool:
    """Whether an unused import here may be wanted: in a class body (a class attribute), under
    ``if TYPE_CHECKING:``, or in a ``try`` whose ``except ImportError:`` sets a fallback (it tests
    that apex is installed)."""
    return any(isinstance(node, cst.ClassDef)
               or isinstance(node, cst.If) and nodes.code(node.test).rsplit(".", 1)[-1] == "TYPE_CHECKING"
               or isinstance(node, cst.Try) and (nodes.import_error_fallback(node) is not None or _answers(node))
               for node in _blocks_around(statement, parent_of))


def _probing_try(statement: cst.CSTNode, parent_of) -> cst.Try | None:
    """The ``try`` around an import whose ``except ImportError:`` sets a fallback (``HAS_APEX = False``)."""
    return next((node for node in _blocks_around(statement, parent_of)
                 if isinstance(node, cst.Try) and nodes.import_error_fallback(node) is not None), None)


def _blocks_around(statement: cst.CSTNode, parent_of):
    """The nodes around an import, innermost first, up to the function or module it binds in; a
    class body is the last."""
    node = parent_of(statement)
    while node is not None and not isinstance(node, (cst.Module, cst.FunctionDef, cst.Lambda)):
        yield node
        if isinstance(node, cst.ClassDef):
            return
        node = parent_of(node)


def _answers(node: cst.Try) -> bool:
    """``try: import apex; return True`` / ``except ImportError: return False``: a probe whose answer
    its callers read (whether to import apex's engine elsewhere): without the import, always yes."""
    return any(isinstance(small, cst.Return) for handler in node.handlers if nodes.catches_import_error(handler)
               for line in handler.body.body if isinstance(line, cst.SimpleStatementLine) for small in line.body)


# Where a ``Name`` inside an import statement sits: the module, the imported name, its alias.
_IMPORT_PARTS = (cst.ImportAlias, cst.ImportFrom, cst.AsName)


def _is_a_use(name: cst.Name, parent_of) -> bool:
    """Whether ``name`` reads a name (or may: a parameter or keyword of the same spelling counts),
    rather than spelling an attribute (``model.amp``) or a part of an import statement."""
    parent = parent_of(name)
    if type(parent) is cst.Attribute and parent.attr is name:
        return False
    while type(parent) is cst.Attribute:
        parent = parent_of(parent)
    return not isinstance(parent, _IMPORT_PARTS)


def _is_an_expression(text: str) -> bool:
    """Whether ``text`` reads as code: it parses as an expression, and is neither a command-line
    option (``"--use-amp"``, which parses as ``-(-use - amp)``) nor a path (``"ckpt/amp.pt"``,
    a division; ``"amp.pth"``, an attribute)."""
    text = text.strip()
    if text.startswith("-") or "/" in text or "\\" in text or _FILE_NAME.match(text):
        return False
    try:
        quiet.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return False
    return True


# a file's name, as code would never spell an attribute: `amp.pth`, `amp_state.json`
_FILE_NAME = re.compile(r"^[\w.]+\.(?:pth|pt|ckpt|bin|safetensors|json|ya?ml|txt|log|csv|tsv|pkl|pickle|npy|npz|"
                        r"h5|onnx|tar|gz|zip|png|jpg|py)$", re.IGNORECASE)


_NOQA_F401 = re.compile(r"(?i)#\s*noqa\s*:[^#]*\bF401\b")


def _noqa_f401(line: cst.CSTNode) -> bool:
    """Whether the import's line (a ``SimpleStatementLine`` or ``SimpleStatementSuite``) says ``# noqa: F401``."""
    comment = line.trailing_whitespace.comment
    return comment is not None and _NOQA_F401.search(comment.value) is not None


def _constant_flag(small: cst.BaseSmallStatement) -> bool:
    """``NAME = <literal>``: cannot raise."""
    if not isinstance(small, cst.Assign) or not all(isinstance(t.target, cst.Name) for t in small.targets):
        return False
    value = small.value
    if isinstance(value, cst.Name):
        return value.value in ("True", "False", "None")
    return isinstance(value, (cst.Integer, cst.Float, cst.SimpleString))


def _native_alias(small: cst.BaseSmallStatement) -> bool:
    """``NAME = torch.<attributes>``, what a rewrite leaves of an apex import that other files
    import from this one (``torch.nn.LayerNorm``): it cannot raise ``ImportError`` or ``NameError``."""
    if not isinstance(small, cst.Assign) or not all(isinstance(t.target, cst.Name) for t in small.targets):
        return False
    value = small.value
    while isinstance(value, cst.Attribute):
        value = value.value
    return isinstance(small.value, cst.Attribute) and isinstance(value, cst.Name) and value.value == "torch"


def _targets(small: cst.Assign) -> list[str]:
    return [t.target.value for t in small.targets]
