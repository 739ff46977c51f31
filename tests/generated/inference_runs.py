"""An evaluation script and its safe rewrite, each run on ampshim with CUDA mapped to the CPU
(float16 autocast as bfloat16): they must print the same lines."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from migrate.api import migrate_source


def printed(path: Path, *argv: str) -> str:
    """The lines ``path`` prints, run as a script on ampshim, that begin ``out`` (not apex's banner of
    the options it chose)."""
    done = subprocess.run([sys.executable, "-m", "ampshim", "--device", "cpu", str(path), *argv], capture_output=True,
                          text=True, timeout=300, cwd=path.parent)
    assert done.returncode == 0, done.stderr
    return "\n".join(line for line in done.stdout.splitlines() if line.startswith("out "))


def printed_alike(tmp_path: Path, source: str, name: str, argv: list[str]) -> str:
    """What ``source`` (on ampshim) prints, checked equal to what its safe rewrite, free of apex, prints."""
    original = tmp_path / "original" / name
    original.parent.mkdir()
    original.write_text(source)
    migrated = tmp_path / "migrated" / name
    migrated.parent.mkdir()
    migrated.write_text(migrate_source(source, name).new_source)
    # free of apex: no import of it (a run-time check's message may name it)
    assert not re.search(r"^\s*(from apex\b|import apex\b)|(?<![.\w])amp\.", migrated.read_text(), re.MULTILINE), migrated.read_text()
    expected = printed(original, *argv)
    assert expected == printed(migrated, *argv)
    return expected
