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


class _Inputs:
    """Fresh inputs of one floating dtype on one device, for the probes below."""

    def __init__(self, dtype, device):
        self.dtype, self.device = dtype, device

    def x(self):
        return torch.rand(4, 4, dtype=self.dtype, device=self.device) + 0.5

    def target(self):
        return torch.tensor([0, 1, 2, 3], device=self.device)


# One call per name.
_PROBES = {
    "softmax": lambda i: F.softmax(i.x(), -1),
    "log_softmax": lambda i: F.log_softmax(i.x(), -1),
    "gelu": lambda i: F.gelu(i.x()),
    "layer_norm": lambda i: F.layer_norm(i.x(), (4,)),
    "exp": lambda i: torch.exp(i.x()),
    "sum": lambda i: torch.sum(i.x()),
    "cumsum": lambda i: torch.cumsum(i.x(), 0),
    "mv": lambda i: torch.mv(i.x(), i.x()[0]),
    "linear": lambda i: F.linear(i.x(), i.x()),
    "conv1d": lambda i: F.conv1d(i.x()[None], i.x()[:, :, None]),
    "mm": lambda i: torch.mm(i.x(), i.x()),
    "addmm": lambda i: torch.addmm(i.x(), i.x(), i.x()),
    "matmul": lambda i: torch.matmul(i.x(), i.x()),
    "bmm": lambda i: torch.bmm(i.x()[None], i.x()[None]),
    "einsum": lambda i: torch.einsum("ij,jk->ik", i.x(), i.x()),
    "prelu": lambda i: F.prelu(i.x(), torch.ones(1, dtype=i.dtype, device=i.device)),
    "mse_loss": lambda i: F.mse_loss(i.x(), i.x()),
    "l1_loss": lambda i: F.l1_loss(i.x(), i.x()),
    "nll_loss": lambda i: F.nll_loss(i.x(), i.target()),
    "cross_entropy": lambda i: F.cross_entropy(i.x(), i.target()),
    "binary_cross_entropy": lambda i: F.binary_cross_entropy(i.x() - 0.5, i.x() - 0.5),
    "binary_cross_entropy_with_logits": lambda i: F.binary_cross_entropy_with_logits(i.x(), i.x()),
    "prod": lambda i: torch.prod(i.x()),
    "cdist": lambda i: torch.cdist(i.x(), i.x()),
}


def _observed_policy(probe, device_type, low):
    with warnings.catch_warnings(), torch.autocast(device_type, dtype=low, cache_enabled=False):
        warnings.simplefilter("ignore")
        try:
            if probe(_Inputs(torch.float32, device_type)).dtype == low:
                return "half"
            if probe(_Inputs(low, device_type)).dtype == torch.float32:
                return "float"
        except RuntimeError:  # CUDA autocast refuses binary_cross_entropy outright
            return "banned"
    return None


@pytest.mark.parametrize("name", sorted(_PROBES))
def test_cpu_native_table_matches_torch(name):
    # A wrong entry would make a user's list edit silently ignored; check the data against torch.
    assert native_policy("cpu", name) == _observed_policy(_PROBES[name], "cpu", torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(_PROBES))
def test_cuda_native_table_matches_torch(name):
    assert native_policy("cuda", name) == _observed_policy(_PROBES[name], "cuda", torch.float16)


def test_native_table_keeps_cuda_and_cpu_apart():
    assert native_policy("cuda", "softmax") == "float"
    assert native_policy("cpu", "softmax") is None
    assert native_policy("cuda", "binary_cross_entropy") == "banned"
    assert native_policy("cuda", "__add__") == "promote"
    assert native_policy("xpu", "mm") is None  # unknown device: assume nothing
