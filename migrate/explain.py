"""``--explain CODE`` and ``--list-rules``: the catalogue's own words, so they cannot drift from the code.

``documentation(code)`` gathers what there is to say about a code; ``explain`` renders it for the
terminal and ``migrate.rule_pages`` as a Markdown page, so the two say the same.
The two codes the tool itself reports about a file (AMP900, AMP901) are documented here too.
"""
from __future__ import annotations

import inspect
import re
from typing import NamedTuple, Sequence

from migrate.types import ERROR_CODE, INTERNAL_ERROR_CODE, FixSafety

__all__ = ["TOOL_FINDINGS", "PAGES", "Documentation", "Section", "all_codes", "documentation", "explain", "list_rules",
           "page_path"]

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
``--ignore`` the rule the message names to process the file with the others.
""",
    ),
}

PAGES = "docs/rules"  # the rules' pages (``migrate.rule_pages``), relative to the repository root


def page_path(code: str) -> str:
    """The page of ``code``, relative to the repository root: ``docs/rules/AMP100.md``."""
    return f"{PAGES}/{code.strip().upper()}.md"


# A section heading of a docstring: "What it does:", "Why is this bad?", alone on its line.
_HEADING = re.compile(r"[A-Z][A-Za-z ]{2,40}[:?]")


class Section(NamedTuple):
    """One section of a rule's docstring: ``heading`` as written ("Why is this bad?", "Fix safety:")."""

    heading: str
    body: str


class Documentation(NamedTuple):
    """All that ``--explain`` and a rule's page say about one code, gathered once."""

    code: str
    name: str
    message: str
    sections: tuple[Section, ...]
    default: str  # "on", "off" (select it) or "always" (the tool's own codes)
    fix_safety: FixSafety
    fix: str  # what the fix does, "" when the code only reports
    example: str | None  # INVALID[0]
    fixed: str | None  # INVALID[0] fixed, when the rule fixes it
    fix_needs_unsafe: bool  # the fix above is made only with --unsafe-fixes
    valid: str | None  # VALID[0]
    frameworks: tuple[FrameworkNote, ...] = ()  # Rule.FRAMEWORKS, each with its examples


class FrameworkNote(NamedTuple):
    """How a rule applies in one training framework, and its examples written for it."""

    framework: str
    how: str
    reported: tuple[str, ...]  # INVALID examples
    left_alone: tuple[str, ...]  # VALID examples


def all_codes() -> tuple[str, ...]:
    """Every code ``--list-rules`` prints, in its order."""
    from migrate.rules import all_rules

    return (*(rule.CODE for rule in all_rules()), *TOOL_FINDINGS)


def documentation(code: str) -> Documentation:
    """What there is to say about ``code`` (any case). Raises LookupError for an unknown code."""
    from migrate.rules import rule_by_code

    wanted = code.strip().upper()
    if wanted in TOOL_FINDINGS:
        name, message, text = TOOL_FINDINGS[wanted]
        return Documentation(wanted, name, message, _sections(text), "always", FixSafety.NO_FIX, "",
                             None, None, False, None)
    rule = rule_by_code(wanted)
    if rule is None:
        raise LookupError(f"no rule has the code {code!r}; known codes: {', '.join(all_codes())}")
    example = rule.INVALID[0] if rule.INVALID else None
    return Documentation(
        code=rule.CODE,
        name=rule.name(),
        message=rule.MESSAGE,
        sections=_sections(rule.__doc__ or rule.MESSAGE),
        default="on" if rule.DEFAULT else "off",
        fix_safety=rule.FIX_SAFETY,
        fix=rule.FIX,
        example=example.code if example else None,
        fixed=example.expected_replacement if example else None,
        fix_needs_unsafe=bool(example and example.unsafe_fixes),
        valid=rule.VALID[0].code if rule.VALID else None,
        frameworks=tuple(
            FrameworkNote(name, how, tuple(case.code for case in rule.INVALID if case.framework == name),
                          tuple(case.code for case in rule.VALID if case.framework == name))
            for name, how in rule.FRAMEWORKS.items()),
    )


def explain(code: str) -> str:
    """The documentation of ``code`` for the terminal: its docstring, then ``INVALID[0]`` and its fix,
    then ``VALID[0]``. Raises LookupError for an unknown code."""
    doc = documentation(code)
    lines = [f"# {doc.name} ({doc.code})", ""]
    for section in doc.sections:
        lines += [section.heading, section.body, ""] if section.heading else [section.body, ""]
    lines += [f"Fix: {doc.fix_safety.value}. {default_in_words(doc.default)}", ""]
    if doc.example is not None:
        lines += ["Example:", "", _indent(doc.example)]
        if doc.fixed is not None:
            lines += [f"Becomes{' (with --unsafe-fixes)' if doc.fix_needs_unsafe else ''}:", "", _indent(doc.fixed)]
    if doc.valid is not None:
        lines += ["Valid:", "", _indent(doc.valid)]
    if doc.frameworks:
        lines += ["In each framework:", ""]
    for note in doc.frameworks:
        lines += [f"{note.framework}: {note.how}", ""]
        lines += [part for code in note.reported for part in ("Reported:", "", _indent(code))]
        lines += [part for code in note.left_alone for part in ("Left alone:", "", _indent(code))]
    return "\n".join(lines).rstrip("\n") + "\n"


def default_in_words(default: str) -> str:
    """``Documentation.default`` as a sentence."""
    return {"on": "On by default: yes.", "off": "On by default: no (select it).", "always": "Always reported."}[default]


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


def _sections(docstring: str) -> tuple[Section, ...]:
    """A docstring cut at its headings (a heading opens the text or follows a blank line); text
    before the first heading is a section without one."""
    sections: list[Section] = []
    heading, body = "", []
    lines = inspect.cleandoc(docstring).splitlines()
    for i, line in enumerate(lines):
        if _HEADING.fullmatch(line) and (i == 0 or not lines[i - 1].strip()):
            if heading or "".join(body).strip():
                sections.append(Section(heading, "\n".join(body).strip("\n")))
            heading, body = line, []
        else:
            body.append(line)
    sections.append(Section(heading, "\n".join(body).strip("\n")))
    return tuple(sections)


def _indent(code: str) -> str:
    return "\n".join(f"    {line}" if line else "" for line in code.rstrip("\n").splitlines()) + "\n"
