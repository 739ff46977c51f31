"""Turn results into what people and machines read: text, JSON, GitHub annotations, SARIF, Markdown.

``text`` reads like Ruff (``path:row:col: CODE message [*]``); ``json`` uses Ruff's field names;
``github`` prints workflow commands that annotate a pull request; ``sarif`` is SARIF 2.1.0 for code
scanning. ``migration_report`` is the per-file Markdown report of ``--report FILE``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence
from urllib.parse import quote

from migrate.types import ERROR_CODE, INTERNAL_ERROR_CODE, Diagnostic, FileResult, Safety

__all__ = ["FORMATS", "format_results", "migration_report", "summary"]

FORMATS = ("text", "json", "github", "sarif")
_SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_TOOL_CODES = {
    ERROR_CODE: ("FileError", "The file could not be read, decoded, parsed or written; it was left untouched."),
    INTERNAL_ERROR_CODE: ("InternalError", "A rule failed on this file; it was left untouched. Please report it."),
}


def format_results(results: Sequence[FileResult], output_format: str, rules: Sequence[type] = ()) -> str:
    """All diagnostics of ``results`` in ``output_format`` (one of ``FORMATS``), ending with a newline if any."""
    diagnostics = [d for result in results for d in result.diagnostics]
    if output_format == "text":
        return "".join(f"{_text_line(d)}\n" for d in diagnostics)
    if output_format == "json":
        return json.dumps([_json_item(d) for d in diagnostics], indent=2) + "\n"
    if output_format == "github":
        return "".join(f"{_github_line(d)}\n" for d in diagnostics)
    if output_format == "sarif":
        return json.dumps(_sarif(diagnostics, rules), indent=2) + "\n"
    raise ValueError(f"unknown output format {output_format!r}; choose one of {', '.join(FORMATS)}")


def summary(results: Sequence[FileResult], *, wrote: bool, unsafe_fixes: bool) -> str:
    """One or two closing lines for the text format: what was found, fixed, and could be."""
    diagnostics = [d for r in results for d in r.diagnostics if d.code not in _TOOL_CODES]
    errors = sum(1 for r in results if r.error)
    changed = sum(1 for r in results if _touched(r))
    applied = sum(1 for d in diagnostics if d.applied)
    hidden = sum(1 for d in diagnostics if d.fix and d.fix.applicability is Safety.UNSAFE and not unsafe_fixes)
    lines = []
    if not diagnostics and not errors:
        lines.append(f"All checked! ({_count(len(results), 'file')})")
    else:
        verb = "fixed" if wrote else "fixable"
        remaining = len(diagnostics) - applied
        lines.append(
            f"Found {_count(len(diagnostics), 'finding')} ({applied} {verb}, {remaining} remaining) "
            f"in {_count(len(results), 'file')}; {_count(changed, 'file')} {'changed' if wrote else 'would change'}"
            + (f"; {_count(errors, 'file')} with errors left untouched" if errors else "")
            + "."
        )
    if hidden:
        lines.append(f"{_count(hidden, 'more fix', 'more fixes')} available with --unsafe-fixes.")
    return "\n".join(lines) + "\n"


def _count(number: int, noun: str, plural: str | None = None) -> str:
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def _touched(result: FileResult) -> bool:
    """The file changed, or would with the fixes marked applied (``--check`` computes no new text)."""
    return result.changed or (result.error is None and any(d.applied for d in result.diagnostics))


def _text_line(d: Diagnostic) -> str:
    mark = " [*]" if d.applied else ""
    cell = f"cell {d.location.cell}:" if d.location.cell is not None else ""  # a notebook's, as Ruff writes it
    return f"{d.filename}:{cell}{d.location.row}:{d.location.column}: {d.code} {d.message}{mark}"


def _json_item(d: Diagnostic) -> dict:
    return {
        "code": d.code,
        "message": d.message,
        "filename": d.filename,
        "location": {"row": d.location.row, "column": d.location.column},
        "end_location": {"row": d.end_location.row, "column": d.end_location.column},
        "fix": None if d.fix is None else {"applicability": d.fix.applicability.value, "message": d.fix.message},
        "applied": d.applied,
    }


def _github_line(d: Diagnostic) -> str:
    properties = {
        "file": d.filename,
        "line": d.location.row,
        "col": d.location.column,
        "endLine": d.end_location.row,
        "endColumn": d.end_location.column,
        "title": f"ampmigrate ({d.code})",
    }
    rendered = ",".join(f"{key}={_github_escape(str(value), property=True)}" for key, value in properties.items())
    return f"::error {rendered}::{_github_escape(f'{d.code} {d.message}')}"


def _github_escape(value: str, property: bool = False) -> str:
    value = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return value.replace(":", "%3A").replace(",", "%2C") if property else value


def _sarif(diagnostics: Sequence[Diagnostic], rules: Sequence[type]) -> dict:
    descriptors = [
        {
            "id": rule.CODE,
            "name": rule.name(),
            "shortDescription": {"text": rule.MESSAGE or rule.name()},
            "fullDescription": {"text": _docstring(rule)},
            "help": {"text": _docstring(rule)},
            "properties": {"fixable": rule.fixable()},
        }
        for rule in rules
    ]
    descriptors += [
        {"id": code, "name": name, "shortDescription": {"text": text}} for code, (name, text) in _TOOL_CODES.items()
    ]
    index = {descriptor["id"]: i for i, descriptor in enumerate(descriptors)}
    results = []
    for d in diagnostics:
        result = {
            "ruleId": d.code,
            "level": "error" if d.code in _TOOL_CODES else "warning",
            "message": {"text": d.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": _uri(d.filename)},
                        "region": {
                            "startLine": d.location.row,
                            "startColumn": d.location.column,
                            "endLine": d.end_location.row,
                            "endColumn": d.end_location.column,
                        },
                    }
                }
            ],
        }
        if d.code in index:
            result["ruleIndex"] = index[d.code]
        if d.fix is not None:
            result["properties"] = {"fixApplicability": d.fix.applicability.value, "fixApplied": d.applied}
        results.append(result)
    return {
        "$schema": _SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "ampmigrate", "version": _version(), "rules": descriptors}},
                "results": results,
            }
        ],
    }


def _uri(filename: str) -> str:
    path = Path(filename)
    return path.as_uri() if path.is_absolute() else quote(path.as_posix())


def _docstring(rule: type) -> str:
    import inspect

    return inspect.cleandoc(rule.__doc__ or rule.MESSAGE or rule.name())


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ampshim")
    except PackageNotFoundError:
        return "0+unknown"


def migration_report(results: Sequence[FileResult], *, wrote: bool, unsafe_fixes: bool) -> str:
    """A Markdown report, file by file: what changed, what remains and why, and files with errors."""
    relevant = [r for r in results if r.diagnostics]
    changed = sum(1 for r in results if _touched(r))
    errors = sum(1 for r in results if r.error)
    remaining = sum(1 for r in results for d in r.diagnostics if not d.applied and d.code not in _TOOL_CODES)
    done = "changed" if wrote else "to change"
    lines = [
        "# ampmigrate migration report",
        "",
        f"{_count(len(results), 'file')} checked: {changed} {done}, "
        f"{_count(remaining, 'finding')} left for manual work, {_count(errors, 'file')} with errors (left untouched).",
        "",
    ]
    for result in relevant:
        lines += [f"## `{result.filename}`", ""]
        if result.error:
            lines += [f"**Error:** {result.error}. The file was left untouched.", ""]
        applied = [d for d in result.diagnostics if d.applied]
        left = [d for d in result.diagnostics if not d.applied and d.code not in _TOOL_CODES]
        if applied:
            lines += [f"{'Changed' if wrote else 'Would change'}:", ""]
            lines += [f"- line {d.location.row}: {d.code} {d.fix.message or d.message}" for d in applied]
            lines.append("")
        if left:
            lines += ["Remaining:", ""]
            lines += [f"- line {d.location.row}: {d.code} {d.message} — {_why_left(d, unsafe_fixes)}" for d in left]
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _why_left(d: Diagnostic, unsafe_fixes: bool) -> str:
    if d.fix is None:
        return "no automatic fix: change it by hand"
    if d.fix.applicability is Safety.UNSAFE and not unsafe_fixes:
        return "the fix may change behaviour: review it, then run with --unsafe-fixes"
    return "the fix could not be applied"
