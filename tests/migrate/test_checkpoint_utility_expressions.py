"""A checkpoint utility (no ``amp.initialize`` nor ``amp.scale_loss`` in its file) that reads
``amp.state_dict()`` inside an expression: a dict's value, under a test, an argument, a keyed read.
``--unsafe-fixes`` gives its function a ``scaler=None`` parameter and reads the scaler's state
there, None where no scaler is given; run, the saved state is the scaler's."""
from __future__ import annotations

import itertools
import re

import pytest

from migrate.api import migrate_source

# each saves None where mixed precision is off, as the rewrite does where no scaler is handed over
READS = {
    "dict value": '{"model": model.state_dict(), "amp": amp.state_dict() if use_amp else None}',
    "mirrored": '{"model": model.state_dict(), "amp": None if not use_amp else amp.state_dict()}',
    "an argument": 'dict(model=model.state_dict(), amp=amp.state_dict() if use_amp else None)',
    "keyed": '{"model": model.state_dict(), "scale": amp.state_dict()["loss_scaler0"]["loss_scale"] if use_amp else None}',
}
# with no None of the file's own, a None saved would meet a load that expects a state
UNTESTED = {
    "dict value": '{"model": model.state_dict(), "amp": amp.state_dict()}',
    "an argument": 'dict(model=model.state_dict(), amp=amp.state_dict())',
    "another default": '{"model": model.state_dict(), "amp": amp.state_dict() if use_amp else {}}',
}

FUNCTION = """\
import torch
from apex import amp


def save(model, path, use_amp=True):
    state = {read}
    torch.save(state, path)
    return state


def load(model, path, use_amp=True):
    checkpoint = torch.load(path)
    model.load_state_dict(checkpoint["model"])
    if use_amp:
        amp.load_state_dict(checkpoint["amp"])
"""

METHOD = """\
import torch
from apex import amp


class Checkpointer:
    def __init__(self, use_amp=True):
        self.use_amp = use_amp

    def save(self, model, path):
        use_amp = self.use_amp
        state = {read}
        torch.save(state, path)
        return state
"""
HOLDERS = {"function": FUNCTION, "method": METHOD}
FORMS = list(itertools.product(sorted(READS), sorted(HOLDERS)))


def _fixed(read: str, holder: str, unsafe_fixes: bool = True, reads: dict = READS):
    source = HOLDERS[holder].format(read=reads[read])
    return source, migrate_source(source, filename="checkpoints.py", unsafe_fixes=unsafe_fixes)


@pytest.mark.parametrize(("read", "holder"), FORMS)
def test_the_state_read_in_an_expression_is_the_given_scalers(read, holder):
    _, result = _fixed(read, holder)
    fixed = result.new_source
    assert result.changed and not re.search(r"(?<![\w.])amp\.", fixed) and not re.search(r"(?m)^\s*(from|import) apex", fixed), fixed
    assert "scaler=None)" in fixed and "if scaler is not None else None)" in fixed, fixed
    assert "TODO(ampmigrate): pass the GradScaler as `scaler=` where `save` is called" in fixed, fixed
    compile(fixed, "checkpoints.py", "exec")


@pytest.mark.parametrize(("read", "holder"), FORMS)
def test_the_safe_run_leaves_it(read, holder):
    source, result = _fixed(read, holder, unsafe_fixes=False)
    assert result.new_source == source


@pytest.mark.parametrize("read", sorted(READS))
def test_run_it_saves_the_scalers_state_or_none(read, tmp_path):
    torch = pytest.importorskip("torch")
    _, result = _fixed(read, "function")
    namespace: dict = {}
    exec(compile(result.new_source, "checkpoints.py", "exec"), namespace)
    model = torch.nn.Linear(2, 1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    key = "scale" if read == "keyed" else "amp"
    given = namespace["save"](model, tmp_path / "given.pt", scaler=scaler)
    assert given[key] == (scaler.get_scale() if read == "keyed" else scaler.state_dict())
    assert namespace["save"](model, tmp_path / "alone.pt")[key] is None
    assert namespace["save"](model, tmp_path / "off.pt", use_amp=False, scaler=scaler)[key] is None
    if read != "keyed":  # the state saved loads back into a scaler handed to `load`
        other = torch.amp.GradScaler("cpu", init_scale=2.0)
        namespace["load"](model, tmp_path / "given.pt", scaler=other)
        assert other.get_scale() == 1024.0


@pytest.mark.parametrize(("read", "holder"), list(itertools.product(sorted(UNTESTED), sorted(HOLDERS))))
def test_a_state_read_with_no_none_beside_it_stays_reported(read, holder):
    source, result = _fixed(read, holder, reads=UNTESTED)
    assert result.new_source == source
    assert any("inside an expression" in d.message for d in result.diagnostics if d.code == "AMP005"), result.diagnostics
