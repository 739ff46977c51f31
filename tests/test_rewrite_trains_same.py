"""A rewrite keeps training the same: each legacy script runs as written under ampshim, and as
``ampmigrate`` rewrote it under plain PyTorch (apex unavailable), from the same seed; their loss
trajectories must agree.

The rewrite targets CUDA (``torch.autocast("cuda", dtype=torch.float16)``), which on a CPU-only
machine would silently disable itself and train in fp32. So on such a machine the rewritten script
runs in ampshim's CPU smoke mode (``ampshim.cuda_on_cpu``): CUDA's autocast and GradScaler on the
CPU, float16 as bfloat16 — exactly what ampshim does for the original — and the two must then agree
closely, step by step.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from migrate.api import migrate_paths, migrate_source

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "fixtures" / "legacy"

CASES = {
    "simple_o1.py": "O1, one loss, one optimizer",
    "train_o1.py": "O1 with clip_grad_norm_(amp.master_params(...)) and amp.state_dict()",
    "accumulate.py": "gradient accumulation with delay_unscale",
    "clip_model_parameters.py": "clip_grad_norm_(model.parameters(), ...) after scale_loss: unscaled first",
    "checkpoint_resume.py": "checkpoint save/load of the amp state, second initialize",
    "gan_two_losses.py": "two models, two optimizers, three losses",
    "native_cuda_amp.py": "the deprecated torch.cuda.amp spelling",
    "static_loss_scale.py": "a static loss_scale: GradScaler starting there that never grows",
    "tuple_loss.py": "the loss bound by tuple unpacking, computed under autocast as apex cast it",
    "cli_loss_scale.py": "a run-time loss scale whose CLI default of 1 is static: the default run trains",
    "loss_in_arms.py": "the loss assigned in both arms of an if/else; the scale read from the state by key",
    "guarded_by_flag.py": "initialize and the scaled backward under a flag and an import guard",
    "accumulate_clip_every_micro_batch.py": "a clip at every micro-batch, the step every fourth: a scale-aware clip",
    "optimizers_list.py": "optimizers stepped in a loop over the scaled list; a second, identical initialize",
    "accumulate_in_arms.py": "delay_unscale in one arm, the boundary backward and step in the other, one forward",
    "trainer_amp_attribute.py": "amp stored on a trainer only when fp16 is on, tested for None; the model stored on self",
    "o0_checkpoint.py": "O0 with the amp state saved and loaded: a disabled GradScaler, fp32 throughout",
    "nan_skip.py": "a NaN loss skipped by a test that calls something, the step after it: no crash where nothing was scaled",
    "model_handed_to_loss.py": "the model handed to a loss method, the step in profiling blocks; a local name for the model",
    "inference_after_initialize.py": "O1 for inference only, at the end of its function: what follows runs under autocast",
    "inference_under_flag.py": "O1 for inference only under a flag with an else arm: the lines after it under autocast by that flag",
    "teacher_for_inference.py": "a teacher readied for inference before the training initialize, under one flag: one scaler",
}


# Loaded first by the rewritten script's interpreter: without CUDA, ampshim's CPU smoke mode runs
# its CUDA autocast and GradScaler on the CPU, float16 as bfloat16; the apex name stays unserved.
CPU_AS_CUDA = """
import torch

if not torch.cuda.is_available():
    import ampshim
    from ampshim import cuda_on_cpu

    ampshim.uninstall()
    cuda_on_cpu.enable()
"""


def run(path, *, under_ampshim, cwd):
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT))
    if under_ampshim:
        env.pop("AMPSHIM_AUTOLOAD", None)
        command = [sys.executable, "-m", "ampshim", str(path)]
    else:
        env["AMPSHIM_AUTOLOAD"] = "0"  # no apex import name: the rewrite must not need it
        site = Path(cwd) / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(CPU_AS_CUDA)
        env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
        command = [sys.executable, str(path)]
    completed = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def loss_series(result):
    return {key: value for key, value in result.items() if key.endswith(("losses", "scales"))}


def dtypes(result):
    return {key: value for key, value in result.items() if key.endswith("dtypes")}


@pytest.mark.parametrize("script", sorted(CASES), ids=lambda s: s.removesuffix(".py"))
def test_rewritten_script_trains_like_the_original(script, tmp_path):
    source = (LEGACY / script).read_text()
    result = migrate_source(source, filename=script, unsafe_fixes=True, select=["ALL"])
    assert result.error is None, result.error
    assert not re.search(r"^\s*(from|import)\s+apex\b", result.new_source, re.M), result.new_source
    rewritten = tmp_path / script
    rewritten.write_text(result.new_source)

    original_result = run(LEGACY / script, under_ampshim=True, cwd=tmp_path)
    migrated_result = run(rewritten, under_ampshim=False, cwd=tmp_path)
    original, migrated = loss_series(original_result), loss_series(migrated_result)
    assert original.keys() == migrated.keys() and original
    assert dtypes(original_result) == dtypes(migrated_result)
    assert_same_series(original, migrated)


def test_a_project_split_in_two_files_trains_like_the_original(tmp_path):
    """``amp.initialize`` in the script, ``amp.scale_loss`` in the module it imports: migrated
    together with safe fixes only, the pair trains as apex did, and the checkpoint's scale agrees."""
    original, rewritten = tmp_path / "original", tmp_path / "rewritten"
    shutil.copytree(LEGACY / "split_halves", original)
    shutil.copytree(LEGACY / "split_halves", rewritten)
    results = migrate_paths([rewritten])
    assert all(result.changed and result.error is None for result in results)
    for path in rewritten.iterdir():
        assert not re.search(r"^\s*(from|import)\s+apex\b", path.read_text(), re.M), path.read_text()

    original_result = run(original / "train.py", under_ampshim=True, cwd=tmp_path)
    migrated_result = run(rewritten / "train.py", under_ampshim=False, cwd=tmp_path)
    before, after = loss_series(original_result), loss_series(migrated_result)
    assert before.keys() == after.keys() == {"losses", "scales"}
    assert_same_series(before, after)


def assert_same_series(original, migrated):
    """Each logged series agrees step by step, up to and including the first step where both
    runs log a non-finite value (an overflowing float16 step, as on a GPU): from there apex's
    loss scale, updated per backward pass, and GradScaler's, updated per optimizer step, may part
    (README's compatibility table)."""
    for key in original:
        assert len(original[key]) == len(migrated[key]), key
        for step, (a, b) in enumerate(zip(original[key], migrated[key])):
            both_nan = math.isnan(a) and math.isnan(b)
            assert a == b or both_nan or abs(a - b) <= 1e-3 + 1e-2 * abs(b), \
                f"{key}[{step}]: {a} under ampshim, {b} rewritten"
            if not math.isfinite(a):
                break
