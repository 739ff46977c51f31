"""``--explain CODE`` and ``--list-rules``: the catalogue's own words, so they cannot drift from the code.

The two codes the tool itself reports about a file (AMP900, AMP901) are documented here too.
"""
from __future__ import annotations

import inspect
from typing import Sequence

from migrate.types import ERROR_CODE, INTERNAL_ERROR_CODE, FixSafety

__all__ = ["TOOL_FINDINGS", "explain", "list_rules"]

# code -> (name, one line, documentation): the findings about a file rather than its code.
TOOL_FINDINGS = {
    ERROR_CODE: (
        "FileError",
        "The file could not be read, decoded, parsed or written; it was left untouched.",
        """What it means:
    ampmigrate could not work on the file: it cannot be read (permissions, a link loop, not a
    regular file), decoded (UTF-16 without a PEP 263 cookie, bytes invalid in its encoding),
    parsed (a syntax error: the message gives the line), or the fixed text could not be written
    back (the file changed on disk during the run, a read-only file or folder).

What happens:
    The file is left exactly as it was; the other files are still processed. The run exits with
    status 2 (3 if there are findings too).

What to do:
    Fix the cause the message names (the syntax error, the encoding, the permissions), then run
    again. It cannot be suppressed: a file that cannot be read cannot be checked.
""",
    ),
    INTERNAL_ERROR_CODE: (
        "InternalError",
        "A rule failed on this file, or its fixes did not compile; it was left untouched.",
        """What it means:
    A rule crashed on the file, or the fixes produced code that does not compile. This is a bug
    in ampmigrate, never in your code.

What happens:
    The file is left exactly as it was (no partial rewrite); the other files are still
    processed. The run exits with status 2.

What to do:
    Report it with the message and, if you can, the smallest file that shows it. Meanwhile,
    `--ignore` the rule the message names to process the file with the others.
""",
    ),
}


def explain(code: str) -> str:
    """The documentation of the rule with ``code``: its docstring, then ``INVALID[0]`` and its fix.

    Raises LookupError for an unknown code.
    """
    from migrate.rules import all_rules, rule_by_code

    wanted = code.strip().upper()
    if wanted in TOOL_FINDINGS:
        name, _, text = TOOL_FINDINGS[wanted]
        return f"# {name} ({wanted})\n\n{text}"
    rule = rule_by_code(code)
    if rule is None:
        known = ", ".join([*(r.CODE for r in all_rules()), *TOOL_FINDINGS])
        raise LookupError(f"no rule has the code {code!r}; known codes: {known}")
    lines = [f"# {rule.name()} ({rule.CODE})", "", inspect.cleandoc(rule.__doc__ or rule.MESSAGE), ""]
    lines += [f"Fix: {rule.FIX_SAFETY.value}. On by default: {'yes' if rule.DEFAULT else 'no (select it)'}.", ""]
    if rule.INVALID:
        example = rule.INVALID[0]
        lines += ["Example:", "", _indent(example.code)]
        if example.expected_replacement is not None:
            flag = " (with --unsafe-fixes)" if example.unsafe_fixes else ""
            lines += [f"Becomes{flag}:", "", _indent(example.expected_replacement)]
    return "\n".join(lines).rstrip("\n") + "\n"


def list_rules(rules: Sequence[type] | None = None) -> str:
    """One line per code: its name, whether a plain run checks it, how safe its fixes are, and
    what they do."""
    if rules is None:
        from migrate.rules import all_rules

        rules = all_rules()
    rows = [("code", "name", "default", "fix", "what the fix does")]
    for rule in rules:
        rows.append((rule.CODE, rule.name(), "on" if rule.DEFAULT else "off", rule.FIX_SAFETY.value,
                     rule.FIX or "(reports only)"))
    for code, (name, _, _) in TOOL_FINDINGS.items():
        rows.append((code, name, "always", FixSafety.NO_FIX.value, "(reports only)"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n" for row in rows)


def _indent(code: str) -> str:
    return "\n".join(f"    {line}" if line else "" for line in code.rstrip("\n").splitlines()) + "\n"
