"""AMP800: a ``# noqa`` code that suppressed nothing (Ruff's RUF100, for ampmigrate's codes)."""
from __future__ import annotations

from migrate.rule import Invalid, Rule, Valid
from migrate.types import FixSafety, UNUSED_NOQA_CODE


class UnusedNoqa(Rule):
    """What it does:
    Reports the codes of a ``# noqa: AMP...`` directive that suppressed no finding on its line,
    and ``AMP`` codes that no rule has (a typo such as ``AMP10``).

    Only codes of the rules that ran are judged: ``# noqa: AMP021`` is left alone in a run without
    ``--select AMP02``, and so are other tools' codes (``# noqa: E501``) and a bare ``# noqa``,
    which other linters read too. A directive that names ``AMP800`` itself is never reported, as
    Ruff does for ``RUF100``.

    Why is this bad?
    A directive that suppresses nothing is noise, and it hides the next real finding on its line:
    a fix that made it unneeded should take it away.

    Fix safety:
    Safe: the unused codes are removed from the comment (the whole directive when none is left);
    the code and any other text in the comment stay as they are.
    """

    CODE = UNUSED_NOQA_CODE
    FIX = "removes the unused codes from the noqa comment"
    MESSAGE = "Unused `noqa` directive"
    TRIGGERS = ("noqa",)
    FIX_SAFETY = FixSafety.ALWAYS
    # Worked out by the engine from what the other rules reported: this visitor visits nothing.

    VALID = [
        Valid("import os  # noqa: F401\n"),
        Valid("value = compute()  # noqa\n"),
    ]
    INVALID = [
        Invalid("import os  # noqa: AMP001\n", "import os\n"),
        Invalid("import os  # noqa: AMP001, F401\n", "import os  # noqa: F401\n"),
        Invalid("total = 1  # noqa: AMP001 kept for the old loader\n", "total = 1  # kept for the old loader\n"),
    ]
