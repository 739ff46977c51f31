"""The findings of a file whose apex amp cannot be planned: each call, with the reason."""
from __future__ import annotations

from migrate.apex_plan.context import Sites
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import CORE, CORE_FINDINGS, Unplannable
from migrate.rule import Report


def report_only(tree: FileTree, sites: Sites, problem: Unplannable) -> list[Report]:
    """Each call of apex amp reported with why the file cannot be rewritten, and what to do."""
    line = tree.line(problem.node)
    where = f" (line {line})" if line else ""
    reason = f"not rewritten: {problem.reason}{where}; migrate this file by hand or keep it running on ampshim"
    findings = []
    for kind in CORE:
        code, what = CORE_FINDINGS[kind]
        for call in sites.calls[kind]:
            findings.append(Report(code, call, f"{what} is apex mixed precision; {reason}"))
    return findings
