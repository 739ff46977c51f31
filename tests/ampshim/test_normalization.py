import pytest
import torch

from ampshim.normalization import FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm
from ampshim.normalization import fused_layer_norm as fln


def _randomize(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
    return module


def _assert_same_as_native(ours, native, x_shape):
    """Same output and same gradients (input and parameters) as the native module."""
    native.load_state_dict(ours.state_dict())
    x = torch.randn(x_shape, requires_grad=True)
    x_native = x.detach().clone().requires_grad_()
    y, y_native = ours(x), native(x_native)
    torch.testing.assert_close(y, y_native)
    grad = torch.randn_like(y)
    y.backward(grad)
    y_native.backward(grad)
    torch.testing.assert_close(x.grad, x_native.grad)
    for p, p_native in zip(ours.parameters(), native.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_native.grad)


@pytest.mark.parametrize("shape", [8, (3, 8)])
def test_layer_norm_matches_torch_forward_and_backward(shape):
    torch.manual_seed(0)
    _assert_same_as_native(_randomize(FusedLayerNorm(shape)), torch.nn.LayerNorm(shape), (4, 3, 8))


def test_layer_norm_without_affine_matches_torch():
    x = torch.randn(5, 8, requires_grad=True)
    y = FusedLayerNorm(8, elementwise_affine=False)(x)
    y.sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    torch.nn.functional.layer_norm(x_ref, (8,)).sum().backward()
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x.detach(), (8,)))
    torch.testing.assert_close(x.grad, x_ref.grad)
    assert list(FusedLayerNorm(8, elementwise_affine=False).parameters()) == []


@pytest.mark.parametrize("affine", [True, False])
def test_rms_norm_matches_torch_forward_and_backward(affine):
    torch.manual_seed(0)
    ours = _randomize(FusedRMSNorm((3, 8), elementwise_affine=affine))
    native = torch.nn.RMSNorm((3, 8), eps=1e-5, elementwise_affine=affine)
    _assert_same_as_native(ours, native, (4, 3, 8))


def test_rms_norm_follows_apexs_formula_with_fp32_variance():
    x = torch.randn(4, 16).to(torch.bfloat16)
    w = torch.randn(16).to(torch.bfloat16)
    want = fln.manual_rms_norm(x, (16,), w, 1e-5)
    got = fln.fused_rms_norm_affine(x, w, (16,), 1e-5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)


def test_checkpoints_interchange_with_native_modules():
    assert FusedLayerNorm(8).state_dict().keys() == torch.nn.LayerNorm(8).state_dict().keys()
    assert FusedRMSNorm(8).state_dict().keys() == torch.nn.RMSNorm(8).state_dict().keys()
    native = torch.nn.LayerNorm(8)
    FusedLayerNorm(8).load_state_dict(native.state_dict())
    assert repr(FusedLayerNorm(8)) == "FusedLayerNorm((8,), eps=1e-05, elementwise_affine=True)"


def test_output_dtype_outside_autocast():
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    assert FusedLayerNorm(8)(x).dtype == torch.bfloat16
    assert FusedRMSNorm(8)(x).dtype == torch.bfloat16
    assert MixedFusedLayerNorm(8)(x).dtype == torch.float32
    assert MixedFusedRMSNorm(8)(x).dtype == torch.float32
    half_params = MixedFusedLayerNorm(8).to(torch.float16)
    assert half_params(torch.randn(2, 8)).dtype == torch.float16


def test_mixed_norm_grads_keep_each_tensors_dtype():
    norm = MixedFusedLayerNorm(8)
    x = torch.randn(2, 8, dtype=torch.bfloat16, requires_grad=True)
    norm(x).sum().backward()
    assert x.grad.dtype == torch.bfloat16
    assert norm.weight.grad.dtype == torch.float32


def test_under_autocast_output_is_the_autocast_dtype():
    x = torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.nn.LayerNorm(8)(x).dtype == torch.float32  # the native difference
        assert FusedLayerNorm(8)(x).dtype == torch.bfloat16
        assert FusedRMSNorm(8)(x).dtype == torch.bfloat16
        # apex casts the parameters too, so the "weight dtype" is then the autocast dtype
        assert MixedFusedLayerNorm(8)(x).dtype == torch.bfloat16
        y = fln.fused_layer_norm(x, (8,))
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), torch.nn.functional.layer_norm(x, (8,), eps=1e-6),
                               atol=2e-2, rtol=2e-2)


def test_autograd_functions_have_apexs_argument_order():
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, w, b: fln.FusedLayerNormAffineFunction.apply(x, w, b, (8,), 1e-5, False), (x, w, b))
    assert torch.autograd.gradcheck(
        lambda x, w: fln.FusedRMSNormAffineFunction.apply(x, w, (8,), 1e-5), (x, w))
    assert torch.autograd.gradcheck(lambda x: fln.FusedRMSNormFunction.apply(x, (8,), 1e-5), (x,))


def test_functional_eps_defaults_to_1e_6():
    x = torch.randn(2, 8) * 1e-3
    torch.testing.assert_close(fln.fused_layer_norm(x, 8), torch.nn.functional.layer_norm(x, (8,), eps=1e-6))


def test_mixed_norms_are_always_affine():
    with pytest.warns(UserWarning, match="elementwise_affine"):
        MixedFusedLayerNorm(8, elementwise_affine=True)
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="elementwise_affine = False"):
        MixedFusedRMSNorm(8, elementwise_affine=False)


def test_apex_import_paths():
    from apex.normalization import FusedLayerNorm as ApexFusedLayerNorm
    from apex.normalization.fused_layer_norm import FusedLayerNormAffineFunction

    assert ApexFusedLayerNorm is FusedLayerNorm
    assert FusedLayerNormAffineFunction is fln.FusedLayerNormAffineFunction


@pytest.mark.cuda
def test_cuda_autocast_gives_float16_like_apex():
    x = torch.randn(2, 8, device="cuda")
    with torch.autocast("cuda"):
        assert FusedLayerNorm(8).cuda()(x).dtype == torch.float16
        assert FusedRMSNorm(8).cuda()(x).dtype == torch.float16
    assert MixedFusedLayerNorm(8).cuda()(x.half()).dtype == torch.float32
