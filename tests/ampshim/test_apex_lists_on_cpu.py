"""O1 off CUDA follows apex's cast lists and RNN casts, not the device's native autocast lists.

apex's own run_amp tests check these (softmax, group_norm, pow, sum and ``.cpu()`` in float32;
RNNs and their cells in half precision); CPU autocast alone leaves them in bfloat16 or fails
(``nn.LSTM`` on float32 inputs). ``AMPSHIM_CASTS=native`` gives the native policy back.
"""
import itertools
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from _amp_testing import fresh_amp_state, quiet  # noqa: F401
from ampshim import casting
from ampshim.compare import runner
from ampshim.handle import init
from ampshim.lists import functional_overrides, tensor_overrides, torch_overrides
from ampshim.lists._native import native_policy

pytestmark = quiet
LOW = torch.bfloat16
_LIST_MODULES = (functional_overrides, torch_overrides, tensor_overrides)
_POLICY_DTYPES = {"float": {torch.float32}, "half": {LOW}}


@pytest.fixture(autouse=True)
def default_casts(monkeypatch):
    monkeypatch.delenv(casting.CASTS_ENV_VAR, raising=False)


def o1(**kwargs):
    return init(device_type="cpu", **kwargs)


def _unary_default_entries():
    """(module, name, policy) for each default half/float entry callable as ``f(x)``."""
    for module in _LIST_MODULES:
        for list_name, policy in (("FP16_FUNCS", "half"), ("FP32_FUNCS", "float")):
            for name in module._DEFAULTS[list_name]:
                if not casting._is_inplace(name):
                    yield module, name, policy


def _outcome(module, name, dtype):
    """The output dtype of ``name`` applied to a (4, 4) tensor of ``dtype``; None if f(x) fails."""
    x = torch.rand(4, 4, dtype=dtype) + 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = getattr(module.MODULE, name)(x)  # Tensor methods unbound
        except (TypeError, RuntimeError, ValueError):
            return None
    return result.dtype if isinstance(result, torch.Tensor) else None


_ENTRIES = list(_unary_default_entries())


def test_every_default_entry_callable_with_one_tensor_runs_in_apexs_precision():
    # Generated from the lists themselves: each entry f(x) is called with a float32 and a
    # bfloat16 input; the output dtype must be the list's, as apex's wrappers made it.
    handle = o1()
    checked, wrong = [], []
    for module, name, policy in _ENTRIES:
        outcomes = [_outcome(module, name, dtype) for dtype in (torch.float32, LOW)]
        if None in outcomes:
            continue  # needs more than one tensor argument
        checked.append(name)
        if not set(outcomes) <= _POLICY_DTYPES[policy]:
            wrong.append((module.MODULE.__name__, name, policy, outcomes))
    handle._deactivate()
    assert not wrong
    # The lists' one-tensor functions: exp, log, sum, softmax, gelu, cpu, ... on three owners.
    assert len(checked) >= 40
    assert {"softmax", "log_softmax", "gelu", "sum", "exp", "norm", "prod", "cpu"} <= set(checked)


@pytest.mark.parametrize("make, expected", [
    (lambda: nn.Softmax(dim=1), torch.float32),
    (lambda: nn.GroupNorm(num_groups=2, num_channels=4), torch.float32),
    (lambda: nn.LayerNorm(4), torch.float32),
    (lambda: nn.GELU(), torch.float32),
    (lambda: nn.Linear(4, 4), LOW),
    (lambda: nn.ReLU(), None),  # in neither list: the input's dtype
])
@pytest.mark.parametrize("dtype", [torch.float32, LOW])
def test_modules_follow_the_functions_they_call(make, expected, dtype):
    module = make().to(dtype)
    handle = o1()
    x = torch.randn(2, 4, 3, 3, dtype=dtype) if isinstance(module, nn.GroupNorm) else \
        torch.randn(2, 4, dtype=dtype)
    y = module(x.requires_grad_())
    assert y.dtype == (expected or dtype)
    y.float().sum().backward()
    assert x.grad.dtype == dtype
    handle._deactivate()


