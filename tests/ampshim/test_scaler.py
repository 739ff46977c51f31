import io
import pickle

import pytest
import torch

from ampshim.scaler import OVERFLOW_STREAK_WARNING, SCALE_FLOOR, LossScaler


def _backward_pass(scaler, grads):
    """What one non-delayed scale_loss exit does with fresh grads: unscale, then update."""
    scaler.clear_overflow_state()
    scaler.unscale(grads, grads, scaler.loss_scale(), models_are_masters=True)
    return scaler.update_scale()


def test_dynamic_scaler_starts_at_2_16_capped_by_max():
    assert LossScaler("dynamic").loss_scale() == 2.**16
    assert LossScaler("dynamic", max_loss_scale=1024.).loss_scale() == 1024.
    assert LossScaler("dynamic", init_scale=8.).loss_scale() == 8.


def test_apex_attribute_names():
    scaler = LossScaler("dynamic", scale_window=7, min_loss_scale=2., max_loss_scale=4096.)
    assert scaler.dynamic is True
    assert (scaler._loss_scale, scaler._scale_seq_len) == (4096., 7)
    assert (scaler._min_loss_scale, scaler._max_loss_scale) == (2., 4096.)
    assert scaler._unskipped == 0 and scaler._has_overflow is False
    assert isinstance(scaler._overflow_buf, torch.Tensor)


def test_unscale_in_place_divides_by_scale():
    scaler = LossScaler("dynamic")
    grads = [torch.full((3,), 3 * 2.**16), torch.full((2,), 2.**16, dtype=torch.bfloat16)]
    assert _backward_pass(scaler, grads) is False
    assert torch.equal(grads[0], torch.full((3,), 3.))
    assert torch.equal(grads[1], torch.ones(2, dtype=torch.bfloat16))
    assert scaler._unskipped == 1


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_overflow_skips_and_halves(bad):
    scaler = LossScaler("dynamic")
    grads = [torch.ones(4), torch.ones(2, dtype=torch.bfloat16)]
    grads[1][1] = bad
    scaler._unskipped = 5
    assert _backward_pass(scaler, grads) is True
    assert scaler.loss_scale() == 2.**15
    assert scaler._unskipped == 0
    # the next clean pass does not skip
    assert _backward_pass(scaler, [torch.ones(2)]) is False
    assert scaler.loss_scale() == 2.**15


def test_growth_after_scale_window_clean_passes_and_max_clamp():
    scaler = LossScaler("dynamic", max_loss_scale=2.**17)
    for _ in range(1999):
        scaler.update_scale()
    assert scaler.loss_scale() == 2.**16 and scaler._unskipped == 1999
    scaler.update_scale()
    assert scaler.loss_scale() == 2.**17 and scaler._unskipped == 0
    for _ in range(2000):
        scaler.update_scale()
    assert scaler.loss_scale() == 2.**17  # capped


def test_min_loss_scale_clamps_halving():
    scaler = LossScaler("dynamic", init_scale=4., min_loss_scale=2.)
    for _ in range(3):
        assert _backward_pass(scaler, [torch.tensor([float("inf")])]) is True
    assert scaler.loss_scale() == 2.


def test_no_floor_by_default():
    scaler = LossScaler("dynamic", init_scale=2.)
    for _ in range(3):
        _backward_pass(scaler, [torch.tensor([float("inf")])])
    assert scaler.loss_scale() == 0.25


def test_hundreds_of_overflowing_passes_stop_at_the_floor_and_warn_once():
    scaler = LossScaler("dynamic")
    with pytest.warns(RuntimeWarning) as caught:
        for _ in range(300):
            assert _backward_pass(scaler, [torch.tensor([float("nan"), 1.])]) is True
    assert scaler.loss_scale() == SCALE_FLOOR == 2.**-126
    # the floor's reciprocal, used to unscale, is still a finite float32
    assert torch.isfinite(torch.tensor(1 / SCALE_FLOOR, dtype=torch.float32))
    assert len(caught) == 1
    assert f"inf/NaN in {OVERFLOW_STREAK_WARNING} consecutive backward passes" in str(
        caught[0].message)
    # the loss recovers: clean passes do not skip, and the scale grows again
    grads = [torch.tensor([3 * SCALE_FLOOR])]
    assert _backward_pass(scaler, grads) is False
    assert grads[0].item() == 3.


def test_the_warning_comes_again_only_after_a_clean_pass(recwarn):
    scaler = LossScaler("dynamic", init_scale=1.)
    for streak in range(2):
        for _ in range(OVERFLOW_STREAK_WARNING - 1):
            _backward_pass(scaler, [torch.tensor([float("inf")])])
        assert len(recwarn) == streak
        _backward_pass(scaler, [torch.tensor([float("inf")])])
        assert len(recwarn) == streak + 1
        _backward_pass(scaler, [torch.tensor([1.])])


