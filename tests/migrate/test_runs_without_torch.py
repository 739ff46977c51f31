"""``migrate`` never imports torch or ampshim: the linter installs and runs without them (the
pre-commit hook's environment has neither). Each mode of the command line over the fixtures, in a
fresh interpreter where importing either raises."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = """\
import importlib.abc, runpy, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "ampshim"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Blocked())
sys.argv = ["ampmigrate", *sys.argv[1:]]
runpy.run_module("migrate", run_name="__main__")
"""


@pytest.mark.parametrize("mode", [["--check"], ["--diff"], ["--diff", "--unsafe-fixes"], ["--list-rules"]])
def test_the_command_line_runs_with_torch_and_ampshim_unimportable(mode):
    target = [] if mode == ["--list-rules"] else [str(ROOT / "fixtures" / "legacy")]
    done = subprocess.run([sys.executable, "-c", BLOCKED, *mode, *target], capture_output=True, text=True, cwd=ROOT, timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode in (0, 1), said
    assert "blocked:" not in said and "Traceback" not in said and "a rule crashed" not in said, said
    assert "Found" in said or mode == ["--list-rules"], said