@pytest.mark.parametrize("spelling", [
    lambda x: x.pow(2.0), lambda x: x ** 2.0, lambda x: torch.pow(x, 2.0), lambda x: 2.0 ** x,
    lambda x: x.sum(), lambda x: torch.sum(x, dim=0), lambda x: x.cpu(), lambda x: F.softmax(x, 1),
])
@pytest.mark.parametrize("dtype", [torch.float32, LOW])
def test_float_list_spellings(spelling, dtype):
    handle = o1()
    assert spelling(torch.rand(4, 4, dtype=dtype) + 0.5).dtype == torch.float32
    handle._deactivate()


@pytest.mark.parametrize("call", [
    lambda a, b: torch.addcmul(a, a, b),
    lambda a, b: torch.atan2(a, b),
    lambda a, b: torch.cat([a, b]),
    lambda a, b: a + b,
])
def test_promote_lists_take_the_widest_type(call):
    handle = o1()
    assert call(torch.rand(3, dtype=LOW), torch.rand(3)).dtype == torch.float32
    assert call(torch.rand(3, dtype=LOW), torch.rand(3, dtype=LOW)).dtype == LOW
    handle._deactivate()


def test_half_list_functions_autocast_leaves_out_on_the_cpu():
    handle = o1()
    assert torch.mv(torch.rand(4, 4), torch.rand(4)).dtype == LOW
    assert torch.addr(torch.rand(4, 4), torch.rand(4), torch.rand(4)).dtype == LOW
    handle._deactivate()


def test_in_place_ops_stay_in_place():
    # A cast wrapper on x += y would add into a copy; in-place ops keep native behaviour.
    handle = o1()
    buffer = torch.zeros(3, dtype=LOW)
    alias = buffer
    buffer += torch.ones(3)
    buffer *= 2.0
    assert buffer is alias and buffer.dtype == LOW and buffer.tolist() == [2.0, 2.0, 2.0]
    weight = nn.Parameter(torch.ones(3))
    with torch.no_grad():
        weight.mul_(torch.full((3,), 3.0, dtype=LOW))
    assert weight.dtype == torch.float32 and weight.tolist() == [3.0, 3.0, 3.0]
    handle._deactivate()


# --- RNNs -----------------------------------------------------------------------------------

_CELLS = {
    "rnn_tanh": lambda: nn.RNNCell(8, 8),
    "rnn_relu": lambda: nn.RNNCell(8, 8, nonlinearity="relu"),
    "gru": lambda: nn.GRUCell(8, 8),
    "lstm": lambda: nn.LSTMCell(8, 8),
}


@pytest.mark.parametrize("kind", sorted(_CELLS))
@pytest.mark.parametrize("dtype", [torch.float32, LOW])
def test_rnn_cells_run_in_half_precision(kind, dtype):
    cell = _CELLS[kind]()
    handle = o1()
    xs = [torch.randn(2, 8, dtype=dtype).requires_grad_() for _ in range(3)]
    hidden = torch.zeros(2, 8, dtype=dtype)
    hidden = (hidden, hidden) if kind == "lstm" else hidden
    outputs = []
    for x in xs:
        hidden = cell(x, hidden)
        outputs.append(hidden[0] if kind == "lstm" else hidden)
    assert {y.dtype for y in outputs} == {LOW}
    outputs[-1].float().sum().backward()
    assert [x.grad.dtype for x in xs] == [dtype] * 3
    assert cell.weight_ih.grad.dtype == torch.float32
    handle._deactivate()


_LAYERS = {
    "rnn": lambda layers, bidirectional: nn.RNN(8, 8, layers, nonlinearity="relu",
                                                 bidirectional=bidirectional),
    "gru": lambda layers, bidirectional: nn.GRU(8, 8, layers, bidirectional=bidirectional),
    "lstm": lambda layers, bidirectional: nn.LSTM(8, 8, layers, bidirectional=bidirectional),
}


