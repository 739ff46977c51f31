"""The README's main jobs, as a user runs them right after installing: ``ampmigrate`` rewrites the
bundled legacy example in place, and the result trains under plain PyTorch with no apex at all."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # an end-to-end run: `-m slow`, and in CI

ROOT = Path(__file__).resolve().parents[1]


def ampmigrate(*args, cwd):
    command = shutil.which("ampmigrate")
    prefix = [command] if command else [sys.executable, "-c", "from migrate.cli import main; main()"]
    return subprocess.run(prefix + list(args), cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_ampmigrate_rewrites_the_bundled_example_into_a_native_script_that_runs(tmp_path):
    script = tmp_path / "simple_o1.py"
    shutil.copy(ROOT / "fixtures" / "legacy" / "simple_o1.py", script)

    diff = ampmigrate("--diff", str(script), cwd=tmp_path)
    assert diff.returncode == 1, diff.stderr
    assert "+    scaler = torch.amp.GradScaler(\"cuda\")" in diff.stdout
    assert script.read_text() == (ROOT / "fixtures" / "legacy" / "simple_o1.py").read_text()

    rewrite = ampmigrate(str(script), cwd=tmp_path)
    assert rewrite.returncode == 1, rewrite.stderr
    assert "from apex" not in script.read_text()
    assert ampmigrate("--check", str(script), cwd=tmp_path).returncode == 0  # nothing left

    completed = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                               text=True, timeout=300,
                               env=dict(os.environ, AMPSHIM_AUTOLOAD="0", PYTHONWARNINGS="ignore"))
    assert completed.returncode == 0, completed.stderr
    losses = json.loads(completed.stdout.splitlines()[-1])["losses"]
    assert losses[-1] < 0.9 * losses[0]

    # ... and trains as the original did on ampshim, step for step.
    compared = subprocess.run(
        [sys.executable, "-m", "ampshim", "compare", "--device", "cpu",
         str(ROOT / "fixtures" / "legacy" / "simple_o1.py"), str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "SAME: 20 optimizer steps" in compared.stdout
