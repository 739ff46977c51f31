import io
import pickle
import warnings

import pytest
import torch

from ampshim.deprecation import DeprecatedFeatureWarning, deprecated_warning
from ampshim.fp16_utils import (
    BN_convert_float,
    DynamicLossScaler,
    FP16_Optimizer,
    FP16Model,
    LossScaler,
    convert_network,
    master_params_to_model_params,
    model_grads_to_master_grads,
    network_to_half,
    prep_param_lists,
    to_python_float,
)
from ampshim.scaler import LossScaler as AmpLossScaler

pytestmark = pytest.mark.filterwarnings("ignore::ampshim.deprecation.DeprecatedFeatureWarning")


def _net():
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                               torch.nn.BatchNorm1d(4, affine=False), torch.nn.Linear(4, 2))


# --- deprecation -------------------------------------------------------------------------------


def test_deprecated_warning_is_a_future_warning_when_not_distributed():
    assert issubclass(DeprecatedFeatureWarning, FutureWarning)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deprecated_warning("apex.thing is deprecated; use torch.amp")
    assert [w.category for w in caught] == [DeprecatedFeatureWarning]
    assert "use torch.amp" in str(caught[0].message)


# --- model conversion -------------------------------------------------------------------------


def test_network_to_half_keeps_affine_batchnorm_fp32():
    model = network_to_half(_net())
    assert isinstance(model[0], torch.nn.Module) and model[1][0].weight.dtype == torch.float16
    assert model[1][1].weight.dtype == torch.float32 and model[1][1].running_mean.dtype == torch.float32
    assert model[1][2].running_mean.dtype == torch.float16  # non-affine BN is converted (as .half() did)
    assert next(iter(model.state_dict())).startswith("1.")
    model.eval()
    assert model(torch.randn(3, 4)).dtype == torch.float16


def test_convert_network_and_fp16_model():
    net = _net()
    net[0].weight.grad = torch.ones(4, 4)
    convert_network(net, torch.float16)
    assert net[0].weight.dtype == torch.float16 and net[0].weight.grad.dtype == torch.float16
    assert net[1].weight.dtype == torch.float32  # affine BN kept
    assert net[2].running_var.dtype == torch.float16  # non-affine BN converted
    with pytest.warns(DeprecatedFeatureWarning, match="fp16_utils"):
        model = FP16Model(_net())
    assert model.network[1].num_batches_tracked.dtype == torch.int64
    model.eval()
    assert model(torch.randn(2, 4)).dtype == torch.float16
    assert next(iter(model.state_dict())).startswith("network.")


def test_bn_convert_float_only_touches_affine_batchnorm():
    net = _net().half()
    BN_convert_float(net)
    assert [m.weight.dtype for m in (net[0], net[1], net[3])] == [torch.float16, torch.float32, torch.float16]
    assert net[2].running_mean.dtype == torch.float16


# --- master params --------------------------------------------------------------------------------


@pytest.mark.parametrize("flat_master", [False, True])
def test_master_param_round_trip(flat_master):
    model = torch.nn.Linear(3, 2).half()
    model_params, master_params = prep_param_lists(model, flat_master=flat_master)
    assert all(m.dtype == torch.float32 and m.requires_grad for m in master_params)
    if flat_master:
        assert len(master_params) == 1 and master_params[0].numel() == 8
        assert master_params[0].grad is not None
    model(torch.randn(4, 3).half()).sum().backward()
    model_grads_to_master_grads(model_params, master_params, flat_master=flat_master)
    grads = torch.cat([p.grad.float().flatten() for p in model_params])
    torch.testing.assert_close(torch.cat([m.grad.flatten() for m in master_params]), grads)
    with torch.no_grad():
        for m in master_params:
            m.add_(1.0)
    master_params_to_model_params(model_params, master_params, flat_master=flat_master)
    torch.testing.assert_close(torch.cat([p.float().flatten() for p in model_params]),
                               torch.cat([m.detach().flatten() for m in master_params]).half().float())


def test_model_without_grad_clears_the_master_grad():
    model_params = [torch.nn.Parameter(torch.ones(2).half())]
    masters = [torch.ones(2, requires_grad=True)]
    masters[0].grad = torch.ones(2)
    model_grads_to_master_grads(model_params, masters)
    assert masters[0].grad is None