@pytest.mark.parametrize("kind, layers, bidirectional, dtype", [
    (kind, layers, bidirectional, dtype)
    for kind, (layers, bidirectional), dtype in itertools.product(
        sorted(_LAYERS), [(1, False), (2, False), (2, True)], [torch.float32, LOW])
])
def test_recurrent_layers_run_in_half_precision(kind, layers, bidirectional, dtype):
    # Native CPU autocast fails on nn.LSTM with float32 inputs and leaves nn.GRU in float32.
    rnn = _LAYERS[kind](layers, bidirectional)
    handle = o1()
    x = torch.randn(5, 2, 8, dtype=dtype).requires_grad_()
    hidden = torch.zeros(layers * (1 + bidirectional), 2, 8, dtype=dtype)
    output, _ = rnn(x, (hidden, hidden) if kind == "lstm" else hidden)
    assert output.dtype == LOW
    output[-1].float().sum().backward()
    assert x.grad.dtype == dtype
    handle._deactivate()


@pytest.mark.parametrize("kind", sorted(_LAYERS))
def test_packed_sequences_run_in_half_precision(kind):
    rnn = _LAYERS[kind](2, False)
    handle = o1()
    x = torch.randn(5, 3, 8).requires_grad_()
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([5, 4, 2]))
    output, _ = rnn(packed)
    assert output.data.dtype == LOW
    output.data.float().sum().backward()
    assert x.grad.dtype == torch.float32
    handle._deactivate()


def test_deactivation_restores_torch_vf():
    lstm = torch._VF.lstm
    handle = o1()
    assert torch._VF.lstm is not lstm
    handle._deactivate()
    assert "lstm" not in vars(torch._VF) and torch._VF.lstm is lstm
    assert nn.GRUCell(4, 4)(torch.randn(2, 4)).dtype == torch.float32


# --- choosing -------------------------------------------------------------------------------

def test_native_casts_leave_the_defaults_to_autocast(monkeypatch):
    monkeypatch.setenv(casting.CASTS_ENV_VAR, "native")
    originals = {name: getattr(F, name) for name in ("softmax", "gelu", "layer_norm")}
    sum_method = torch.Tensor.sum
    lstm = torch._VF.lstm
    handle = o1()
    assert {name: getattr(F, name) for name in originals} == originals
    assert torch.Tensor.sum is sum_method and torch._VF.lstm is lstm
    x = torch.rand(4, 4)
    assert native_policy("cpu", "softmax") is None
    assert F.softmax(x.to(LOW), 1).dtype == LOW  # the CPU's own policy
    handle._deactivate()


@pytest.mark.parametrize("setting, cuda, cpu", [
    (None, False, True), ("apex", True, True), ("native", False, False), (" Apex ", True, True),
])
def test_which_devices_follow_apexs_lists(monkeypatch, setting, cuda, cpu):
    if setting is not None:
        monkeypatch.setenv(casting.CASTS_ENV_VAR, setting)
    assert casting.follows_apex_lists("cuda") is cuda
    assert casting.follows_apex_lists("cpu") is cpu


def test_an_unknown_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(casting.CASTS_ENV_VAR, "O1")
    with pytest.raises(ValueError, match="AMPSHIM_CASTS='o1'.*'apex'.*'native'"):
        o1()
    assert not torch.is_autocast_enabled("cpu")


def test_compare_runs_the_original_under_the_native_policy(monkeypatch):
    # Both sides then share the device's autocast policy: compare judges the rewrite.
    settings = {"seed": 0}
    assert runner._environment(settings, None, serve_apex=True)[casting.CASTS_ENV_VAR] == "native"
    assert casting.CASTS_ENV_VAR not in runner._environment(settings, None, serve_apex=False)
    monkeypatch.setenv(casting.CASTS_ENV_VAR, "apex")  # a user's explicit choice is kept
    assert runner._environment(settings, None, serve_apex=True)[casting.CASTS_ENV_VAR] == "apex"


def test_comparing_reads_the_setting_without_importing_torch():
    # compare's own process never loads torch (seconds): the setting it passes on lives apart.
    import subprocess
    import sys

    probe = "import sys, ampshim.compare.runner; print('torch' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert completed.stdout.strip() == "False", completed.stderr
