import sys
import warnings

import pytest
import torch

import ampshim.device as device
from _amp_testing import fresh_amp_state  # noqa: F401  (autouse: a clean amp state per test)


def test_device_follows_the_first_floating_parameter():
    model = torch.nn.Sequential(torch.nn.Embedding(3, 2), torch.nn.Linear(2, 2))
    assert device.device_type_of(model) == "cpu"
    assert device.device_type_of([model]) == "cpu"


def test_cpu_half_is_bfloat16_with_one_warning_per_process(monkeypatch):
    monkeypatch.delenv(device.DTYPE_ENV_VAR, raising=False)
    monkeypatch.setattr(device, "_warned_cpu", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert device.half_dtype("cpu") is torch.bfloat16
        assert device.half_dtype("cpu") is torch.bfloat16
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "bfloat16" in messages[0]
    assert caught[0].filename == __file__  # the user's line, not ampshim's


def test_the_bfloat16_warning_points_at_the_users_initialize(monkeypatch):
    from apex import amp

    monkeypatch.delenv(device.DTYPE_ENV_VAR, raising=False)
    monkeypatch.setattr(device, "_warned_cpu", False)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
    [found] = [w for w in caught if "bfloat16" in str(w.message)]
    assert (found.filename, found.lineno) == (__file__, line)


def test_cuda_half_is_float16_unless_asked_for_bfloat16(monkeypatch):
    monkeypatch.delenv(device.DTYPE_ENV_VAR, raising=False)
    assert device.half_dtype("cuda") is torch.float16
    monkeypatch.setenv(device.DTYPE_ENV_VAR, "bfloat16")
    assert device.half_dtype("cuda") is torch.bfloat16
    monkeypatch.setenv(device.DTYPE_ENV_VAR, "int8")
    with pytest.raises(ValueError, match="AMPSHIM_DTYPE='int8'"):
        device.half_dtype("cuda")


@pytest.mark.parametrize("device_type", ["cpu", "cuda"], ids=["cpu", "gpu"])  # no CUDA needed
def test_the_dtype_variable_is_checked_and_obeyed_on_every_device(monkeypatch, device_type):
    monkeypatch.setattr(device, "_warned_cpu", False)
    monkeypatch.setenv(device.DTYPE_ENV_VAR, "float16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked for: no warning about a replacement
        assert device.half_dtype(device_type) is torch.float16
    monkeypatch.setenv(device.DTYPE_ENV_VAR, "bf16")
    assert device.half_dtype(device_type) is torch.bfloat16
    monkeypatch.setenv(device.DTYPE_ENV_VAR, "fp8")
    with pytest.raises(ValueError, match="AMPSHIM_DTYPE='fp8' .* bf16, bfloat16, float16, fp16, half"):
        device.half_dtype(device_type)


@pytest.mark.filterwarnings("ignore:ampshim. the model")
def test_resolve_dtype_maps_only_float16(monkeypatch):
    monkeypatch.delenv(device.DTYPE_ENV_VAR, raising=False)
    assert device.resolve_dtype(torch.float16, "cpu") is torch.bfloat16
    assert device.resolve_dtype(torch.float32, "cpu") is torch.float32
    assert device.resolve_dtype(None, "cpu") is None
