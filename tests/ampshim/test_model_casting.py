from collections import OrderedDict, namedtuple

import pytest
import torch

from _amp_testing import fresh_amp_state, mlp, quiet  # noqa: F401
from ampshim.initialize import initialize

pytestmark = quiet

HALF = torch.bfloat16  # what "float16" means on the CPU

Pair = namedtuple("Pair", "a b")


class Recorder(torch.nn.Module):
    """Returns what it was given, after recording it."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.seen = None

    def forward(self, *args, **kwargs):
        self.seen = (args, kwargs)
        return args, kwargs


class CustomBatch:
    def __init__(self):
        self.casts = []

    def to(self, dtype):
        self.casts.append(dtype)
        return self


def with_norms():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6),
                               torch.nn.BatchNorm1d(6, affine=False), torch.nn.Linear(6, 2))


def test_o2_casts_weights_but_keeps_affine_batchnorm_fp32():
    model = with_norms()
    params_before = list(model.parameters())
    initialize(model, opt_level="O2", verbosity=0)
    assert list(model.parameters()) == params_before  # same Parameter objects
    assert model[0].weight.dtype == HALF and model[3].bias.dtype == HALF
    assert model[1].weight.dtype == torch.float32 and model[1].running_var.dtype == torch.float32
    assert model[2].running_mean.dtype == HALF  # non-affine batch norm IS cast, as in apex
    assert model[1].num_batches_tracked.dtype == torch.int64
    out = model(torch.randn(5, 4))
    assert out.dtype == torch.float32


def test_o2_keep_batchnorm_false_and_o3_cast_everything():
    model = with_norms()
    initialize(model, opt_level="O2", keep_batchnorm_fp32=False, verbosity=0)
    assert model[1].weight.dtype == HALF
    model = with_norms()
    initialize(model, opt_level="O3", verbosity=0)
    assert {p.dtype for p in model.parameters()} == {HALF}
    assert model(torch.randn(5, 4)).dtype == torch.float32


def test_o0_is_fp32_and_casts_double_inputs():
    recorder = Recorder()
    initialize(recorder, opt_level="O0", verbosity=0)
    recorder(torch.ones(2, dtype=torch.float64))
    assert recorder.seen[0][0].dtype == torch.float32


def test_forward_is_an_instance_attribute_casting_inputs_recursively():
    recorder = Recorder()
    initialize(recorder, opt_level="O2", verbosity=0)
    assert "forward" in vars(recorder)
    batch = CustomBatch()
    array_like = "text"
    recorder(torch.ones(2), [torch.ones(1), (torch.ones(1),)], Pair(torch.ones(1), 3),
             torch.arange(3), array_like, batch,
             mapping=OrderedDict(x=torch.ones(1)))
    args, kwargs = recorder.seen
    assert args[0].dtype == HALF
    assert args[1][0].dtype == HALF and args[1][1][0].dtype == HALF
    assert isinstance(args[1][1], tuple)
    assert isinstance(args[2], Pair) and args[2].a.dtype == HALF and args[2].b == 3
    assert args[3].dtype == torch.int64  # non-floating tensors are untouched
    assert args[4] == "text" and args[5] is batch
    assert batch.casts == [HALF, torch.float32]  # cast in, then out
    assert type(kwargs["mapping"]) is dict and kwargs["mapping"]["x"].dtype == HALF


def test_outputs_cast_to_fp32_or_cast_model_outputs():
    recorder = Recorder()
    initialize(recorder, opt_level="O2", verbosity=0)
    (out,), _ = recorder(torch.ones(2))
    assert out.dtype == torch.float32
    recorder = Recorder()
    initialize(recorder, opt_level="O2", cast_model_outputs=torch.float16, verbosity=0)
    (out,), _ = recorder(torch.ones(2))
    assert out.dtype == HALF


def test_cast_model_type_false_disables_model_casting():
    model = with_norms()
    initialize(model, opt_level="O2", cast_model_type=False, verbosity=0)
    assert model[0].weight.dtype == torch.float32 and "forward" not in vars(model)


def test_state_dict_is_fp32_and_loads_back():
    model = with_norms()
    initialize(model, opt_level="O3", verbosity=0)
    state = model.state_dict()
    assert {v.dtype for k, v in state.items() if "num_batches" not in k} == {torch.float32}
    assert model[0].state_dict()["weight"].dtype == torch.float32  # submodules too
    assert model[0].weight.dtype == HALF  # the model itself is untouched
    fresh = with_norms()
    fresh.load_state_dict(state)
    model.load_state_dict(fresh.state_dict())
    assert model[0].weight.dtype == HALF


def test_optimizer_state_is_recast_with_the_model():
    model = with_norms()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    initialize(model, optimizer, opt_level="O3", verbosity=0)
    assert optimizer.state[model[0].weight]["momentum_buffer"].dtype == HALF


def test_rnn_models_are_cast_with_keep_batchnorm():
    model = torch.nn.LSTM(3, 4)
    initialize(model, opt_level="O2", verbosity=0)
    out, _ = model(torch.randn(2, 1, 3))
    assert model.weight_ih_l0.dtype == HALF and out.dtype == torch.float32


def test_input_on_another_device_warns():
    recorder = Recorder()
    initialize(recorder, opt_level="O2", verbosity=0)
    with pytest.warns(UserWarning, match="An input tensor was not on the model's device"):
        recorder(torch.ones(2, device="meta"))
