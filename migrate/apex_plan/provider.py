"""The plan as libcst metadata: ``ApexPlanProvider`` attaches the file's ``ApexPlan`` to the module.

The planner is imported when a file is first planned, not with the rules: a run over files
without apex (a pre-commit hook on a native training loop) never loads it.
"""
from __future__ import annotations

import libcst as cst
from libcst.metadata import BatchableMetadataProvider, PositionProvider, QualifiedNameProvider

from migrate.apex_plan.vocabulary import ApexPlan


class ApexPlanProvider(BatchableMetadataProvider[ApexPlan]):
    """Attaches the file's ``ApexPlan`` to the ``Module`` node."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider)

    def visit_Module(self, node: cst.Module) -> bool:
        from migrate.apex_plan.planner import Planner

        self.set_metadata(node, Planner(self, node).plan())
        return False


def plan_of(visitor: cst.MetadataDependent, module: cst.Module) -> ApexPlan:
    return visitor.get_metadata(ApexPlanProvider, module)
