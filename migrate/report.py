"""Turn results into what people and machines read: text, statistics, JSON, GitHub annotations, SARIF.

``text`` reads like Ruff (``path:row:col: CODE message [*]``), each finding followed by its fix and,
for an unsafe fix, why it is unsafe; ``json`` is Ruff's JSON; ``github`` prints workflow commands
that annotate a pull request; ``sarif`` is SARIF 2.1.0 for code scanning, with rule help and fixes.
GitHub and SARIF name files relative to the repository (the git root, or the current directory).
Every format lists findings by file, line and column.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Sequence
from urllib.parse import quote

import click

from migrate.explain import TOOL_FINDINGS, page_path
from migrate.types import Diagnostic, FileResult, Safety

__all__ = ["FORMATS", "format_results", "show_fixes", "statistics", "summary"]

FORMATS = ("text", "json", "github", "sarif")
_SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_ROOT = "%SRCROOT%"  # SARIF's name for the folder the relative paths start from


def format_results(
    results: Sequence[FileResult], output_format: str, rules: Sequence[type] = (), *, color: bool = False
) -> str:
    """All diagnostics of ``results`` in ``output_format`` (one of ``FORMATS``), ending with a newline if any.

    ``color`` adds ANSI styles to the text format (the caller decides whether a terminal reads it).
    """
    diagnostics = sorted((d for result in results for d in result.diagnostics), key=_place)
    if output_format == "text":
        said: dict[tuple[str, str], int] = {}  # why a file's fixes are unsafe, said once: at this line
        return "".join(_text(d, color, said) for d in diagnostics)
    if output_format in ("json", "sarif"):
        import json  # here: the text output, a pre-commit hook's, never needs it
    if output_format == "json":
        return json.dumps([_json_item(d) for d in diagnostics], indent=2) + "\n"
    if output_format == "github":
        root = repository_root()
        return "".join(f"{_github_line(d, root)}\n" for d in diagnostics)
    if output_format == "sarif":
        return json.dumps(_sarif(diagnostics, rules, repository_root()), indent=2) + "\n"
    raise ValueError(f"unknown output format {output_format!r}; choose one of {', '.join(FORMATS)}")


def _place(d: Diagnostic) -> tuple:
    return d.filename, d.location.cell or 0, d.location.row, d.location.column, d.code


def summary(results: Sequence[FileResult], *, wrote: bool, unsafe_fixes: bool) -> str:
    """One or two closing lines for the text format: what was found, fixed, and could be, and the
    files still on apex. "Remaining" is what the fixed text holds, whether the run wrote it or
    only worked it out (``--check``, ``--diff``): what the next ``--check`` reports after a fix."""
    diagnostics = [d for r in results for d in r.diagnostics if d.code not in TOOL_FINDINGS]
    errors = sum(1 for r in results if r.error)
    changed = sum(1 for r in results if _touched(r))
    applied = sum(1 for d in diagnostics if d.applied)
    hidden = sum(1 for d in diagnostics if _needs_unsafe_fixes(d, unsafe_fixes))
    lines = []
    if not diagnostics and not errors:
        lines.append(f"All checked! ({_count(len(results), 'file')})")
    else:
        verb = "fixed" if wrote else "fixable"
        # what the fixed files hold: a fix takes findings inside what it removes along, and may
        # leave something new to report (a marker it wrote)
        remaining = sum(1 for r in results for d in (r.remaining if r.changed else r.diagnostics)
                        if d.code not in TOOL_FINDINGS and not d.applied)
        lines.append(
            f"Found {_count(applied + remaining, 'finding')} ({applied} {verb}, {remaining} remaining) "
            f"in {_count(len(results), 'file')}; {_count(changed, 'file')} {'changed' if wrote else 'would change'}"
            + (f"; {_count(errors, 'file')} with errors left untouched" if errors else "")
            + "."
        )
    if hidden:
        lines.append(f"{_count(hidden, 'more fix', 'more fixes')} available with --unsafe-fixes.")
    still = still_needing_apex(results)
    if still:
        shown = ", ".join(still[:5]) + (f" and {len(still) - 5} more" if len(still) > 5 else "")
        lines.append(f"{'Still needs' if wrote else 'Would still need'} apex: {shown}.")
    return "\n".join(lines) + "\n"


_APEX_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+apex\b|import[ \t]+apex\b)", re.MULTILINE)


def still_needing_apex(results: Sequence[FileResult]) -> list[str]:
    """The files whose text after the fixes still imports apex (where the run made that text:
    writing or ``--diff``); a migration is only done without them."""
    return [r.filename for r in results
            if r.error is None and r.new_source is not None and _APEX_IMPORT.search(r.new_source)]


def statistics(results: Sequence[FileResult], rules: Sequence[type] = (), output_format: str = "text") -> str:
    """``--statistics``: one line per code, most frequent first: count, code, ``[*]`` if fixable, name.
    With ``json``, Ruff's list of ``{"code", "name", "count", "fixable"}`` objects, in the same order."""
    names = {rule.CODE: rule.name() for rule in rules} | {code: name for code, (name, _, _) in TOOL_FINDINGS.items()}
    counts = Counter(d.code for r in results for d in r.diagnostics)
    fixable = {d.code for r in results for d in r.diagnostics if d.applied}
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if output_format == "json":
        import json

        listed = [{"code": code, "name": names.get(code, ""), "count": n, "fixable": code in fixable} for code, n in rows]
        return json.dumps(listed, indent=2) + "\n"
    width = max((len(str(n)) for _, n in rows), default=1)
    return "".join(
        f"{n:>{width}}\t{code}\t{'[*]' if code in fixable else '   '} {names.get(code, '')}".rstrip() + "\n"
        for code, n in rows
    )