def test_min_loss_scale_below_the_floor_stops_at_the_floor():
    scaler = LossScaler("dynamic", init_scale=1., min_loss_scale=2.**-140)
    with pytest.warns(RuntimeWarning):
        for _ in range(200):
            _backward_pass(scaler, [torch.tensor([float("inf")])])
    assert scaler.loss_scale() == SCALE_FLOOR


def test_static_scale_never_detects_overflow():
    scaler = LossScaler(128.0)
    grads = [torch.tensor([256., float("inf")])]
    assert _backward_pass(scaler, grads) is False
    assert grads[0][0].item() == 2.
    assert scaler.loss_scale() == 128.0 and scaler._unskipped == 1
    for _ in range(3000):
        scaler.update_scale()
    assert scaler.loss_scale() == 128.0


def test_unscale_into_fp32_masters_happens_in_fp32():
    # 2**-26 underflows in float16; the scaled value 2**-10 does not. Unscaling must happen in
    # the master's precision.
    scaler = LossScaler("dynamic")
    model_grads = [torch.full((2,), 2.**-10, dtype=torch.float16)]
    masters = [torch.empty(2)]
    scaler.clear_overflow_state()
    scaler.unscale(model_grads, masters, scaler.loss_scale())
    assert torch.equal(masters[0], torch.full((2,), 2.**-26))
    assert model_grads[0].dtype == torch.float16 and model_grads[0][0].item() == 2.**-10
    assert scaler.update_scale() is False


def test_unscale_with_stashed_in_place_adds_stash():
    scaler = LossScaler("dynamic", init_scale=4.)
    fresh = [torch.tensor([8., 4.])]
    stash = [torch.tensor([1., float("inf")])]  # the stash is not checked: only new grads are
    scaler.clear_overflow_state()
    scaler.unscale_with_stashed(fresh, stash, fresh)
    assert fresh[0][0].item() == 3. and fresh[0][1].item() == float("inf")
    assert scaler.update_scale() is False


def test_unscale_with_stashed_into_stash_from_half_grads():
    scaler = LossScaler("dynamic")
    fresh = [torch.full((2,), 2.**-10, dtype=torch.float16)]
    stash = [torch.full((2,), 1.)]
    scaler.clear_overflow_state()
    scaler.unscale_with_stashed(fresh, stash, stash)
    assert torch.equal(stash[0], torch.full((2,), 1. + 2.**-26))


def test_unscale_with_stashed_scale_override_and_separate_output():
    scaler = LossScaler("dynamic")
    out = [torch.zeros(2)]
    scaler.clear_overflow_state()
    scaler.unscale_with_stashed([torch.full((2,), 8.)], [torch.full((2,), 6.)], out,
                                scale_override=(4., 2., 10.))
    assert torch.equal(out[0], torch.full((2,), 10. * (2. + 3.)))


def test_unscale_with_stashed_flags_overflow_in_new_grads():
    scaler = LossScaler("dynamic")
    fresh = [torch.tensor([float("nan")])]
    scaler.clear_overflow_state()
    scaler.unscale_with_stashed(fresh, [torch.ones(1)], fresh)
    assert scaler.update_scale() is True


def test_overflow_flag_is_cleared_between_passes():
    scaler = LossScaler("dynamic")
    assert _backward_pass(scaler, [torch.tensor([float("inf")])]) is True
    assert _backward_pass(scaler, [torch.tensor([1.])]) is False


class _ApexLossScaler:
    """Stand-in for apex's class: pickles as a plain attribute dict, like apex's did."""


def _apex_pickle(state, dump=pickle.dump, **kwargs):
    """Bytes of a pickled apex LossScaler (protocol 2, as torch.save writes): the stand-in is
    pickled, then its class reference is pointed at ``ampshim.scaler.LossScaler``."""
    stand_in = _ApexLossScaler()
    stand_in.__dict__.update(state)
    buffer = io.BytesIO()
    dump(stand_in, buffer, protocol=2, **kwargs)
    ours = f"{__name__}\n_ApexLossScaler\n".encode()
    assert buffer.getvalue().count(ours) == 1
    return buffer.getvalue().replace(ours, b"ampshim.scaler\nLossScaler\n")


APEX_SCALER_DICT = {
    "dynamic": True, "_loss_scale": 1024.0, "_max_loss_scale": 2.**24, "_min_loss_scale": None,
    "_scale_seq_len": 2000, "_unskipped": 17, "_has_overflow": False,
    "_overflow_buf": torch.zeros(1, dtype=torch.int32),
}


