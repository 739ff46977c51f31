"""A rewrite keeps training the same: each legacy script runs as written under ampshim, and as
``ampmigrate`` rewrote it under plain PyTorch (apex unavailable), from the same seed; their loss
trajectories must agree.

On a CPU the original trains with ampshim's bfloat16 autocast, while the rewrite's
``torch.autocast("cuda", ...)`` and ``GradScaler("cuda")`` disable themselves and train in fp32,
so the tolerance is bfloat16's, not bitwise.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from migrate.api import migrate_source

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "fixtures" / "legacy"

CASES = {
    "simple_o1.py": "O1, one loss, one optimizer",
    "train_o1.py": "O1 with clip_grad_norm_(amp.master_params(...)) and amp.state_dict()",
    "accumulate.py": "gradient accumulation with delay_unscale",
    "checkpoint_resume.py": "checkpoint save/load of the amp state, second initialize",
    "gan_two_losses.py": "two models, two optimizers, three losses",
    "native_cuda_amp.py": "the deprecated torch.cuda.amp spelling",
}


def run(path, *, under_ampshim, cwd):
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT))
    if under_ampshim:
        env.pop("AMPSHIM_AUTOLOAD", None)
        command = [sys.executable, "-m", "ampshim", str(path)]
    else:
        env["AMPSHIM_AUTOLOAD"] = "0"  # no apex import name: the rewrite must not need it
        command = [sys.executable, str(path)]
    completed = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def loss_series(result):
    return {key: value for key, value in result.items() if key.endswith("losses")}


@pytest.mark.parametrize("script", sorted(CASES), ids=lambda s: s.removesuffix(".py"))
def test_rewritten_script_trains_like_the_original(script, tmp_path):
    source = (LEGACY / script).read_text()
    result = migrate_source(source, filename=script, unsafe_fixes=True)
    assert result.error is None, result.error
    assert "apex" not in result.new_source, result.new_source
    rewritten = tmp_path / script
    rewritten.write_text(result.new_source)

    original = loss_series(run(LEGACY / script, under_ampshim=True, cwd=tmp_path))
    migrated = loss_series(run(rewritten, under_ampshim=False, cwd=tmp_path))
    assert original.keys() == migrated.keys() and original
    for key in original:
        before, after = original[key], migrated[key]
        assert len(before) == len(after)
        for step, (a, b) in enumerate(zip(before, after)):
            assert abs(a - b) <= 0.03 + 0.05 * abs(b), f"{key}[{step}]: {a} under ampshim, {b} rewritten"
