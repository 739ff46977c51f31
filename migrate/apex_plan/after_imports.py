"""Definitions a rewrite needs at module level (a GradScaler made once, the helper reading old
apex checkpoints), put after the file's last top-level import."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Step
from migrate.apex_plan.vocabulary import HELPER_NAME, HELPER_SOURCE, SCALE_LOSS, STATE_DICT, Unplannable


class AfterImportsPlanning(Step):
    """Writes the ``Draft``'s ``after_imports`` into the file, said as what the file gains."""

    def plan_after_imports(self) -> None:
        """Definitions the rewrite needs at module level go after the last top-level import."""
        if not self.draft.after_imports:
            return
        anchor = self.tree.import_anchor()
        if anchor is None or self.draft.touched(anchor):
            first = self.sites.all_calls()[0]
            raise Unplannable(first, "no top-level import to put the module-level definitions after")
        following = self.tree.module.body[self.tree.module.body.index(anchor) + 1 :]
        blank_after = sum(1 for line in following[0].leading_lines if line.comment is None) if following else 2
        added = []
        for source in sorted(self.draft.after_imports, key=lambda text: text == HELPER_SOURCE):  # assignments first
            statements = nodes.parse_statements(source, self.tree.module)
            blank = 2 if isinstance(statements[0], cst.FunctionDef) else 1 if not added else 0
            added += [statements[0].with_changes(leading_lines=[cst.EmptyLine()] * blank + [line for line in statements[0].leading_lines if line.comment]), *statements[1:]]
        if isinstance(added[-1], cst.FunctionDef) and blank_after < 2:  # two blank lines after a def
            footer = [*added[-1].body.footer, *[cst.EmptyLine(indent=False)] * (2 - blank_after)]
            added[-1] = added[-1].with_changes(body=added[-1].body.with_changes(footer=footer))
        self.draft.replace(anchor, cst.FlattenSentinel([anchor, *added]))
        # said as what the file gains, where it gains it (a user reads this line, not the planner's)
        what = []
        if any(source != HELPER_SOURCE for source in self.draft.after_imports):
            what.append(f"the GradScaler `{self.setup.scaler}` is made at module level, after the imports")
        if HELPER_SOURCE in self.draft.after_imports:
            what.append(f"`{HELPER_NAME}`, which reads old apex checkpoints into a GradScaler, is defined after the imports")
        code = STATE_DICT if self.sites.calls["load_state_dict"] else SCALE_LOSS
        self.draft.kind(anchor, code, "; ".join(what), "Add it after the imports" if len(what) == 1 else "Add them after the imports")