def test_unpickles_apex_attribute_dict_and_keeps_working():
    scaler = pickle.loads(_apex_pickle(dict(APEX_SCALER_DICT)))
    assert isinstance(scaler, LossScaler)
    assert scaler.loss_scale() == 1024.0 and scaler._unskipped == 17
    assert _backward_pass(scaler, [torch.tensor([float("inf")])]) is True
    assert scaler.loss_scale() == 512.0


def test_unpickles_pre_min_max_apex_pickles():
    old = {k: v for k, v in APEX_SCALER_DICT.items()
           if k not in ("_min_loss_scale", "_max_loss_scale")}
    scaler = pickle.loads(_apex_pickle(old))
    assert scaler._min_loss_scale is None and scaler._max_loss_scale == 2.**24


def test_torch_load_of_apex_checkpoint_with_pickled_scaler():
    def legacy_torch_save(obj, buffer, protocol):
        torch.save({"loss_scaler": obj}, buffer, pickle_protocol=protocol,
                   _use_new_zipfile_serialization=False)

    data = _apex_pickle(dict(APEX_SCALER_DICT), dump=legacy_torch_save)
    loaded = torch.load(io.BytesIO(data), weights_only=False)["loss_scaler"]
    assert type(loaded) is LossScaler and loaded.loss_scale() == 1024.0


def test_torch_save_round_trip_keeps_apex_attributes():
    scaler = LossScaler(128.0)
    scaler._unskipped = 3
    buffer = io.BytesIO()
    torch.save({"loss_scaler": scaler}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)["loss_scaler"]
    assert set(vars(loaded)) >= {"dynamic", "_loss_scale", "_unskipped", "_scale_seq_len"}
    assert (loaded.dynamic, loaded.loss_scale(), loaded._unskipped) == (False, 128.0, 3)
    assert set(scaler.__getstate__()) == set(APEX_SCALER_DICT)


def test_state_dict_is_plain_numbers_and_rebuilds_the_scaler(tmp_path):
    scaler = LossScaler("dynamic", scale_window=7, min_loss_scale=2., max_loss_scale=4096.)
    scaler._loss_scale, scaler._unskipped = 512., 5
    torch.save({"scaler": scaler.state_dict()}, tmp_path / "scaler.pt")
    state = torch.load(tmp_path / "scaler.pt")["scaler"]  # weights_only=True, torch's default
    assert state == {"dynamic": True, "loss_scale": 512., "unskipped": 5, "scale_window": 7,
                     "min_loss_scale": 2., "max_loss_scale": 4096.}
    restored = LossScaler.from_state_dict(state)
    assert restored.state_dict() == state
    for _ in range(2):
        restored.update_scale()
    assert restored.loss_scale() == 1024. and restored._unskipped == 0


@pytest.mark.parametrize("value, error, message", [
    (float("nan"), ValueError, "positive, finite number, got nan"),
    (float("inf"), ValueError, "positive, finite number, got inf"),
    (-1., ValueError, "positive, finite number, got -1.0"),
    (0, ValueError, "positive, finite number, got 0"),
    ("big", ValueError, "positive number .*got 'big'"),
    (None, TypeError, "positive number, got None"),
    (True, TypeError, "positive number, got True"),
    (torch.ones(2), ValueError, r"a single number, got a tensor of shape \(2,\)"),
])
def test_from_state_dict_names_the_bad_value(value, error, message):
    state = LossScaler("dynamic").state_dict()
    state["loss_scale"] = value
    with pytest.raises(error, match="loss_scaler.loss_scale must be (a )?" + message):
        LossScaler.from_state_dict(state)


def test_from_state_dict_accepts_a_one_element_tensor_and_rejects_other_things():
    state = dict(LossScaler(8.).state_dict(), loss_scale=torch.tensor([8.]))
    assert LossScaler.from_state_dict(state).loss_scale() == 8.
    with pytest.raises(ValueError, match=r"lacks \['unskipped'\]"):
        LossScaler.from_state_dict({"dynamic": True, "loss_scale": 2.})
    with pytest.raises(TypeError, match="must be a dict"):
        LossScaler.from_state_dict(2.)
    with pytest.raises(ValueError, match="loss_scaler.unskipped must be at least 0"):
        LossScaler.from_state_dict(dict(LossScaler(8.).state_dict(), unskipped=-3))


@pytest.mark.parametrize("bad", [0, -2., float("nan"), "big"])
def test_constructor_rejects_unusable_scales(bad):
    with pytest.raises(ValueError, match="loss_scale must be"):
        LossScaler(bad)
    with pytest.raises(ValueError, match="init_scale must be"):
        LossScaler("dynamic", init_scale=bad)
