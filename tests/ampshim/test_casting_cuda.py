"""O1 on CUDA (float16): the fidelity patches where native CUDA autocast differs from apex."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from _amp_testing import fresh_amp_state, quiet  # noqa: F401
from ampshim.handle import init
from ampshim.lists import functional_overrides

pytestmark = [pytest.mark.cuda, quiet]


@pytest.fixture(autouse=True)
def restore_lists():
    fp16, fp32 = list(functional_overrides.FP16_FUNCS), list(functional_overrides.FP32_FUNCS)
    yield
    functional_overrides.FP16_FUNCS[:], functional_overrides.FP32_FUNCS[:] = fp16, fp32


def test_o1_on_cuda_is_float16_autocast_and_leaves_cpu_alone():
    init(device_type="cuda")
    a = torch.randn(8, 8, device="cuda")
    assert (a @ a).dtype == torch.float16
    assert F.softmax(a.half(), dim=-1).dtype == torch.float32
    assert (a.cpu() @ a.cpu()).dtype == torch.float32


def test_bce_on_cuda_float32_works_half_raises():
    init(device_type="cuda")
    probs = torch.sigmoid(torch.randn(8, 8, device="cuda"))
    target = torch.rand(8, 8, device="cuda")
    assert nn.BCELoss()(probs, target).dtype == torch.float32  # native autocast raises here
    with pytest.raises(NotImplementedError, match="BCEWithLogitsLoss"):
        F.binary_cross_entropy(probs.half(), target)


def test_tacotron_softmax_edit_on_cuda():
    functional_overrides.FP32_FUNCS.remove("softmax")
    functional_overrides.FP16_FUNCS.append("softmax")
    init(device_type="cuda")
    assert F.softmax(torch.randn(8, 8, device="cuda"), dim=-1).dtype == torch.float16


def test_inplace_exp_on_half_raises_on_cuda():
    init(device_type="cuda")
    with pytest.raises(NotImplementedError, match="Cannot call in-place method exp_ on fp16"):
        torch.randn(4, device="cuda").half().exp_()
