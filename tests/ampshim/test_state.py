import io
from collections import OrderedDict

import pytest
import torch

import ampshim.state as state_module
from ampshim.scaler import LossScaler
from ampshim.state import _amp_state, load_state_dict, master_params, maybe_print, state_dict

APEX_WRITTEN = {"loss_scaler0": {"loss_scale": 65536.0, "unskipped": 3}}


@pytest.fixture
def scalers():
    saved = _amp_state.__dict__.copy()
    _amp_state.loss_scalers = [LossScaler("dynamic"), LossScaler(128.0)]
    yield _amp_state.loss_scalers
    _amp_state.__dict__.clear()
    _amp_state.__dict__.update(saved)


def test_state_dict_format(scalers):
    scalers[0]._loss_scale = 1024.0
    scalers[0]._unskipped = 7
    sd = state_dict()
    assert isinstance(sd, OrderedDict)
    assert sd == {"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 7},
                  "loss_scaler1": {"loss_scale": 128.0, "unskipped": 0}}
    assert type(sd["loss_scaler0"]["loss_scale"]) is float
    assert type(sd["loss_scaler0"]["unskipped"]) is int


def test_state_dict_into_destination(scalers):
    destination = {"other": 1}
    assert state_dict(destination) is destination
    assert list(destination) == ["other", "loss_scaler0", "loss_scaler1"]


def test_apex_written_state_loads_and_round_trips(scalers, capsys):
    _amp_state.loss_scalers = scalers[:1]
    load_state_dict(APEX_WRITTEN)
    assert capsys.readouterr().out == ""
    assert scalers[0].loss_scale() == 65536.0 and scalers[0]._unskipped == 3
    assert state_dict() == APEX_WRITTEN


def test_loads_under_weights_only_torch_load(scalers):
    _amp_state.loss_scalers = scalers[:1]
    scalers[0]._loss_scale = 512.0
    buffer = io.BytesIO()
    torch.save({"amp": state_dict()}, buffer)
    buffer.seek(0)
    scalers[0]._loss_scale = 1.0
    load_state_dict(torch.load(buffer, weights_only=True)["amp"])
    assert scalers[0].loss_scale() == 512.0


def test_loading_is_by_order_not_by_key_number(scalers):
    load_state_dict(OrderedDict([("loss_scaler7", {"loss_scale": 2.0, "unskipped": 1}),
                                 ("loss_scaler0", {"loss_scale": 4.0, "unskipped": 2})]))
    assert (scalers[0].loss_scale(), scalers[1].loss_scale()) == (2.0, 4.0)


def test_length_mismatch_warns_and_extra_scalers_are_skipped(scalers, capsys):
    load_state_dict({"loss_scaler0": {"loss_scale": 2.0, "unskipped": 0},
                     "loss_scaler1": {"loss_scale": 4.0, "unskipped": 0},
                     "loss_scaler2": {"loss_scale": 8.0, "unskipped": 0}})
    out = capsys.readouterr().out.splitlines()
    assert out == ["Warning: state_dict contains 3 entries, while 2 loss_scalers are used",
                   "Skipping loss_scaler[2], since num_losses was set to 2"]
    assert scalers[1].loss_scale() == 4.0


def test_unexpected_keys_error(scalers):
    with pytest.raises(RuntimeError) as info:
        load_state_dict({"loss_scaler0": {"loss_scale": 2.0, "unskipped": 0}, "a": 1, "b": 2})
    assert str(info.value) == ('Error(s) in loading state_dict. Unexpected key(s) in '
                               'state_dict: "a", "b". ')
    assert scalers[0].loss_scale() == 2.**16  # apex had loaded the rest first; nothing changes