def test_to_python_float():
    assert to_python_float(torch.tensor(2.5)) == 2.5
    assert to_python_float([3.0]) == 3.0


# --- fp16_utils loss scalers (their own constants) ---------------------------------------------


def test_static_loss_scaler_scales_backward():
    p = torch.nn.Parameter(torch.ones(1))
    scaler = LossScaler(8.0)
    scaler.backward((p * 2).sum())
    assert p.grad.item() == 16.0
    assert scaler.loss_scale == 8.0 and scaler.has_overflow([p]) is False


def test_dynamic_loss_scaler_schedule():
    scaler = DynamicLossScaler(scale_window=3)
    assert scaler.loss_scale == 2 ** 32
    p = torch.nn.Parameter(torch.ones(1))
    p.grad = torch.tensor([float("inf")])
    assert scaler.has_overflow([p])
    scaler.update_scale(True)
    assert scaler.loss_scale == 2 ** 31
    scaler.update_scale(False)  # iteration 1: 1 - 0 = 1, not a multiple of 3
    scaler.update_scale(False)
    assert scaler.loss_scale == 2 ** 31
    scaler.update_scale(False)  # iteration 3: 3 since the overflow
    assert scaler.loss_scale == 2 ** 32
    tiny = DynamicLossScaler(init_scale=1.0)
    tiny.update_scale(True)
    assert tiny.loss_scale == 1  # never below 1


def test_dynamic_loss_scaler_first_growth_comes_at_iteration_window_minus_one():
    scaler = DynamicLossScaler(init_scale=1.0, scale_window=4)
    for _ in range(3):
        scaler.update_scale(False)
    assert scaler.loss_scale == 1.0
    scaler.update_scale(False)  # (3 - (-1)) % 4 == 0
    assert scaler.loss_scale == 2.0


# --- FP16_Optimizer ---------------------------------------------------------------------------


def _half_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
    return BN_convert_float(model.half())


def test_fp16_optimizer_replaces_half_params_by_fp32_masters(capsys):
    model = _half_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(DeprecatedFeatureWarning, match="FP16_Optimizer is deprecated"):
        optimizer = FP16_Optimizer(inner, static_loss_scale=128.0)
    assert "deprecated" not in capsys.readouterr().out  # the warning is the only notice
    assert all(p.dtype == torch.float32 for p in inner.param_groups[0]["params"])
    assert len(optimizer.fp16_groups[0]) == 4 and len(optimizer.fp32_from_fp32_groups[0]) == 2
    assert optimizer.param_groups is inner.param_groups and optimizer.loss_scale == 128.0


def test_fp16_optimizer_step_matches_fp32_sgd_on_the_masters():
    model = _half_model()
    optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), static_loss_scale=128.0,
                               verbose=False)
    masters_before = [m.detach().clone() for m in optimizer.all_fp32_from_fp16_params]
    x = torch.randn(8, 3).half()
    optimizer.zero_grad()
    optimizer.backward(model(x).float().pow(2).mean())
    fp16_grads = [p.grad.float() / 128.0 for p in optimizer.all_fp16_params]
    for master, grad in zip(optimizer.all_fp32_from_fp16_params, fp16_grads):
        torch.testing.assert_close(master.grad, grad)
    optimizer.step()
    for master, before, grad, param in zip(optimizer.all_fp32_from_fp16_params, masters_before,
                                           fp16_grads, optimizer.all_fp16_params):
        torch.testing.assert_close(master.detach(), before - 0.1 * grad)
        assert torch.equal(param.detach(), master.detach().half())  # copied back into the model


def test_fp16_optimizer_skips_the_step_on_overflow_with_a_dynamic_scale(capsys):
    model = _half_model()
    optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True,
                               verbose=False)
    assert optimizer.loss_scale == 2.0 ** 16  # amp's scaler, not fp16_utils' 2**32
    before = [p.detach().clone() for p in optimizer.all_fp16_params]
    optimizer.zero_grad()
    optimizer.backward(model(torch.full((2, 3), 1e4).half()).float().sum() * 1e4)
    assert optimizer.overflow
    optimizer.step()
    assert "Gradient overflow.  Skipping step, reducing loss scale to 32768.0" in capsys.readouterr().out
    assert all(torch.equal(p.detach(), b) for p, b in zip(optimizer.all_fp16_params, before))
    assert optimizer.clip_master_grads(1.0) == -1
    assert optimizer.inspect_master_grad_data() is None


