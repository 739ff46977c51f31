"""Checkpoints of every generation load with ``torch.load(path)`` (``weights_only=True``) and train on."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from _amp_testing import exact_linear, fresh_amp_state, int_batch, quiet  # noqa: F401
from ampshim import amp
from ampshim.fp16_utils.checkpoint import loss_scaler_from_checkpoint
from ampshim.fp16_utils import DynamicLossScaler, FP16_Optimizer
from ampshim.fp16_utils import LossScaler as StaticFp16LossScaler
from ampshim.optimizers import (FusedAdagrad, FusedAdam, FusedLAMB, FusedMixedPrecisionLamb,
                                FusedNovoGrad, FusedSGD)
from ampshim.scaler import LossScaler

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [quiet, pytest.mark.filterwarnings(
    "ignore::ampshim.deprecation.DeprecatedFeatureWarning")]


def save_and_load(obj, path):
    torch.save(obj, path)
    return torch.load(path)  # torch's default: weights_only=True


def half_model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2).half()


# --- what ampshim saves ------------------------------------------------------------------------


@pytest.mark.slow
def test_amp_checkpoint_of_an_o2_run_loads_with_plain_torch_load(tmp_path):
    model = exact_linear()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", num_losses=2,
                                      verbosity=0)
    for loss_id in (0, 1):
        with amp.scale_loss(model(int_batch(1)).float().sum(), optimizer,
                            loss_id=loss_id) as scaled:
            scaled.backward()
    optimizer.step()
    loaded = save_and_load({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "amp": amp.state_dict()}, tmp_path / "o2.pt")
    assert loaded["amp"] == {"loss_scaler0": {"loss_scale": 2.**16, "unskipped": 1},
                             "loss_scaler1": {"loss_scale": 2.**16, "unskipped": 1}}
    optimizer.load_state_dict(loaded["optimizer"])
    amp.load_state_dict(loaded["amp"])


def test_fp16_optimizer_checkpoint_loads_with_plain_torch_load(tmp_path):
    model = half_model()
    optimizer = FP16_Optimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                               dynamic_loss_scale=True, dynamic_loss_args={"init_scale": 1024.},
                               verbose=False)
    optimizer.backward(model(torch.ones(2, 3).half()).float().sum())
    optimizer.step()
    loaded = save_and_load(optimizer.state_dict(), tmp_path / "fp16.pt")
    assert loaded["loss_scaler"] == optimizer.loss_scaler.state_dict()

    fresh = FP16_Optimizer(torch.optim.Adam(half_model().parameters(), lr=0.01), verbose=False)
    fresh.load_state_dict(loaded)
    assert fresh.loss_scaler.dynamic and fresh.loss_scale == 1024.
    assert fresh.loss_scaler._unskipped == 1 and not fresh.overflow


@pytest.mark.parametrize("optimizer_class", [FusedAdam, FusedSGD, FusedLAMB, FusedNovoGrad,
                                             FusedAdagrad, FusedMixedPrecisionLamb])
def test_fused_optimizer_checkpoints_load_with_plain_torch_load(tmp_path, optimizer_class):
    model = exact_linear()
    optimizer = optimizer_class(model.parameters(), lr=0.1)
    model(int_batch(1)).sum().backward()
    optimizer.step()
    loaded = save_and_load(optimizer.state_dict(), tmp_path / "fused.pt")
    fresh = optimizer_class(exact_linear().parameters(), lr=0.1)
    fresh.load_state_dict(loaded)
    assert fresh.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]


# --- what old apex saved -----------------------------------------------------------------------

# A stand-in for real apex, written for these tests: classes at apex's module paths, with the
# attribute names apex's objects had when pickled.
STAND_IN_APEX = {
    "apex/__init__.py": "",
    "apex/amp/__init__.py": "",
    "apex/amp/scaler.py": """
        import torch

        class LossScaler:  # 2019 on: what FP16_Optimizer pickled
            def __init__(self, scale):
                self.dynamic = True
                self._loss_scale = scale
                self._max_loss_scale = 2.**24
                self._min_loss_scale = None
                self._scale_seq_len = 2000
                self._unskipped = 4
                self._has_overflow = False
                self._overflow_buf = torch.zeros(1, dtype=torch.int32)
        """,
    "apex/fp16_utils/__init__.py": "",
    "apex/fp16_utils/loss_scaler.py": """
        class LossScaler:  # 2018: a static scale
            def __init__(self, scale):
                self.cur_scale = scale

        class DynamicLossScaler:  # 2018: its own schedule, counted in iterations
            def __init__(self, scale, cur_iter, last_overflow_iter, window):
                self.cur_scale = scale
                self.cur_iter = cur_iter
                self.last_overflow_iter = last_overflow_iter
                self.scale_factor = 2.
                self.scale_window = window
        """,
}

WRITE_OLD_CHECKPOINT = """
    import sys
    import torch
    from apex.amp.scaler import LossScaler
    from apex.fp16_utils.loss_scaler import DynamicLossScaler, LossScaler as StaticLossScaler

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).half()
    masters = [p.detach().clone().float().requires_grad_() for p in model.parameters()]
    inner = torch.optim.SGD(masters, lr=0.1, momentum=0.9)
    scalers = {"amp": LossScaler(1024.),
               "dynamic_2018": DynamicLossScaler(1024., cur_iter=5, last_overflow_iter=2, window=4),
               "static_2018": StaticLossScaler(128.)}
    for kind, scaler in scalers.items():
        torch.save({"loss_scaler": scaler, "dynamic_loss_scale": kind != "static_2018",
                    "overflow": False, "first_closure_call_this_step": True,
                    "optimizer_state_dict": inner.state_dict(), "fp32_from_fp16": [masters]},
                   f"{sys.argv[1]}/{kind}.pt")