def show_fixes(results: Sequence[FileResult], *, wrote: bool) -> str:
    """``--show-fixes``: the fixes applied (or that would be), per file, counted per code and fix."""
    lines = []
    for result in results:
        counts = Counter((d.code, d.fix.message) for d in result.diagnostics if d.applied and d.fix)
        if counts:
            lines.append(f"- {result.filename}:")
            lines += [f"    {n} × {code} ({message})" for (code, message), n in sorted(counts.items())]
    if not lines:
        return ""
    total = sum(1 for r in results for d in r.diagnostics if d.applied)
    return f"{'Fixed' if wrote else 'Would fix'} {_count(total, 'finding')}:\n" + "\n".join(lines) + "\n"


def _count(number: int, noun: str, plural: str | None = None) -> str:
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def _touched(result: FileResult) -> bool:
    """The file changed, or would with the fixes marked applied (``--check`` computes no new text)."""
    return result.changed or (result.error is None and any(d.applied for d in result.diagnostics))


def _needs_unsafe_fixes(d: Diagnostic, unsafe_fixes: bool) -> bool:
    return d.fix is not None and d.fix.applicability is Safety.UNSAFE and not unsafe_fixes and not d.applied


def _text(d: Diagnostic, color: bool, said: dict[tuple[str, str], int] | None = None) -> str:
    """One finding as text; ``said``: the reasons already given for the file's unsafe fixes (a
    file's rewrite shares one reason across its sites: it is said once, then pointed to)."""
    def style(text: str, **how) -> str:
        return click.style(text, **how) if color else text

    mark = " " + style("[*]", fg="cyan") if d.applied else ""
    cell = f"cell {d.location.cell}:" if d.location.cell is not None else ""  # a notebook's, as Ruff writes it
    where = f"{style(d.filename, bold=True)}:{cell}{d.location.row}:{d.location.column}:"
    lines = [f"{where} {style(d.code, fg='red', bold=True)} {d.message}{mark}\n"]
    lines += [f"  {style('also:', fg='blue')} {d.filename}:{related.location.row}:{related.location.column}: {related.message}\n"
              for related in d.related]
    if d.fix is not None:
        if d.fix.applicability is Safety.SAFE:
            lines.append(f"  {style('fix:', fg='green')} {d.fix.message}\n")
        else:
            needs = "" if d.applied else " (with --unsafe-fixes)"
            lines.append(f"  {style('unsafe fix' + needs + ':', fg='yellow')} {d.fix.message}\n")
            why = d.fix.why_unsafe or "it may change behaviour"
            first = said.get((d.filename, why)) if said is not None else None
            if first is None and said is not None:
                said[(d.filename, why)] = d.location.row
            lines.append(f"  {style('why unsafe:', fg='yellow')} {why if first is None else f'as at line {first}'}\n")
    return "".join(lines)


def _json_item(d: Diagnostic) -> dict:
    """Ruff's JSON fields. ``noqa_row`` is the line a ``# noqa`` comment goes on."""
    fix = None
    if d.fix is not None:
        fix = {
            "applicability": d.fix.applicability.value,
            "message": d.fix.message,
            "edits": [
                {"content": edit.content, "location": _json_position(edit.location), "end_location": _json_position(edit.end_location)}
                for edit in d.fix.edits
            ],
        }
    item = {
        "cell": d.location.cell,  # a notebook's cell, from 1; None in a Python file
        "code": d.code,
        "message": d.message,
        "filename": d.filename,
        "location": _json_position(d.location),
        "end_location": _json_position(d.end_location),
        "fix": fix,
        "url": page_path(d.code),  # its page in ampmigrate's repository, from the root: no website is published
        "noqa_row": d.location.row,
    }
    if d.related:  # beyond Ruff's fields: the other places of the same cause
        item["related"] = [
            {"message": r.message, "location": _json_position(r.location), "end_location": _json_position(r.end_location)}
            for r in d.related
        ]
    return item


def _json_position(position) -> dict:
    return {"row": position.row, "column": position.column}


def repository_root(start: Path | None = None) -> Path:
    """The git work tree holding ``start`` (the current directory), or that directory outside one."""
    start = Path(os.path.realpath(start or Path.cwd()))
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return start


def repository_path(filename: str, root: Path) -> str | None:
    """``filename`` relative to ``root``, in POSIX form; None for a file outside it."""
    try:
        return Path(os.path.realpath(filename)).relative_to(root).as_posix()
    except ValueError:
        return None


