"""Deprecation warnings: one line at the user's own line, naming the native replacement and ampmigrate."""
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from _amp_testing import fresh_amp_state  # noqa: F401
from ampshim import amp
from ampshim.deprecation import DeprecatedFeatureWarning
from ampshim.fp16_utils import FP16_Optimizer, FP16Model
from ampshim.parallel import DistributedDataParallel, SyncBatchNorm, convert_syncbn_model

ROOT = Path(__file__).resolve().parents[2]
THIS_FILE = os.path.relpath(__file__)


def ddp_without_process_group():
    with pytest.raises((RuntimeError, ValueError)):
        DistributedDataParallel(torch.nn.Linear(2, 2))


# (the call, the apex name, the native replacement, whether ampmigrate rewrites it)
CALLS = [
    (lambda: amp.initialize(torch.nn.Linear(2, 2), enabled=False),
     "apex.amp.initialize", "torch.autocast and torch.amp.GradScaler", True),
    (lambda: amp.half_function(len), "apex.amp.half_function",
     "@torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float16)", True),
    (lambda: amp.float_function(len), "apex.amp.float_function",
     "@torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)", True),
    (lambda: amp.promote_function(len), "apex.amp.promote_function",
     "torch.autocast, which promotes mixed-precision inputs itself", False),
    (lambda: FP16_Optimizer(torch.optim.SGD(torch.nn.Linear(2, 2).half().parameters(), lr=0.1),
                            verbose=False),
     "apex.fp16_utils.FP16_Optimizer", "torch.autocast and torch.amp.GradScaler", False),
    (lambda: FP16Model(torch.nn.Linear(2, 2)), "apex.fp16_utils.FP16Model",
     "torch.autocast (or model.half())", False),
    (lambda: SyncBatchNorm(4), "apex.parallel.SyncBatchNorm", "torch.nn.SyncBatchNorm", True),
    (ddp_without_process_group, "apex.parallel.DistributedDataParallel",
     "torch.nn.parallel.DistributedDataParallel", True),
]


@pytest.mark.parametrize("call, feature, replacement, rewritten", CALLS,
                         ids=[feature for _, feature, _, _ in CALLS])
def test_one_line_at_the_callers_line_naming_the_replacement_and_ampmigrate(
        call, feature, replacement, rewritten):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    [warning] = [w for w in caught if issubclass(w.category, DeprecatedFeatureWarning)]
    # the user's line, not ampshim's
    expected_line = (call.__code__.co_firstlineno if call.__name__ == "<lambda>"
                     else call.__code__.co_firstlineno + 2)
    assert (warning.filename, warning.lineno) == (__file__, expected_line)
    command = (f"`ampmigrate {THIS_FILE}` rewrites it (--diff to preview)" if rewritten
               else f"`ampmigrate --check {THIS_FILE}` lists the manual steps")
    assert str(warning.message) == f"{feature} is deprecated: use {replacement}; {command}"


def test_convert_syncbn_model_warns_at_the_callers_line_once_per_feature():
    model = torch.nn.Sequential(*[torch.nn.BatchNorm1d(4) for _ in range(5)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's default: once per call site
        line = sys._getframe().f_lineno + 1
        convert_syncbn_model(model)
    messages = [str(w.message).split(" is deprecated")[0] for w in caught]
    assert messages == ["apex.parallel.convert_syncbn_model", "apex.parallel.SyncBatchNorm"]
    assert {(w.filename, w.lineno) for w in caught} == {(__file__, line)}


def test_a_training_loop_warns_once_not_every_step(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from apex import amp
        from apex.fp16_utils import FP16_Optimizer

        for epoch in range(3):
            model = torch.nn.Linear(2, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
            for step in range(5):
                with amp.scale_loss(model(torch.ones(1, 2)).float().sum(), optimizer) as loss:
                    loss.backward()
                optimizer.step()
            fp16 = FP16_Optimizer(torch.optim.SGD(model.half().parameters(), lr=0.1),
                                  verbose=False)
    """))
    completed = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                               text=True, timeout=120,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert completed.returncode == 0, completed.stderr
    notices = [line for line in completed.stderr.splitlines() if "is deprecated" in line]
    assert notices == [
        f"{script}:9: DeprecatedFeatureWarning: apex.amp.initialize is deprecated: use "
        "torch.autocast and torch.amp.GradScaler; `ampmigrate train.py` rewrites it (--diff to "
        "preview)",
        f"{script}:14: DeprecatedFeatureWarning: apex.fp16_utils.FP16_Optimizer is deprecated: "
        "use torch.autocast and torch.amp.GradScaler; `ampmigrate --check train.py` lists the "
        "manual steps"]


def test_no_text_from_apex_that_is_no_longer_true():
    sources = "".join(path.read_text() for path in (ROOT / "ampshim").rglob("*.py"))
    for stale in ("February 2023", "will be removed by", "deprecated and dangerous",
                  "nvidia.github.io/apex"):
        assert stale not in sources