"""

TRAIN_ON = """
    import sys
    import torch
    from apex.fp16_utils import FP16_Optimizer

    for path in sys.argv[1:]:
        checkpoint = torch.load(path)  # weights_only=True
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2).half()
        optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   verbose=False)
        optimizer.load_state_dict(checkpoint)
        scales = [optimizer.loss_scale]
        for factor in (1., 1., 1., float("nan"), 1.):
            optimizer.zero_grad()
            optimizer.backward(model(torch.ones(2, 3).half()).float().sum() * factor)
            optimizer.step()
            scales.append(optimizer.loss_scale)
        print("RESULT", scales, bool(torch.isfinite(model.weight.float()).all()))
"""


def run_python(code, *args, pythonpath=(), autoload="1"):
    env = dict(os.environ, AMPSHIM_AUTOLOAD=autoload,
               PYTHONPATH=os.pathsep.join([*map(str, pythonpath), str(ROOT)]))
    completed = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                               env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


@pytest.fixture(scope="module")
def old_checkpoints(tmp_path_factory):
    """Checkpoints written by the stand-in apex alone (ampshim not imported there)."""
    stand_in = tmp_path_factory.mktemp("stand_in_apex")
    for relative, source in STAND_IN_APEX.items():
        (stand_in / relative).parent.mkdir(parents=True, exist_ok=True)
        (stand_in / relative).write_text(textwrap.dedent(source))
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    run_python(WRITE_OLD_CHECKPOINT, checkpoints, pythonpath=[stand_in], autoload="0")
    return checkpoints


@pytest.fixture(scope="module")
def trained_on(old_checkpoints):
    """{kind: (loss scales over 5 steps, weights finite)} after loading in a process with ampshim."""
    kinds = ("amp", "dynamic_2018", "static_2018")
    output = run_python(TRAIN_ON, *(old_checkpoints / f"{kind}.pt" for kind in kinds))
    results = [line.split(" ", 1)[1] for line in output.splitlines() if line.startswith("RESULT")]
    return dict(zip(kinds, results))


@pytest.mark.parametrize("kind, scales, finite", [
    # amp's scaler of 2019 on: kept as it was (dynamic, 4 clean passes counted)
    ("amp", [1024., 1024., 1024., 1024., 512., 512.], True),
    # 2018: window 4 with 2 clean iterations since the overflow at iteration 2; grows after 2
    # more, then halves on the NaN
    ("dynamic_2018", [1024., 1024., 2048., 2048., 1024., 1024.], True),
    # a static scale never skips a step, NaN included (apex's semantics)
    ("static_2018", [128.] * 6, False),
])
def test_apex_fp16_optimizer_checkpoints_load_under_weights_only_and_train_on(
        trained_on, kind, scales, finite):
    assert trained_on[kind] == f"{scales!r} {finite}"


@pytest.mark.slow
def test_without_importing_apex_weights_only_refuses_the_old_classes(old_checkpoints):
    output = run_python(f"""
        import pickle, torch
        try:
            torch.load({str(old_checkpoints / "amp.pt")!r})
        except pickle.UnpicklingError as error:
            print("refused" if "apex.amp.scaler.LossScaler" in str(error) else error)
    """, autoload="0")
    assert output.strip() == "refused"


def test_2018_dynamic_scaler_is_converted_to_amps_schedule():
    old = DynamicLossScaler(init_scale=2.**32, scale_window=1000)
    old.cur_iter, old.last_overflow_iter = 2500, -1
    scaler = loss_scaler_from_checkpoint(old)
    assert type(scaler) is LossScaler and scaler.dynamic
    # amp's ceiling; 2500 clean iterations = two growths and 500 toward the next
    assert (scaler.loss_scale(), scaler._unskipped) == (2.**24, 500)
    assert (scaler._scale_seq_len, scaler._min_loss_scale) == (1000, 1.)  # 2018's floor kept


def test_2018_scaler_with_another_factor_warns_that_amps_factor_is_two():
    old = DynamicLossScaler(init_scale=8., scale_factor=4., scale_window=10)
    with pytest.warns(UserWarning, match="scale_factor=4.0"):
        assert loss_scaler_from_checkpoint(old).loss_scale() == 8.


@pytest.mark.parametrize("saved, error, message", [
    (StaticFp16LossScaler(float("nan")), ValueError, r"loss_scaler.cur_scale must be"),
    ({"dynamic": True, "loss_scale": -1., "unskipped": 0}, ValueError,
     r"loss_scaler.loss_scale must be"),
    ("65536", TypeError, r"loss_scaler is not a saved loss scaler: '65536'"),
])
def test_bad_saved_scalers_are_named_and_nothing_is_loaded(saved, error, message):
    model = half_model()
    optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               dynamic_loss_scale=True, verbose=False)
    checkpoint = optimizer.state_dict()
    checkpoint["loss_scaler"] = saved
    checkpoint["optimizer_state_dict"]["param_groups"][0]["lr"] = 0.5
    with pytest.raises(error, match=message):
        optimizer.load_state_dict(checkpoint)
    assert optimizer.param_groups[0]["lr"] == 0.1 and optimizer.loss_scale == 2.**16