def _github_line(d: Diagnostic, root: Path) -> str:
    properties = {
        "file": repository_path(d.filename, root) or d.filename,
        "line": d.location.row,
        "col": d.location.column,
        "endLine": d.end_location.row,
        "endColumn": d.end_location.column,
        "title": d.code if d.location.cell is None else f"{d.code} in {_cell_place(d)}",
    }
    rendered = ",".join(f"{key}={_github_escape(str(value), property=True)}" for key, value in properties.items())
    message = d.message + (f" (fix: {d.fix.message})" if d.fix is not None else "")
    if d.related:
        message += " (also " + "; ".join(f"line {r.location.row}: {r.message}" for r in d.related) + ")"
    return f"::error {rendered}::{_github_escape(message)}"


def _cell_place(d: Diagnostic) -> str:
    """Where a notebook's finding is, said in words: formats that give lines give a line of the
    file, and a notebook's are lines of its JSON, so the cell must be named beside them."""
    return f"cell {d.location.cell}, line {d.location.row}"


def _github_escape(value: str, property: bool = False) -> str:
    value = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return value.replace(":", "%3A").replace(",", "%2C") if property else value


def _sarif(diagnostics: Sequence[Diagnostic], rules: Sequence[type], root: Path) -> dict:
    descriptors = [
        {
            "id": rule.CODE,
            "name": rule.name(),
            "shortDescription": {"text": rule.MESSAGE or rule.name()},
            "fullDescription": {"text": _docstring(rule)},
            "help": {"text": _docstring(rule), "markdown": _docstring(rule)},
            "defaultConfiguration": {"enabled": bool(rule.DEFAULT), "level": "warning"},
            "properties": {"fixSafety": rule.FIX_SAFETY.value},
        }
        for rule in rules
    ]
    descriptors += [
        {
            "id": code,
            "name": name,
            "shortDescription": {"text": text},
            "help": {"text": doc},
            "defaultConfiguration": {"level": "error"},
        }
        for code, (name, text, doc) in TOOL_FINDINGS.items()
    ]
    index = {descriptor["id"]: i for i, descriptor in enumerate(descriptors)}
    results = []
    for d in diagnostics:
        artifact = _artifact(d.filename, root)
        location = {"physicalLocation": {"artifactLocation": artifact, "region": _region(d.location, d.end_location)}}
        message = d.message
        if d.location.cell is not None:
            # SARIF has no notion of a notebook cell: its region is in the cell (as in the text and
            # JSON formats), the cell a logical location, and the message says it for the viewers
            # that show only the message and a line (GitHub code scanning)
            cell = f"cell {d.location.cell}"
            location["logicalLocations"] = [{"name": cell, "fullyQualifiedName": f"{artifact['uri']}:{cell}"}]
            message = f"{_cell_place(d)}: {message}"
        result = {
            "ruleId": d.code,
            "level": "error" if d.code in TOOL_FINDINGS else "warning",
            "message": {"text": message},
            "locations": [location],
        }
        if d.code in index:
            result["ruleIndex"] = index[d.code]
        if d.related:
            result["relatedLocations"] = [
                {"id": number, "message": {"text": r.message},
                 "physicalLocation": {"artifactLocation": artifact, "region": _region(r.location, r.end_location)}}
                for number, r in enumerate(d.related, 1)
            ]
        if d.fix is not None:
            result["properties"] = {"fixApplicability": d.fix.applicability.value, "fixMessage": d.fix.message}
            if d.fix.why_unsafe:
                result["properties"]["whyUnsafe"] = d.fix.why_unsafe
            if d.fix.edits:
                replacements = [
                    {"deletedRegion": _region(e.location, e.end_location), "insertedContent": {"text": e.content}}
                    for e in d.fix.edits
                ]
                result["fixes"] = [
                    {"description": {"text": d.fix.message}, "artifactChanges": [{"artifactLocation": artifact, "replacements": replacements}]}
                ]
        results.append(result)
    return {
        "$schema": _SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "ampmigrate", "version": _version(), "rules": descriptors}},
                "originalUriBaseIds": {_ROOT: {"uri": root.as_uri() + "/"}},
                "results": results,
            }
        ],
    }


def _artifact(filename: str, root: Path) -> dict:
    """A path in the repository as a relative URI from ``%SRCROOT%``; any other as an absolute one."""
    relative = repository_path(filename, root)
    if relative is not None:
        return {"uri": quote(relative), "uriBaseId": _ROOT}
    path = Path(filename)
    return {"uri": path.as_uri() if path.is_absolute() else quote(path.as_posix())}


def _region(start, end) -> dict:
    return {"startLine": start.row, "startColumn": start.column, "endLine": end.row, "endColumn": end.column}


def _docstring(rule: type) -> str:
    import inspect

    return inspect.cleandoc(rule.__doc__ or rule.MESSAGE or rule.name())


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ampshim")
    except PackageNotFoundError:
        return "0+unknown"
