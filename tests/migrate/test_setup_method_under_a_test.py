"""A trainer's ``__init__`` that calls its amp set-up method only under a test (``if params.amp >= 0:
self.init_amp()``): the GradScaler that method makes does not exist on the other runs, where the
optimizing method's plain arm, stepped through the scaler, would raise AttributeError. A disabled
scaler made in ``__init__`` stands in; where the set-up always runs, none is needed."""
from __future__ import annotations

import itertools
import textwrap

import pytest
import torch

from migrate.api import migrate_source

TRAINER = '''\
import torch
from apex import amp


class Trainer:
    def __init__(self, model, params):
        self.params = params
        self.model = model
        self.optimizers = [torch.optim.SGD(model.parameters(), lr=0.1)]
{call}

    def init_amp(self):
        self.model, self.optimizers = amp.initialize(self.model, self.optimizers, opt_level="O1")

    def optimize(self, loss):
        params = self.params
        if {plain}:
            for optimizer in self.optimizers:
                optimizer.zero_grad()
            loss.backward()
            for optimizer in self.optimizers:
                optimizer.step()
        else:
            with amp.scale_loss(loss, self.optimizers) as scaled_loss:
                scaled_loss.backward()
            for optimizer in self.optimizers:
                optimizer.step()
                optimizer.zero_grad()
'''
# the set-up method called under a test, spelled several ways; its arm's test, as the plain arm tests it
GUARDED = {
    "comparison": ("if params.amp >= 0:\n    self.init_amp()", "params.amp == -1"),
    "flag": ("if params.fp16:\n    self.init_amp()", "not params.fp16"),
    "attribute": ("self.fp16 = params.fp16\nif self.fp16:\n    self.init_amp()", "not self.fp16"),
    "else_arm": ("if params.amp < 0:\n    pass\nelse:\n    self.init_amp()", "params.amp < 0"),
}


class Params:
    def __init__(self, amp: int):
        self.amp, self.fp16 = amp, amp >= 0


def _source(guarded: str) -> str:
    call, plain = GUARDED[guarded]
    return TRAINER.format(call=textwrap.indent(call, " " * 8), plain=plain)


@pytest.mark.parametrize("guarded, unsafe", list(itertools.product(GUARDED, [False, True])))
def test_a_run_that_skips_the_set_up_trains_through_a_disabled_scaler(guarded, unsafe):
    result = migrate_source(_source(guarded), "trainer.py", unsafe_fixes=unsafe)
    new = result.new_source
    if "amp.scale_loss" in new:
        assert not unsafe, new  # safe mode may leave it; --unsafe-fixes must rewrite it without crashing
        return
    assert 'torch.amp.GradScaler("cuda", enabled=False)' in new.split("def init_amp")[0], new
    namespace: dict = {}
    exec(compile(new, "trainer.py", "exec"), namespace)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    trainer = namespace["Trainer"](model, Params(-1))  # mixed precision off: the set-up never runs
    before = model.weight.detach().clone()
    trainer.optimize(model(torch.randn(8, 4)).pow(2).mean())
    assert not torch.equal(before, model.weight.detach())


def test_a_set_up_called_at_every_construction_needs_no_stand_in():
    source = TRAINER.format(call="        self.init_amp()", plain="params.amp == -1")
    new = migrate_source(source, "trainer.py", unsafe_fixes=True).new_source
    assert "amp.scale_loss" not in new and "enabled=False" not in new, new
