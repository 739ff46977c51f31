"""apex code for a torch too old for native amp: the arms that run only where ``torch.__version__``
is below 1.6 (``if version.parse(torch.__version__) < version.parse("1.6"):``), or only under a
flag set True there alone (``_use_apex``). They never run on the torch the rewrite needs (and
never ran under ampshim), so the rewrite removes them and keeps the native arms beside them."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Step
from migrate.apex_plan.vocabulary import CORE, CORE_FINDINGS
from migrate.tree_walk import descendants

NATIVE_FROM = (2, 0)  # every torch the rewrite's `torch.amp` runs on is at least this
_VERSION_CALLS = frozenset({"parse", "LooseVersion", "StrictVersion", "Version"})


def _version_of(node: cst.BaseExpression) -> cst.BaseExpression:
    """``version.parse(x)`` / ``LooseVersion(x)``: ``x``; anything else as it is."""
    if isinstance(node, cst.Call) and len(node.args) == 1 and nodes.call_name(node) in _VERSION_CALLS:
        return node.args[0].value
    return node


def _literal_version(node: cst.BaseExpression) -> tuple[int, ...] | None:
    text = nodes.literal_string(_version_of(node))
    parts = text.split(".")[:2] if text else []
    return tuple(int(part) for part in parts) if parts and all(part.isdigit() for part in parts) else None


def torch_version_test(test: cst.BaseExpression) -> bool | None:
    """What ``test`` is on every torch from ``NATIVE_FROM`` on, where it compares
    ``torch.__version__`` with a version below that (``< "1.6"``: False; ``>= "1.6"``: True);
    None for any other test."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return None
    left, right, operator = test.left, test.comparisons[0].comparator, type(test.comparisons[0].operator)
    if nodes.code(_version_of(right)) == "torch.__version__":
        left, right = right, left
        operator = {cst.LessThan: cst.GreaterThan, cst.GreaterThan: cst.LessThan,
                    cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThanEqual}.get(operator)
    version = _literal_version(right)
    if nodes.code(_version_of(left)) != "torch.__version__" or version is None or version >= NATIVE_FROM:
        return None
    if operator in (cst.LessThan, cst.LessThanEqual):
        return False
    return True if operator in (cst.GreaterThan, cst.GreaterThanEqual) else None


def _old_torch_flags(module: cst.Module) -> frozenset[str]:
    """Module-level names bound only at module level, to ``False``, and to ``True`` only in an arm
    that never runs (``_use_apex = True`` under ``if torch.__version__ < "1.6"``)."""
    values: dict[str, list[tuple[bool, bool]]] = {}  # each module-level binding: (to True, in an arm that never runs)

    def walk(statements, dead: bool) -> None:
        for statement in statements:
            if isinstance(statement, cst.If):
                known = torch_version_test(statement.test)
                walk(statement.body.body, dead or known is False)
                if statement.orelse is not None:
                    orelse = [statement.orelse] if isinstance(statement.orelse, cst.If) else statement.orelse.body.body
                    walk(orelse, dead or known is True)
            elif isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)
                            and nodes.code(small.value) in ("True", "False")):
                        values.setdefault(small.targets[0].target.value, []).append((nodes.code(small.value) == "True", dead))

    walk(module.body, False)
    counts: dict[str, int] = {}  # every binding of each name, anywhere in the file
    for node in descendants(module):
        if type(node) is cst.Global:
            names = {alias.name.value for alias in node.names}
        elif type(node) in (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For):
            names = {n.value for n in (node.target, *descendants(node.target)) if type(n) is cst.Name}
        else:
            continue
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    # set True somewhere (else it is the user's switch, `mixed_precision = False`), and only where it never runs
    return frozenset(name for name, seen in values.items() if any(true for true, _ in seen)
                     and all(dead for true, dead in seen if true) and counts.get(name, 0) == len(seen))


def never_runs_arms(module: cst.Module) -> list[cst.If]:
    """The ``if`` statements (and ``elif`` arms) whose body never runs on current torch: a test
    ``torch_version_test`` finds False, or a flag of ``_old_torch_flags``, alone or joined by ``and``."""
    flags = _old_torch_flags(module)

    def never(test: cst.BaseExpression) -> bool:
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
            return never(test.left) or never(test.right)
        return torch_version_test(test) is False or (isinstance(test, cst.Name) and test.value in flags)

    return [node for node in descendants(module) if type(node) is cst.If and never(node.test)]


class VersionGatedPlanning(Step):
    """Removes the arms of ``never_runs_arms`` that hold apex amp. It reads the ``FileTree`` and
    the classified sites, and writes to the ``Draft``."""

    def plan_removal(self, arms: list[cst.If]) -> None:
        for arm in arms:
            held = [kind for kind in CORE for call in self.sites.calls[kind] if self.tree.inside(call, arm.body)]
            if not held:
                continue
            parent = self.tree.parent.get(id(arm))
            if isinstance(parent, cst.If) and parent.orelse is arm:  # an `elif`: the chain goes on without it
                replacement = arm.orelse if arm.orelse is not None else cst.RemoveFromParent()
            elif isinstance(arm.orelse, cst.If):  # the first arm: its `elif` becomes the `if`
                replacement = arm.orelse.with_changes(leading_lines=arm.leading_lines)
            elif isinstance(arm.orelse, cst.Else):
                replacement = cst.FlattenSentinel(list(arm.orelse.body.body))
            else:
                replacement = cst.RemoveFromParent()
            self.draft.replace(arm, replacement)
            self.draft.kind(arm, CORE_FINDINGS[held[0]][0], "apex amp here runs only on a torch older than native amp (1.6)",
                            "Remove the arm: it never runs on the torch `torch.amp` needs")


def holds_only_dead_apex(module: cst.Module, core: list[cst.Call], inside) -> list[cst.If] | None:
    """The arms to remove where every call of apex amp in ``core`` sits in one that never runs."""
    arms = never_runs_arms(module)
    if core and all(any(inside(call, arm.body) for arm in arms) for call in core):
        return arms
    return None


