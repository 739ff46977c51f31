"""``bench/migrate_speed.py``'s comparisons counted in instructions, which do not move between runs.

On a shared or noisy machine wall-clock times of the same command differ by a third from one run
to the next; the number of instructions a process executes does not. Each command runs under
``valgrind --tool=cachegrind --cache-sim=no`` (about fifty times slower than natively), the pairs
side by side, in fresh processes sharing one bytecode cache filled beforehand, as an install has it:

1. ``ampmigrate --check -q -j 1 TREE`` (every file in one process: the work the workers share)
   against libcst parsing every ``.py`` file of TREE in one process.
2. ``ampmigrate --check FILE`` against ``python -c "import libcst"``.

Both sides count the interpreter's start-up. The wall-clock goals (``--check`` of a tree at most
0.3x libcst's parse with the machine's cores, one file at most 1.3x the import) are
``migrate_speed.py``'s; these ratios say where the work went, and whether a change reduced it.

Usage::

    python bench/migrate_instructions.py --tree /work/trees/detectron2 --file fixtures/legacy/train_o1.py
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from migrate_speed import _PARSE_TREE, REPO, _ampmigrate, _env

_COUNT = re.compile(rb"I\s+refs:\s+([\d,]+)")


def _start(command: list[str], env: dict) -> subprocess.Popen:
    valgrind = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    return subprocess.Popen([*valgrind, *command], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _instructions(process: subprocess.Popen) -> int:
    _, stderr = process.communicate()
    found = _COUNT.search(stderr)
    if found is None:
        raise SystemExit(f"valgrind gave no count:\n{stderr.decode(errors='replace')[-2000:]}")
    return int(found.group(1).replace(b",", b""))


def _side_by_side(first: list[str], second: list[str], env: dict) -> tuple[int, int]:
    """The instructions of two commands, run at the same time (counts do not depend on the load)."""
    one, other = _start(first, env), _start(second, env)
    return _instructions(one), _instructions(other)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="a real source tree (repeatable)")
    parser.add_argument("--file", default=str(REPO / "fixtures" / "legacy" / "train_o1.py"), help="one file")
    options = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: this benchmark counts instructions with cachegrind")

    with tempfile.TemporaryDirectory(prefix="ampmigrate-instructions-") as directory:
        env = _env(str(Path(directory) / "bytecode"))
        for tree in options.tree:
            subprocess.run(_ampmigrate("--check", "-q", "-j", "1", tree), env=env, capture_output=True)  # bytecode
            check, parse = _side_by_side(
                _ampmigrate("--check", "-q", "-j", "1", tree), [sys.executable, "-c", _PARSE_TREE, tree], env
            )
            print(f"{tree}: --check -j 1 {check / 1e9:.2f} G instructions, libcst parse {parse / 1e9:.2f} G, "
                  f"ratio {check / parse:.3f}")
        subprocess.run(_ampmigrate("--check", options.file), env=env, capture_output=True)
        one, imports = _side_by_side(_ampmigrate("--check", options.file), [sys.executable, "-c", "import libcst"], env)
        print(f"{options.file}: --check {one / 1e9:.3f} G instructions, import libcst {imports / 1e9:.3f} G, "
              f"ratio {one / imports:.2f}")


if __name__ == "__main__":
    main()
