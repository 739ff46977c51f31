"""Legacy apex scripts, run unchanged in a subprocess: nothing in them mentions ampshim.

Each runs twice: as ``python script.py`` (the ``apex`` name comes from the installed ``.pth``
hook) and as ``python -m ampshim script.py``. The scripts print one JSON line of results.
"""
import json
import math
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # an end-to-end run: `-m slow`, and in CI

ROOT = Path(__file__).resolve().parents[2]
LEGACY = ROOT / "fixtures" / "legacy"
AUTOLOAD_INSTALLED = (Path(sysconfig.get_paths()["purelib"]) / "ampshim-autoload.pth").exists()


def run_script(name, *args, launcher="python", tmp_path=None):
    """Runs a legacy script from a neutral directory and returns its JSON result line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    env.pop("AMPSHIM_AUTOLOAD", None)
    prefix = [sys.executable] if launcher == "python" else [sys.executable, "-m", "ampshim"]
    completed = subprocess.run(prefix + [str(LEGACY / name), *args], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


LAUNCHERS = [
    pytest.param("python", marks=pytest.mark.skipif(
        not AUTOLOAD_INSTALLED, reason="needs a normal install of the package (pip install .)")),
    "ampshim",
]


def improved(losses, window=5):
    return sum(losses[-window:]) / window < 0.8 * sum(losses[:window]) / window


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_o1_script_trains_with_low_precision_forward(launcher, tmp_path):
    result = run_script("train_o1.py", "--checkpoint", str(tmp_path / "c.pt"),
                        launcher=launcher, tmp_path=tmp_path)
    assert improved(result["losses"])
    assert result["param_dtype"] == "torch.float32"
    assert result["output_dtype"] in ("torch.bfloat16", "torch.float16")
    assert list(result["amp_state"]) == ["loss_scaler0"]
    assert result["amp_state"]["loss_scaler0"]["unskipped"] > 0
    assert (tmp_path / "c.pt").exists()


def test_o0_and_o3_run_the_same_script(tmp_path):
    o0 = run_script("train_o1.py", "--opt-level", "O0", launcher="ampshim", tmp_path=tmp_path)
    assert improved(o0["losses"]) and o0["output_dtype"] == "torch.float32"
    o3 = run_script("train_o1.py", "--opt-level", "O3", launcher="ampshim", tmp_path=tmp_path)
    assert o3["param_dtype"] in ("torch.bfloat16", "torch.float16")
    assert o3["amp_state"]["loss_scaler0"]["loss_scale"] == 1.0


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_o2_script_keeps_apex_dtypes(launcher, tmp_path):
    result = run_script("train_o2_batchnorm.py", launcher=launcher, tmp_path=tmp_path)
    assert improved(result["losses"])
    assert result["conv_weight_dtype"] in ("torch.bfloat16", "torch.float16")
    assert result["batchnorm_weight_dtype"] == "torch.float32"
    assert result["master_dtypes"] == ["torch.float32"]
    assert result["output_dtype"] == "torch.float32"
    assert result["state_dict_dtypes"] == ["torch.float32"]


def test_o2_static_loss_scale_from_a_string(tmp_path):
    result = run_script("train_o2_batchnorm.py", "--loss-scale", "128.0", launcher="ampshim",
                        tmp_path=tmp_path)
    assert result["loss_scale"] == 128.0
    assert improved(result["losses"])


def test_gan_keeps_one_scaler_per_loss(tmp_path):
    result = run_script("gan_two_losses.py", launcher="ampshim", tmp_path=tmp_path)
    assert list(result["amp_state"]) == ["loss_scaler0", "loss_scaler1", "loss_scaler2"]
    for state in result["amp_state"].values():
        assert state["unskipped"] > 0
    assert all(v == v for v in result["d_losses"] + result["g_losses"])  # no NaN


def test_accumulation_with_delay_unscale_trains(tmp_path):
    result = run_script("accumulate.py", launcher="ampshim", tmp_path=tmp_path)
    assert improved(result["losses"], window=8)
    # One scale update per non-delayed scale_loss exit: one per accumulation boundary.
    assert result["amp_state"]["loss_scaler0"]["unskipped"] == 20


def test_checkpoint_resume_restores_amp_state(tmp_path):
    result = run_script("checkpoint_resume.py", str(tmp_path / "c.pt"), launcher="ampshim",
                        tmp_path=tmp_path)
    assert result["restored_amp"] == result["saved_amp"]
    # 20 backward passes, each either clean or an overflow that halved the scale from 2**16
    # (float16 on a GPU overflows early; bfloat16 on the CPU does not).
    saved = result["saved_amp"]["loss_scaler0"]
    assert saved["unskipped"] + math.log2(2.**16 / saved["loss_scale"]) == 20
    losses = result["losses"]
    assert sum(losses[-5:]) < sum(losses[:5])


def test_old_handle_api_trains(tmp_path):
    result = run_script("old_handle_api.py", launcher="ampshim", tmp_path=tmp_path)
    assert improved(result["losses"])
    assert result["active"] is True


def test_fp16_optimizer_recipe_trains(tmp_path):
    result = run_script("fp16_optimizer.py", launcher="ampshim", tmp_path=tmp_path)
    assert improved(result["losses"])
    assert result["model_dtype"] == "torch.float16"
    assert result["master_dtype"] == "torch.float32"
    assert {"loss_scaler", "optimizer_state_dict", "fp32_from_fp16"} <= set(result["state_keys"])


def test_internals_real_code_pokes(tmp_path):
    result = run_script("internals.py", launcher="ampshim", tmp_path=tmp_path)
    assert improved(result["losses"])
    assert result["softmax_dtype"] in ("torch.bfloat16", "torch.float16")
    assert result["loss_scale"] == 2.0 ** 10
    assert result["unskipped"] == 30
    assert result["lazy_init_called"] is True
    assert result["has_state_dict"] is True
    assert result["multi_tensor_applier_available"] is False
