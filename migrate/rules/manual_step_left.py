"""AMP017: a ``# TODO(ampmigrate): ...`` comment the rewrite left: reported until the step is done."""
from __future__ import annotations

import libcst as cst
from libcst.metadata import PositionProvider

from migrate.apex_plan import MANUAL_STEP_MARKER
from migrate.rule import Invalid, Rule, Valid


class ManualStepLeft(Rule):
    """What it does:
    Reports each ``# TODO(ampmigrate): ...`` comment. The apex rewrites leave one where the
    native code needs a step they cannot take safely themselves, such as putting a forward pass
    that lives in another function or file under ``torch.autocast``. The finding stays, in
    ``--check`` and in ``--report``, until the step is done and the comment deleted.

    Why is this bad?
    apex O1 cast every forward pass of the process; native autocast casts only what runs inside
    it, so a forward pass left outside trains in fp32 with the loss still scaled.

    Fix safety:
    No fix: the step needs the code the rewrite could not see.

    Options:
    None.
    """

    CODE = "AMP017"
    MESSAGE = "a step of the migration is left to do by hand"
    TRIGGERS = ("ampmigrate", "apex")  # "apex": the marker appears in a later round of an apex file
    METADATA_DEPENDENCIES = (PositionProvider,)
    VALID = [Valid("# Migrated from apex with ampmigrate.\nscaler.scale(loss).backward()\n")]
    INVALID = [
        Invalid(
            '# TODO(ampmigrate): compute `loss` (the forward pass) under torch.autocast("cuda", dtype=torch.float16): apex O1 cast it\n'
            "scaler.scale(loss).backward()\n"
        )
    ]

    @classmethod
    def has_work_in(cls, text: str) -> bool:
        return MANUAL_STEP_MARKER in text  # else no comment starts with it, and the walk can leave the tokens out

    def visit_Comment(self, node: cst.Comment) -> None:
        # a long step is wrapped over the comment lines right below it, each indented (`#   ...`)
        line = self.get_metadata(PositionProvider, node).start.line
        text = node.value.lstrip("#")
        pending = getattr(self, "_pending", None)
        if pending is not None and line == pending[2] + 1 and text.startswith("  ") and text.strip():
            self._pending = (pending[0], f"{pending[1]} {text.strip()}", line)
            return
        self._report_pending()
        if text.strip().startswith(MANUAL_STEP_MARKER):
            self._pending = (node, text.strip()[len(MANUAL_STEP_MARKER):].strip(), line)

    def leave_Module(self, original_node: cst.Module) -> None:
        self._report_pending()

    def _report_pending(self) -> None:
        pending = getattr(self, "_pending", None)
        if pending is not None:
            self.report(pending[0], f"{self.MESSAGE}: {pending[1]}")
            self._pending = None
