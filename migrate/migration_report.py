"""``--report FILE``: a Markdown plan for a migration, for the people who will finish it.

First a summary table (files, sites, what a plain run fixes safely, what ``--unsafe-fixes`` would
fix and why it is unsafe, what is left by hand, files with errors), then, file by file, what
remains and how to do it. A site is one finding of a rule (the tool's own errors are counted apart).
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

from migrate.explain import TOOL_FINDINGS
from migrate.types import Diagnostic, FileResult, Safety

__all__ = ["migration_report"]


def migration_report(results: Sequence[FileResult], *, wrote: bool, unsafe_fixes: bool) -> str:
    """The plan, after a run that ``wrote`` its fixes (or only checked), with or without ``unsafe_fixes``."""
    sites = {kind: [] for kind in ("safe", "unsafe", "manual")}
    files = {kind: set() for kind in (*sites, "all", "error")}
    for result in results:
        if result.error:
            files["error"].add(result.filename)
        for d in result.diagnostics:
            if d.code not in TOOL_FINDINGS:
                sites[_kind(d)].append(d)
                files[_kind(d)].add(result.filename)
                files["all"].add(result.filename)
    safe_done = "fixed safely" if wrote else "fixed safely by a plain run"
    unsafe_done = ("fixed with --unsafe-fixes" if wrote else "fixed by a run with --unsafe-fixes") if unsafe_fixes \
        else "fixable with --unsafe-fixes (not applied)"
    lines = [
        "# ampmigrate migration plan",
        "",
        f"{_count(len(results), 'file')} checked, {len(files['all'])} with something to migrate.",
        "",
        "| | files | sites |",
        "|---|---:|---:|",
        f"| found | {len(files['all'])} | {sum(len(v) for v in sites.values())} |",
        f"| {safe_done} | {len(files['safe'])} | {len(sites['safe'])} |",
        f"| {unsafe_done} | {len(files['unsafe'])} | {len(sites['unsafe'])} |",
        f"| manual | {len(files['manual'])} | {len(sites['manual'])} |",
        f"| could not be processed (left untouched) | {len(files['error'])} | |",
        "",
    ]
    if sites["unsafe"]:
        lines += ["## Why the unsafe fixes are unsafe", "", "Review these before running with `--unsafe-fixes`:", ""]
        reasons = Counter(d.fix.why_unsafe or "it may change behaviour" for d in sites["unsafe"])
        lines += [f"- {why} ({_count(n, 'site')})" for why, n in reasons.most_common()]
        lines.append("")
    lines += ["## What remains, file by file", ""]
    remaining_files = 0
    for result in results:
        left = _remaining(result, wrote)
        if not left and not result.error:
            continue
        remaining_files += 1
        done = sum(1 for d in result.diagnostics if d.applied and d.code not in TOOL_FINDINGS)
        lines += [f"### `{result.filename}`", ""]
        if result.error:
            lines += [f"**Not processed:** {result.error}. The file was left untouched; "
                      "fix this first (`ampmigrate --explain AMP900`).", ""]
        if done:
            lines += [f"{_count(done, 'site')} {'fixed' if wrote else 'fixed by a plain run'}.", ""]
        lines += [f"- line {d.location.row}: {d.code} {d.message}\n  - how: {_how(d, unsafe_fixes)}" for d in left]
        if left:
            lines.append("")
    if not remaining_files:
        lines += ["Nothing: every site is fixed." if wrote else "Nothing beyond what a plain run fixes.", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _kind(d: Diagnostic) -> str:
    if d.fix is None:
        return "manual"
    return "safe" if d.fix.applicability is Safety.SAFE else "unsafe"


def _remaining(result: FileResult, wrote: bool) -> list[Diagnostic]:
    """What a person still has to do: after a rewrite, where it now is; after a check, what a plain run leaves."""
    found = result.remaining if wrote else [d for d in result.diagnostics if not d.applied]
    return [d for d in found if d.code not in TOOL_FINDINGS]


def _how(d: Diagnostic, unsafe_fixes: bool) -> str:
    if d.fix is None:
        return f"by hand, as the message says (`ampmigrate --explain {d.code}`)"
    if d.fix.applicability is Safety.UNSAFE and not unsafe_fixes:
        return (f"`--unsafe-fixes` would {d.fix.message[:1].lower()}{d.fix.message[1:]}; "
                f"unsafe because {d.fix.why_unsafe or 'it may change behaviour'}: review, then run with --unsafe-fixes")
    return f"the fix ({d.fix.message}) could not be applied with the others: apply it by hand"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun if number == 1 else noun + 's'}"
