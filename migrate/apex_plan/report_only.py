"""The findings of a file whose apex amp cannot be planned: each call, with the reason."""
from __future__ import annotations

from migrate.apex_plan.context import Sites
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import CORE, INITIALIZE, MASTER_PARAMS, SCALE_LOSS, STATE_DICT, Unplannable
from migrate.rule import Report


def report_only(tree: FileTree, sites: Sites, problem: Unplannable) -> list[Report]:
    """Each call of apex amp reported with why the file cannot be rewritten, and what to do."""
    line = tree.line(problem.node)
    where = f" (line {line})" if line else ""
    reason = f"not rewritten: {problem.reason}{where}; migrate this file by hand or keep it running on ampshim"
    messages = {
        "initialize": (INITIALIZE, "`amp.initialize`"),
        "scale_loss": (SCALE_LOSS, "`amp.scale_loss`"),
        "master_params": (MASTER_PARAMS, "`amp.master_params`"),
        "state_dict": (STATE_DICT, "`amp.state_dict`"),
        "load_state_dict": (STATE_DICT, "`amp.load_state_dict`"),
    }
    findings = []
    for kind in CORE:
        code, what = messages[kind]
        for call in sites.calls[kind]:
            findings.append(Report(code, call, f"{what} is apex mixed precision; {reason}"))
    return findings
