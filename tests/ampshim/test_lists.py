"""The O1 cast lists (apex's names and contents) and the native-policy table they are compared with."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from ampshim.lists import functional_overrides, tensor_overrides, torch_overrides
from ampshim.lists._native import native_policy


def test_list_modules_have_apex_names_as_plain_lists():
    assert functional_overrides.MODULE is F
    assert torch_overrides.MODULE is torch
    assert tensor_overrides.MODULE is torch.Tensor
    for module, names in (
        (functional_overrides, ("FP16_FUNCS", "FP32_FUNCS", "BANNED_FUNCS")),
        (torch_overrides, ("FP16_FUNCS", "FP32_FUNCS", "CASTS", "SEQUENCE_CASTS")),
        (tensor_overrides, ("FP16_FUNCS", "FP32_FUNCS", "CASTS", "SEQUENCE_CASTS")),
    ):
        for name in names:
            assert type(getattr(module, name)) is list, (module.__name__, name)


def test_tacotron_edit_works_at_import_time():
    # The exact lines NVIDIA's Tacotron2 train.py runs right after `from apex import amp`.
    fp32, fp16 = functional_overrides.FP32_FUNCS, functional_overrides.FP16_FUNCS
    try:
        fp32.remove("softmax")
        fp16.append("softmax")
        assert "softmax" in fp16 and "softmax" not in fp32
    finally:
        fp16.remove("softmax")
        fp32.insert(fp32.index("log_softmax") + 1, "softmax")
    assert list(fp32) == list(functional_overrides._DEFAULTS["FP32_FUNCS"])


def test_contents_follow_apex():
    assert functional_overrides.FP16_FUNCS == [
        "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
        "conv_tbc", "linear"]
    assert {"softmax", "log_softmax", "gelu", "layer_norm", "cross_entropy", "ctc_loss",
            "interpolate"} <= set(functional_overrides.FP32_FUNCS)
    assert len(functional_overrides.FP32_FUNCS) == 29
    (name, message), = functional_overrides.BANNED_FUNCS
    assert name == "binary_cross_entropy"
    assert "BCEWithLogitsLoss" in message and "allow_banned=True" in message
    assert torch_overrides.FP16_FUNCS[-3:] == ["addbmm", "baddbmm", "bmm"]
    assert "mean" not in torch_overrides.FP32_FUNCS
    assert torch_overrides.SEQUENCE_CASTS == ["cat", "stack"]
    assert {"add", "mul", "div", "eq", "equal", "addcmul", "dot"} <= set(torch_overrides.CASTS)


def test_tensor_lists_copy_the_torch_names_that_are_tensor_methods():
    assert tensor_overrides.FP16_FUNCS[0] == "__matmul__"
    assert {"mm", "matmul", "bmm"} <= set(tensor_overrides.FP16_FUNCS)
    assert tensor_overrides.FP32_FUNCS[:4] == ["__ipow__", "__pow__", "__rpow__", "cpu"]
    assert {"exp", "log", "sum", "pow"} <= set(tensor_overrides.FP32_FUNCS)
    assert "__iadd__" in tensor_overrides.CASTS and "add" in tensor_overrides.CASTS
    # conv1d and bilinear are not Tensor methods, so they are not copied.
    assert "conv1d" not in tensor_overrides.FP16_FUNCS
    assert "bilinear" not in tensor_overrides.CASTS
    # A copy: the lists are separate objects.
    assert tensor_overrides.FP32_FUNCS is not torch_overrides.FP32_FUNCS


def _x(dtype):
    return torch.rand(4, 4, dtype=dtype) + 0.5


_TARGET = torch.tensor([0, 1, 2, 3])

# One call per name, parameterised by the floating input dtype.
_PROBES = {
    "softmax": lambda d: F.softmax(_x(d), -1),
    "log_softmax": lambda d: F.log_softmax(_x(d), -1),
    "gelu": lambda d: F.gelu(_x(d)),
    "layer_norm": lambda d: F.layer_norm(_x(d), (4,)),
    "exp": lambda d: torch.exp(_x(d)),
    "sum": lambda d: torch.sum(_x(d)),
    "cumsum": lambda d: torch.cumsum(_x(d), 0),
    "mv": lambda d: torch.mv(_x(d), _x(d)[0]),
    "linear": lambda d: F.linear(_x(d), _x(d)),
    "conv1d": lambda d: F.conv1d(_x(d)[None], _x(d)[:, :, None]),
    "mm": lambda d: torch.mm(_x(d), _x(d)),
    "addmm": lambda d: torch.addmm(_x(d), _x(d), _x(d)),
    "matmul": lambda d: torch.matmul(_x(d), _x(d)),
    "bmm": lambda d: torch.bmm(_x(d)[None], _x(d)[None]),
    "einsum": lambda d: torch.einsum("ij,jk->ik", _x(d), _x(d)),
    "prelu": lambda d: F.prelu(_x(d), torch.ones(1, dtype=d)),
    "mse_loss": lambda d: F.mse_loss(_x(d), _x(d)),
    "l1_loss": lambda d: F.l1_loss(_x(d), _x(d)),
    "nll_loss": lambda d: F.nll_loss(_x(d), _TARGET),
    "cross_entropy": lambda d: F.cross_entropy(_x(d), _TARGET),
    "binary_cross_entropy": lambda d: F.binary_cross_entropy(_x(d) - 0.5, _x(d) - 0.5),
    "binary_cross_entropy_with_logits": lambda d: F.binary_cross_entropy_with_logits(_x(d), _x(d)),
    "prod": lambda d: torch.prod(_x(d)),
    "cdist": lambda d: torch.cdist(_x(d), _x(d)),
}


def _observed_cpu_policy(probe):
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        if probe(torch.float32).dtype == torch.bfloat16:
            return "half"
        if probe(torch.bfloat16).dtype == torch.float32:
            return "float"
    return None


@pytest.mark.parametrize("name", sorted(_PROBES))
def test_cpu_native_table_matches_torch(name):
    # A wrong entry would make a user's list edit silently ignored; check the data against torch.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert native_policy("cpu", name) == _observed_cpu_policy(_PROBES[name])


def test_native_table_keeps_cuda_and_cpu_apart():
    assert native_policy("cuda", "softmax") == "float"
    assert native_policy("cpu", "softmax") is None
    assert native_policy("cuda", "binary_cross_entropy") == "banned"
    assert native_policy("cuda", "__add__") == "promote"
    assert native_policy("xpu", "mm") is None  # unknown device: assume nothing
