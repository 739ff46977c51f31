"""The base of the four rewrites planned together per file (AMP002-AMP005): they report the plan."""
from __future__ import annotations

from typing import ClassVar, NamedTuple

import libcst as cst
from libcst.metadata import PositionProvider, QualifiedNameProvider, ScopeProvider

from migrate.apex_kept import SETTING as KEPT_ELSEWHERE
from migrate.apex_plan import ApexPlanProvider, plan_of
from migrate.apex_plan.provider import level_made_known
from migrate.rule import Rule
from migrate.types import FixSafety, Safety


def initialize_rewrite(plan, settings) -> tuple[bool, Safety, str]:
    """Whether this run's plan rewrites the file's ``amp.initialize``, with what safety, and why
    unsafe: what only mattered to a running apex (its cast registry) goes with it, never before."""
    inits = plan.findings_for("AMP002")
    if not inits or any(finding.replacement is None for finding in inits):
        return False, Safety.UNSAFE, ""
    if all(finding.safety is Safety.SAFE for finding in inits) or level_made_known(plan, settings):
        return True, Safety.SAFE, ""
    return True, Safety.UNSAFE, "; ".join(dict.fromkeys(f.why_unsafe for f in inits if f.why_unsafe))


GOES_WITH = "it goes with `amp.initialize`, whose rewrite is unsafe: "


class ApexCasts(NamedTuple):
    """What becomes of apex's own casts (its O1 patching, its registry) for a file after a run."""

    stay: str  # where they still run: "here", "elsewhere", or "" (they stop, or nothing starts them)
    safety: Safety  # of a rewrite that counts on native autocast in their place
    why: str  # why they stay, or why that rewrite is unsafe


def apex_casts_after_run(plan, settings) -> ApexCasts:
    """Whether apex's casts still run for this file after the run: a rewrite of its decorators
    (AMP006), its registry (AMP007) or its disabled region (AMP008) counts on native autocast in
    their place, so it goes only with the project's ``amp.initialize``, and is no safer than its
    rewrite. They stay while the file's ``initialize`` is not rewritten, or another file of the
    project keeps calling real apex's (``migrate.apex_kept``)."""
    kept = tuple(settings.get(KEPT_ELSEWHERE, ()))
    if kept:
        places = ", ".join(kept[:3]) + (", ..." if len(kept) > 3 else "")
        return ApexCasts("elsewhere", Safety.UNSAFE,
                         f"apex's `amp.initialize` (or `amp.init()`) stays in another file of the project ({places})")
    if not plan.findings_for("AMP002"):
        return ApexCasts("", Safety.SAFE, "")
    rewritten, safety, why = initialize_rewrite(plan, settings)
    if not rewritten:
        return ApexCasts("here", Safety.UNSAFE, "apex still initializes in this file (its `amp.initialize` is not rewritten)")
    return ApexCasts("", safety, f"{GOES_WITH}{why}" if safety is Safety.UNSAFE else "")


class PlannedApexRule(Rule):
    """Reports the findings of ``apex_plan`` that carry this rule's code.

    ``FIX_GROUP``: the fixes of AMP002-AMP005 only make sense together (the scaler that
    ``scaler.scale(loss)`` uses is created where ``amp.initialize`` was), so they are planned as
    one and share one safety. When a run selects only some of the codes a file's rewrite needs,
    the selected ones report without a fix.

    Setting ``opt-level`` (``[tool.ampmigrate.settings]``): ``"O1"`` or ``"O0"`` says every opt
    level the project computes at run time is O0 or O1, so rewriting it is safe.
    """

    # "scale_loss", "opt_level": a file whose `from apex import amp` went (commented out, or never
    # there) still calls apex's amp through a name nothing binds (`apex_plan.unbound`)
    TRIGGERS = ("apex", "scale_loss", "master_params", "opt_level")
    FIX_GROUP: ClassVar[str] = "apex.amp"
    FIX_SAFETY = FixSafety.SOMETIMES  # the plan's fixes share one safety: unsafe where any site needs it
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ScopeProvider, ApexPlanProvider)

    def visit_Module(self, node: cst.Module) -> bool:
        self._plan = plan_of(self, node)
        self._plan.active_codes.add(self.CODE)
        return False

    def leave_Module(self, original_node: cst.Module) -> None:
        # Every rule of the run has visited the module by now: if a code whose fixes the
        # rewrite needs is not selected, the others only report, so nothing is half-rewritten.
        plan = self._plan
        needed = {finding.code for finding in plan.findings if finding.replacement is not None}
        whole = needed <= plan.active_codes
        known_level = level_made_known(plan, self.context.settings)
        for finding in plan.findings_for(self.CODE):
            if whole and known_level:
                # The project says its computed opt levels are O0 or O1: the rewrite keeps both.
                message = finding.fix_message + " (opt level O0/O1 by the `opt-level` setting)"
                finding = finding._replace(safety=Safety.SAFE, fix_message=message, why_unsafe="")
            if whole or finding.replacement is None:
                self._pass_on(finding)
                continue
            missing = ", ".join(sorted(needed - plan.active_codes))
            self.report(finding.node, f"{finding.message}; the fix also needs {missing} (select AMP002-AMP005 together)")

    def _pass_on(self, finding) -> None:
        self.report(
            finding.node,
            finding.message,
            replacement=finding.replacement,
            safety=finding.safety,
            fix_message=finding.fix_message,
            add_imports=finding.add_imports,
            remove_imports=finding.remove_imports,
            why_unsafe=finding.why_unsafe,
        )
