"""AMP001: apex imports: dead ``try: ... except ImportError:`` guards removed, unresolvable imports reported."""
from __future__ import annotations

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider

from migrate import apex_nodes as nodes
from migrate.names import may_resolve_within, qualified_names
from migrate.rule import Invalid, Rule, Valid
from migrate.types import FixSafety, Safety

class ApexImport(Rule):
    """What it does:
    Once the apex names an import brought in are no longer used, the rewrites' import cleanup
    removes the import itself (``from apex import amp``, ``import apex.amp as apex_amp``,
    ``import apex``, and so on, resolved by qualified name). This rule finishes the job on the
    guards around it: a ``try:`` left holding only ``pass`` or constant flags
    (``APEX_AVAILABLE = True``) cannot raise, so its ``except ImportError:`` branch is dead and
    the ``try`` is replaced by its body. It also reports the imports no rewrite can follow:
    ``importlib.import_module("apex.amp")``, ``__import__("apex")``, and availability checks
    (``if amp is not None:``) that keep apex imported.

    Why is this bad?
    An import guard around nothing is noise, and an import the codemod cannot resolve hides apex
    use from it.

    Fix safety:
    Safe: a body of ``pass`` and constant assignments cannot raise, so the handlers never run.
    The rest is reported without a fix.

    Options:
    None.
    """

    CODE = "AMP001"
    FIX_SAFETY = FixSafety.ALWAYS
    MESSAGE = "apex import"
    TRIGGERS = ("apex", "amp")
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ScopeProvider, ParentNodeProvider)
    VALID = [
        Valid("try:\n    import apex\n    HAS_APEX = True\nexcept ImportError:\n    HAS_APEX = False\n"),
        Valid("try:\n    import torch_xla\nexcept ImportError:\n    pass\n"),
        Valid("try:\n    value = compute()\nexcept ImportError:\n    value = None\n"),
        Valid("try:\n    class Norm(Base):\n        pass\nexcept ImportError:\n    Norm = None\n"),
    ]
    INVALID = [
        Invalid(
            "import torch\n\ntry:\n    APEX_AVAILABLE = True\nexcept ImportError:\n    raise ImportError('Please install apex')\n",
            "import torch\n\nAPEX_AVAILABLE = True\n",
        ),
        Invalid("import torch\n\ntry:\n    pass\nexcept ImportError:\n    amp = None\n", "import torch\n"),
        Invalid(
            "import torch\n\nif args.fp16:\n    try:\n        pass\n    except ImportError:\n        raise ImportError('Please install apex')\n",
            "import torch\n",
        ),
        Invalid("import importlib\namp = importlib.import_module('apex.amp')\n"),
        Invalid("from apex import amp\n\nif amp is not None:\n    print('apex found')\n"),
    ]

    def visit_Try(self, node: cst.Try) -> None:
        if node.finalbody is not None or not node.handlers:
            return
        if not all(map(nodes.catches_import_error, node.handlers)):
            return
        statements = list(node.body.body)
        if not all(isinstance(line, cst.SimpleStatementLine) for line in statements):
            return
        smalls = [small for line in statements for small in line.body]
        if not all(isinstance(s, cst.Pass) or _constant_flag(s) for s in smalls):
            return
        flags = [s for s in smalls if not isinstance(s, cst.Pass)]
        if flags and not any("apex" in name.lower() or "amp" in name.lower() for s in flags for name in _targets(s)):
            return
        kept = [line for line in statements if not all(isinstance(s, cst.Pass) for s in line.body)]
        if node.orelse is not None:
            kept += list(node.orelse.body.body)
        target: cst.CSTNode = node
        guard = nodes.guarding_if(node, lambda n: self.get_metadata(ParentNodeProvider, n, None))
        if not kept and guard is not None:
            target = guard  # `if args.fp16:` around nothing but the dead guard goes too
        if kept:
            kept[0] = nodes.with_leading(kept[0], node)
            replacement = cst.FlattenSentinel(kept)
        else:
            replacement = cst.RemoveFromParent()
        message = "this `try` guards an apex import that is gone: its `except ImportError` branch can no longer run"
        fallback = nodes.import_error_fallback(node)
        if fallback is not None:
            message += f"; behaviour change: where apex was not installed, `{fallback}` turned mixed precision off, and those runs now use it"
        self.report(
            target,
            message,
            replacement=replacement,
            safety=Safety.SAFE,
            fix_message="Replace the `try` statement by its body",
        )

    def visit_Call(self, node: cst.Call) -> None:
        function = qualified_names(self, node.func)
        if not function & {"importlib.import_module", "builtins.__import__"}:
            return
        module = nodes.literal_string(node.args[0].value) if node.args else None
        if module is not None and (module == "apex" or module.startswith("apex.")):
            self.report(node, f"`{module}` is imported dynamically, so its uses cannot be resolved or rewritten; "
                        "import it with an import statement, or migrate its uses by hand")

    def visit_Name(self, node: cst.Name) -> None:
        if not may_resolve_within(self, node, ("apex",)) or not qualified_names(self, node) & {"apex", "apex.amp"}:
            return
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, (cst.AssignTarget, cst.Attribute, cst.ImportAlias, cst.AsName)):
            return
        tested = (isinstance(parent, (cst.If, cst.While, cst.IfExp, cst.Assert)) and parent.test is node) or isinstance(
            parent, (cst.Comparison, cst.UnaryOperation, cst.BooleanOperation)
        )
        if tested:
            self.report(node, "this availability check keeps apex imported: test a flag of your own "
                        "(e.g. `args.fp16`) once the file no longer uses apex")


def _constant_flag(small: cst.BaseSmallStatement) -> bool:
    """``NAME = <literal>``: cannot raise."""
    if not isinstance(small, cst.Assign) or not all(isinstance(t.target, cst.Name) for t in small.targets):
        return False
    value = small.value
    if isinstance(value, cst.Name):
        return value.value in ("True", "False", "None")
    return isinstance(value, (cst.Integer, cst.Float, cst.SimpleString))


def _targets(small: cst.Assign) -> list[str]:
    return [t.target.value for t in small.targets]
