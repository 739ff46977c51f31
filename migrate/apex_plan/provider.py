"""The plan as libcst metadata: ``ApexPlanProvider`` attaches the file's ``ApexPlan`` to the module.

The planner is imported when a file with an apex import is first planned, not with the rules: a
run over files without one (a pre-commit hook on a native training loop) never loads it.
"""
from __future__ import annotations

from collections.abc import Mapping

import libcst as cst
from libcst.metadata import BatchableMetadataProvider, MetadataWrapper, PositionProvider, QualifiedNameProvider, ScopeProvider

from migrate.apex_nodes import apex_imports
from migrate.apex_plan.unbound import unbound_reads
from migrate.apex_plan.vocabulary import COMPUTED_LEVEL, MASTER_COPIES, ApexPlan


class ApexPlanProvider(BatchableMetadataProvider[ApexPlan]):
    """Attaches the file's ``ApexPlan`` to the ``Module`` node."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider, ScopeProvider)

    def visit_Module(self, node: cst.Module) -> bool:
        # nothing can name apex.amp: the planner's references start at an apex import, or at an
        # `amp.scale_loss` no binding reaches (its import commented out)
        if not apex_imports(node) and not unbound_reads(self.metadata[ScopeProvider], node):
            self.set_metadata(node, ApexPlan())
            return False
        from migrate.apex_plan.planner import Planner

        self.set_metadata(node, Planner(self, node).plan())
        return False


def plan_text(text: str, settings: Mapping) -> ApexPlan | None:
    """The plan of a file's text outside a run of the rules (``migrate.halves`` asks one half of
    apex amp for the facts the other half needs); None when it does not parse."""
    from migrate.metadata import release, resolve
    from migrate.parsing import parse_module
    from migrate.quiet import cycle_collector_paused

    with cycle_collector_paused():  # as in a file's run of the rules
        try:
            module = parse_module(text)
        except cst.ParserSyntaxError:
            return None
        metadata = resolve(MetadataWrapper(module, unsafe_skip_copy=True), [_PlanReader()], settings)
        plan = metadata[ApexPlanProvider][module]
        release(metadata)
    return plan


class _PlanReader(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (ApexPlanProvider,)


def plan_of(visitor: cst.MetadataDependent, module: cst.Module) -> ApexPlan:
    return visitor.get_metadata(ApexPlanProvider, module)


def level_made_known(plan: ApexPlan, settings: Mapping) -> bool:
    """Whether the ``opt-level`` setting makes the plan's only doubt (a computed opt level) go."""
    return (
        settings.get("opt-level") in ("O0", "O1")
        and COMPUTED_LEVEL in plan.unsafe_reasons
        and set(plan.unsafe_reasons) <= {COMPUTED_LEVEL, MASTER_COPIES}
    )
