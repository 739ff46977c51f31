"""What does fixing cost beside checking? ``ampmigrate --check``, ``--diff`` and a fixing run (on a
copy) over the same tree, side by side, round after round, each in a fresh process; the medians,
and each against ``--check``. Goal: fixing at most about twice what checking costs.

    python bench/fix_vs_check.py [TREE ...] [--rounds 5]

TREE defaults to ``fixtures/legacy``.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = {"--check": ["--check"], "--diff": ["--diff"], "fix": ["--exit-zero", "-q"]}


def _run(mode: str, tree: Path) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        target = tree
        if mode == "fix":  # a fixing run writes: it gets a copy
            target = Path(scratch) / "tree"
            shutil.copytree(tree, target)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "migrate", *MODES[mode], "-j", "1", str(target)],
                       cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trees", nargs="*", type=Path, default=[ROOT / "fixtures" / "legacy"])
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    for tree in options.trees:
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(options.rounds):  # interleaved: a slow moment of the machine hits every mode
            for mode in MODES:
                times[mode].append(_run(mode, tree))
        check = statistics.median(times["--check"])
        print(f"{tree}: " + "; ".join(
            f"{mode} {statistics.median(found):.2f} s ({statistics.median(found) / check:.1f}x)" for mode, found in times.items()))


if __name__ == "__main__":
    main()