def test_fp16_optimizer_loads_an_earlier_ampshim_state_dict_with_a_pickled_scaler():
    model = _half_model()
    old_scaler = AmpLossScaler("dynamic", init_scale=512.0)
    old_scaler._unskipped = 9
    optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), verbose=False)
    saved = dict(optimizer.state_dict(), loss_scaler=old_scaler, dynamic_loss_scale=True)
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    fresh = FP16_Optimizer(torch.optim.SGD(_half_model().parameters(), lr=0.1), verbose=False)
    fresh.load_state_dict(torch.load(buffer))  # ampshim.scaler.LossScaler is a safe global
    assert (fresh.loss_scale, fresh.loss_scaler._unskipped) == (512.0, 9)


def test_fp16_optimizer_state_dict_round_trip_through_torch_save():
    model = _half_model()
    optimizer = FP16_Optimizer(torch.optim.Adam(model.parameters(), lr=0.01), dynamic_loss_scale=True,
                               dynamic_loss_args={"init_scale": 1024.0}, verbose=False)
    optimizer.backward(model(torch.randn(4, 3).half()).float().sum())
    optimizer.step()
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    assert saved["loss_scaler"]["loss_scale"] == 1024.0 and saved["loss_scaler"]["dynamic"]
    assert set(saved) == {"loss_scaler", "dynamic_loss_scale", "overflow", "first_closure_call_this_step",
                          "optimizer_state_dict", "fp32_from_fp16"}

    fresh_model = _half_model()
    fresh = FP16_Optimizer(torch.optim.Adam(fresh_model.parameters(), lr=0.01), verbose=False)
    fresh.load_state_dict(saved)
    assert fresh.dynamic_loss_scale and fresh.loss_scale == 1024.0
    for current, saved_master in zip(fresh.all_fp32_from_fp16_params, optimizer.all_fp32_from_fp16_params):
        assert torch.equal(current.detach(), saved_master.detach())
    with pytest.raises(RuntimeError, match="state_dict"):
        pickle.dumps(fresh)


def test_fp16_optimizer_closure_reruns_while_overflowing():
    model = _half_model()
    optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True,
                               verbose=False)
    calls = []

    def closure():
        optimizer.zero_grad()
        factor = 1e9 if not calls else 1.0  # the first evaluation overflows
        calls.append(factor)
        loss = model(torch.full((2, 3), 0.01).half()).float().mean() * factor
        optimizer.backward(loss)
        return loss

    optimizer.step(closure)
    assert len(calls) == 2 and not optimizer.overflow
    assert optimizer.loss_scale == 2.0 ** 15


def test_fp16_optimizer_rejects_other_dtypes():
    with pytest.raises(TypeError, match="Wrapped parameters must be"):
        FP16_Optimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1, dtype=torch.float64))], lr=0.1),
                       verbose=False)


def test_old_class_paths_unpickle():
    # Protocol 2 spells classes as "module\nname\n": swap ampshim's module path for apex's.
    for obj, ours, apex in [
        (DynamicLossScaler(), b"ampshim.fp16_utils.loss_scaler", b"apex.fp16_utils.loss_scaler"),
        (AmpLossScaler("dynamic"), b"ampshim.scaler", b"apex.amp.scaler"),
    ]:
        data = pickle.dumps(obj, protocol=2)
        assert ours in data
        restored = pickle.loads(data.replace(ours, apex))
        assert type(restored) is type(obj)


def test_star_import_gives_apexs_names():
    namespace = {}
    exec("from apex.fp16_utils import *", namespace)
    for name in ["BN_convert_float", "network_to_half", "prep_param_lists", "model_grads_to_master_grads",
                 "master_params_to_model_params", "tofp16", "to_python_float", "clip_grad_norm",
                 "convert_module", "convert_network", "FP16Model", "FP16_Optimizer", "LossScaler",
                 "DynamicLossScaler"]:
        assert name in namespace
    assert namespace["LossScaler"] is LossScaler  # fp16_utils' own static scaler, not amp's