@pytest.mark.parametrize("entry, error, message", [
    ({"loss_scale": float("nan"), "unskipped": 0}, ValueError,
     "loss_scaler1.loss_scale must be a positive, finite number, got nan"),
    ({"loss_scale": float("inf"), "unskipped": 0}, ValueError,
     "loss_scaler1.loss_scale must be a positive, finite number, got inf"),
    ({"loss_scale": -4.0, "unskipped": 0}, ValueError,
     "loss_scaler1.loss_scale must be a positive, finite number, got -4.0"),
    ({"loss_scale": 0, "unskipped": 0}, ValueError,
     "loss_scaler1.loss_scale must be a positive, finite number, got 0"),
    ({"loss_scale": "big", "unskipped": 0}, ValueError,
     "loss_scaler1.loss_scale must be a positive number .*got 'big'"),
    ({"loss_scale": None, "unskipped": 0}, TypeError,
     "loss_scaler1.loss_scale must be a positive number, got None"),
    ({"loss_scale": torch.tensor([2.0, 4.0]), "unskipped": 0}, ValueError,
     r"loss_scaler1.loss_scale must be a single number, got a tensor of shape \(2,\)"),
    ({"loss_scale": 8.0, "unskipped": -1}, ValueError,
     "loss_scaler1.unskipped must be at least 0, got -1"),
    ({"loss_scale": 8.0}, ValueError, "loss_scaler1 has no 'unskipped'"),
    (None, TypeError, "loss_scaler1 must be a dict"),
])
def test_bad_values_are_named_and_no_scaler_changes(scalers, entry, error, message):
    with pytest.raises(error, match=message):
        load_state_dict({"loss_scaler0": {"loss_scale": 2.0, "unskipped": 5},
                         "loss_scaler1": entry})
    assert [(s.loss_scale(), s._unskipped) for s in scalers] == [(2.**16, 0), (128.0, 0)]


def test_a_one_element_tensor_scale_is_a_number(scalers):
    load_state_dict({"loss_scaler0": {"loss_scale": torch.tensor(4.0), "unskipped": 3},
                     "loss_scaler1": {"loss_scale": torch.tensor([8.0]), "unskipped": 0}})
    assert [(s.loss_scale(), s._unskipped) for s in scalers] == [(4.0, 3), (8.0, 0)]
    assert all(type(s.loss_scale()) is float for s in scalers)


def test_a_grad_scaler_state_is_loaded_into_every_scaler(scalers, tmp_path):
    grad_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=10)
    grad_scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    grad_scaler._growth_tracker.fill_(4)
    torch.save({"scaler": grad_scaler.state_dict()}, tmp_path / "migrated.pt")
    load_state_dict(torch.load(tmp_path / "migrated.pt")["scaler"])
    assert [(s.loss_scale(), s._unskipped, s._scale_seq_len) for s in scalers] == [
        (1024.0, 4, 10), (1024.0, 4, 10)]
    for _ in range(6):
        scalers[0].update_scale()
    assert scalers[0].loss_scale() == 2048.0  # grows on GradScaler's schedule


def test_a_grad_scaler_with_other_factors_is_explained(scalers):
    state = torch.amp.GradScaler("cpu", growth_factor=4.0).state_dict()
    with pytest.raises(ValueError, match=r"GradScaler state with growth_factor=4.0.*"
                                         r"torch.amp.GradScaler \(ampmigrate"):
        load_state_dict(state)
    assert scalers[0].loss_scale() == 2.**16


def test_not_a_dict_is_named(scalers):
    with pytest.raises(TypeError, match="expects the dict amp.state_dict.. returned, got 65536.0"):
        load_state_dict(65536.0)


def test_state_dict_without_initialize_is_a_clear_attribute_error(scalers):
    del _amp_state.loss_scalers
    with pytest.raises(AttributeError, match="amp.initialize"):
        state_dict()


def test_module_forwards_to_the_state_object(scalers):
    # `apex.amp._amp_state` may resolve to this module; it must act as the object.
    assert state_module.loss_scalers is scalers
    state_module.allow_incoming_model_not_fp32 = True
    assert _amp_state.allow_incoming_model_not_fp32 is True
    state_module.allow_incoming_model_not_fp32 = False


def test_maybe_print_respects_verbosity(capsys):
    verbosity = _amp_state.verbosity
    try:
        _amp_state.verbosity = 0
        maybe_print("quiet")
        _amp_state.verbosity = 1
        maybe_print("loud", rank0=True)
    finally:
        _amp_state.verbosity = verbosity
    assert capsys.readouterr().out == "loud\n"


def test_master_params_walks_param_groups():
    a, b, c = (torch.nn.Parameter(torch.ones(1)) for _ in range(3))
    optimizer = torch.optim.SGD([{"params": [a, b]}, {"params": [c]}], lr=0.1)
    assert list(master_params(optimizer)) == [a, b, c]
