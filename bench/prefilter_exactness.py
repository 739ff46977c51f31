"""Does the check before parsing skip a file that a rule would report? Asked of real trees.

For every ``.py`` file of each TREE holding a rule's trigger word, in a plain run, with every
rule (``--select ALL``) and with the training-step rules alone (``--select AMP1``): if
``migrate.prefilter.needs_parsing`` says no, the rules are run on it anyway, and any finding is
printed. Also counts what each stage lets through.

Usage::

    python bench/prefilter_exactness.py /work/trees/dle/PyTorch /work/trees/fairseq

Exit status 1 if a skipped file has a finding.
"""
from __future__ import annotations

import sys
from pathlib import Path

from migrate.api import select_rules
from migrate.file_run import decode
from migrate.engine import run_rules
from migrate.prefilter import may_apply, needs_parsing, step_words, trigger_words
from migrate.types import FileResult


def main(trees: list[str]) -> int:
    selections = {"plain run": None, "ALL": select_rules(["ALL"]), "AMP1": select_rules(["AMP1"])}  # None: a plain run
    missed = 0
    for tree in trees:
        paths = sorted(p for p in Path(tree).rglob("*.py") if p.is_file() and not p.is_symlink())
        for name, selection in selections.items():
            rules = select_rules() if selection is None else selection
            words, stepping = trigger_words(selection), step_words(selection)
            by_words = parsed = 0
            for path in paths:
                decoded = decode(str(path), path.read_bytes())
                if isinstance(decoded, FileResult):
                    continue  # reported as an error whatever the rules say
                text = decoded[0]
                if not may_apply(text, words):
                    continue
                by_words += 1
                if needs_parsing(text, words, stepping):
                    parsed += 1
                    continue
                found = run_rules(text, str(path), rules, fix=False).diagnostics
                if found:
                    missed += 1
                    print(f"SKIPPED BUT REPORTED: {path}: {[d.code for d in found]}")
            print(f"{tree} ({len(paths)} files), {name}: {by_words} hold a trigger word, {parsed} parsed")
    print("no skipped file has a finding" if not missed else f"{missed} skipped files have findings")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
