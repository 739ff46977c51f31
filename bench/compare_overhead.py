"""What ``python -m ampshim compare`` costs beyond the two scripts' own time.

For each pair, in alternating rounds: the two scripts run one after the other as a user would
(``python -m ampshim --device cpu SCRIPT``), then ``python -m ampshim compare --device cpu`` runs
the same pair (one after the other, ``--steps`` above the scripts' own count, so both train to
their end). Prints the medians and the difference side by side.

    python bench/compare_overhead.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from migrate.api import migrate_source  # noqa: E402

PAIRS = ["fixtures/compare/original.py", "fixtures/legacy/simple_o1.py",
         "fixtures/legacy/train_o2_batchnorm.py"]


def seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=False, capture_output=True, cwd=tempfile.gettempdir())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="compare-bench-"))
    print(f"{'original':40} {'two scripts':>12} {'compare':>9} {'overhead':>9} {'ratio':>6}")
    for relative in PAIRS:
        original = ROOT / relative
        migrated = folder / original.name
        if relative == "fixtures/compare/original.py":
            migrated = ROOT / "fixtures/compare/migrated.py"
        else:
            migrated.write_text(migrate_source(original.read_text(), filename=original.name,
                                               unsafe_fixes=True, select=["ALL"]).new_source)
        plain, compared = [], []
        for _ in range(options.rounds):
            plain.append(sum(seconds([sys.executable, "-m", "ampshim", "--device", "cpu", str(path)])
                             for path in (original, migrated)))
            compared.append(seconds([sys.executable, "-m", "ampshim", "compare", "--device", "cpu",
                                     "--steps", "1000000", str(original), str(migrated)]))
        a, b = statistics.median(plain), statistics.median(compared)
        print(f"{relative:40} {a:>11.2f}s {b:>8.2f}s {b - a:>+8.2f}s {b / a:>6.2f}")


if __name__ == "__main__":
    main()
