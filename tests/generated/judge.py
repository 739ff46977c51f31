"""A generated script against its safe and its ``--unsafe-fixes`` rewrite, judged by compare."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ampshim.compare import DIFFERS, SAME, Target, compare
from ampshim.compare.report import as_text
from migrate.api import migrate_source

from generated.apex_scripts import Features, script

APEX_IMPORT = re.compile(r"^\s*(from|import)\s+apex\b", re.M)
MARKER = "TODO(ampmigrate)"
# A marker's comment block and the two lines after it: where it says what differs there.
MARKED_LINES = re.compile(r"#\s*TODO\(ampmigrate\).*\n(?:\s*#.*\n)*(?P<lines>.*\n.*)")
READS_GRADIENTS = re.compile(r"clip|norm|grad|tracker")  # the generator's gradient readers


def marked_where_it_differs(source: str, verdict: str) -> bool:
    """A difference the compare places (gradients clipped while still scaled) needs its marker
    at a line reading gradients; any other, a marker anywhere."""
    if verdict != "differs: clip-scaled":
        return MARKER in source
    return any(READS_GRADIENTS.search(found.group("lines")) for found in MARKED_LINES.finditer(source))


ORIGINAL_FAILED = "could not run (original)"


@dataclass
class Outcome:
    safe: str  # unchanged | same | <verdict: cause>
    unsafe: str
    safe_complete: bool  # the safe rewrite left no apex import
    safe_wrong: bool
    unsafe_crash: bool
    unsafe_unmarked: bool
    reports: dict
    original_failed: bool = False  # the apex script itself did not run (twice): counted above, and told apart by the bench

    @property
    def summary(self) -> str:
        return f"safe {self.safe:28} unsafe {self.unsafe:28}"


def runs_of(features: Features) -> list[list[str]]:
    """The command lines a script is compared under: its default, and its flag turned over.
    Not apex's path under the native path's own region (``Features.own_autocast``): that region is
    off there, and ampshim's O1 follows it where apex's casts did not (docs/compatibility.md), so
    the original run under ampshim is not apex's there."""
    flipped = {"on": ["--no-fp16"], "off": ["--fp16"]}.get(features.flag)
    if features.own_autocast != "none":
        flipped = None
    return [[]] + ([flipped] if flipped else [])


def judge(features: Features, folder: Path, *, fork: bool = False) -> Outcome:
    """Both rewrites of the script drawn, each compared with it; ``fork``: see ``compare``."""
    folder.mkdir(parents=True, exist_ok=True)
    original = folder / "original.py"
    original.write_text(script(features))
    verdicts, reports, sources = {}, {}, {}
    for mode in ("safe", "unsafe"):
        result = migrate_source(original.read_text(), filename="train.py",
                                unsafe_fixes=mode == "unsafe")
        sources[mode] = result.new_source
        if result.error is not None:
            verdicts[mode], reports[mode] = "error", str(result.error)
            continue
        if result.new_source == original.read_text():
            verdicts[mode] = "unchanged"
            continue
        if mode == "unsafe" and result.new_source == sources["safe"]:
            verdicts[mode] = verdicts["safe"]  # the same rewrite: the same runs
            if "safe" in reports:
                reports[mode] = reports["safe"]
            continue
        rewritten = folder / f"{mode}.py"
        rewritten.write_text(result.new_source)
        verdicts[mode] = "same"
        for args in runs_of(features):  # the default run, and the flag turned the other way
            for _ in range(2):  # the original failing is no rewrite's doing: a run past the timeout (load) is tried again
                comparison = compare(Target(str(original)), Target(str(rewritten)), args,
                                     device="cpu", steps=50, parallel=True, timeout=240,
                                     allow_apex=bool(APEX_IMPORT.search(result.new_source)),
                                     fork=fork)
                if comparison.verdict == SAME or comparison.failed_side != "original":
                    break
            if comparison.verdict == SAME:
                continue
            reports[mode] = " ".join(args) + "\n" + as_text(comparison)
            if comparison.verdict == DIFFERS:
                verdicts[mode] = f"differs: {comparison.difference.cause}"
            else:
                verdicts[mode] = f"could not run ({comparison.failed_side})"
            break
    # counted as wrong or crashing all the same (a test must not pass on a script that never ran); the bench tells them apart
    original_failed = ORIGINAL_FAILED in (verdicts["safe"], verdicts["unsafe"])
    safe_wrong = verdicts["safe"] not in ("same", "unchanged")
    unsafe_crash = verdicts["unsafe"].startswith(("differs: crash", "could not run", "error"))
    unsafe_unmarked = (verdicts["unsafe"].startswith("differs") and not unsafe_crash
                       and not marked_where_it_differs(sources["unsafe"], verdicts["unsafe"]))
    return Outcome(verdicts["safe"], verdicts["unsafe"],
                   safe_complete=verdicts["safe"] == "same" and not APEX_IMPORT.search(sources["safe"]),
                   safe_wrong=safe_wrong, unsafe_crash=unsafe_crash,
                   unsafe_unmarked=unsafe_unmarked, reports=reports, original_failed=original_failed)
