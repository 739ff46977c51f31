"""The base of the four rewrites planned together per file (AMP002-AMP005): they report the plan."""
from __future__ import annotations

from typing import ClassVar

import libcst as cst
from libcst.metadata import PositionProvider, QualifiedNameProvider, ScopeProvider

from migrate.apex_plan import ApexPlanProvider, plan_of
from migrate.rule import Rule


class PlannedApexRule(Rule):
    """Reports the findings of ``apex_plan`` that carry this rule's code.

    ``FIX_GROUP``: the fixes of AMP002-AMP005 only make sense together (the scaler that
    ``scaler.scale(loss)`` uses is created where ``amp.initialize`` was), so they are planned as
    one and share one safety; select or ignore them together.
    """

    TRIGGERS = ("apex",)
    FIX_GROUP: ClassVar[str] = "apex.amp"
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ScopeProvider, ApexPlanProvider)

    def visit_Module(self, node: cst.Module) -> bool:
        for finding in plan_of(self, node).findings_for(self.CODE):
            self.report(
                finding.node,
                finding.message,
                replacement=finding.replacement,
                safety=finding.safety,
                fix_message=finding.fix_message,
                add_imports=finding.add_imports,
                remove_imports=finding.remove_imports,
            )
        return False
