"""Gradients read out of the training function's sight between the scaled backward and the step:
in a helper of the file, or by code the file does not show that is handed what holds them
(callbacks given the trainer, a handler made with it, a hook given the model). apex unscaled as
``scale_loss`` exited, so they saw true gradients; the rewrite must ``unscale_`` before them.
Judged by running the rewrite on the CPU: with mixed precision on, a clipping callback must move
the weights as it does with it off (before, it clipped scaled gradients: ~65,000x too small)."""
from __future__ import annotations

import textwrap

import pytest

from migrate.api import migrate_source
from migrate.types import Safety

torch = pytest.importorskip("torch")

TRAINER = """\
import torch
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, callbacks, use_amp):
        self.model, self.optimizer, self.callbacks, self.use_amp = model, optimizer, callbacks, use_amp
        self.handler = Handler(callbacks, self)
        self.logger = Logger("train")
        self.hook = callbacks[0]
        if use_amp:
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")

    def fire(self):
        for callback in self.callbacks:
            callback(self)

    def clip(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)

    def note(self):
        print("backward done")

    def step(self, x, y):
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        if self.use_amp:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
{between}
        self.optimizer.step()
"""
# What runs between the backward and the step, and whether it reads the gradients (clips them).
BETWEEN = {
    "a helper method that clips": ("self.clip()", True),
    "callbacks handed the trainer": ("for callback in self.callbacks:\n    callback(self)", True),
    "a helper firing callbacks": ("self.fire()", True),
    "a handler made with the trainer": ("self.handler.fire_event('backward')", True),
    "a hook handed the model": ("self.hook.on_backward(self.model)", True),
    "a helper that only logs": ("self.note()", False),
    "a logger made without the trainer": ("self.logger.info('backward done')", False),
}


class Handler:  # code the file does not show: it hands the trainer to each callback
    def __init__(self, callbacks, trainer):
        self.callbacks, self.trainer = callbacks, trainer

    def fire_event(self, event):
        for callback in self.callbacks:
            callback(self.trainer)


class Logger:
    def __init__(self, name):
        self.name = name

    def info(self, message):
        pass


class Clip:  # a clipping callback, as allennlp's gradient_norm_and_clip
    def __call__(self, trainer):
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), 1.0)

    def on_backward(self, model):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)


def _update(source: str, use_amp: bool) -> float:
    namespace = {"Handler": Handler, "Logger": Logger}
    exec(compile(source, "trainer.py", "exec"), namespace)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    trainer = namespace["Trainer"](model, torch.optim.SGD(model.parameters(), lr=0.1), [Clip()], use_amp)
    before = model.weight.detach().clone()
    trainer.step(torch.randn(16, 8), torch.randn(16, 1) * 100)
    return float((model.weight.detach() - before).norm())


@pytest.mark.parametrize("shape", sorted(BETWEEN))
def test_a_read_out_of_sight_gets_unscaled_gradients(shape, monkeypatch):
    lines, reads = BETWEEN[shape]
    source = TRAINER.format(between=textwrap.indent(lines, " " * 8))
    result = migrate_source(source, filename="trainer.py")
    assert {d.fix.applicability for d in result.diagnostics if d.fix} == {Safety.SAFE}
    assert ("unscale_(self.optimizer)" in result.new_source) == reads, result.new_source
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the GradScaler("cuda") the rewrite makes is on
    assert _update(result.new_source, use_amp=True) == pytest.approx(_update(result.new_source, use_amp=False), rel=1e-3)


STEPPED_OTHERWISE = """\
import torch
from apex import amp


def train(model, optimizer, batches):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
{then}
"""
THEN = {  # what follows the scaled backward, and whether it uses the gradients other than `step()`
    "SAM's two steps": ("optimizer.first_step(zero_grad=True)\nmodel(x).sum().backward()\noptimizer.second_step(zero_grad=True)", True),
    "ASAM's ascent and descent": ("optimizer.ascent_step()\noptimizer.descent_step()", True),
    "a wrapper stepping and scheduling": ("optimizer.step_and_update_lr()", True),
    "the optimizer's own clip": ("optimizer.clip_grad_norm(1.0)\noptimizer.step()", True),
    "Horovod's synchronize, then the step": ("optimizer.synchronize()\noptimizer.step()", False),
    "the step, then zero_grad": ("optimizer.step()\noptimizer.zero_grad()", False),
}


@pytest.mark.parametrize("then", sorted(THEN))
@pytest.mark.parametrize("unsafe_fixes", [False, True])
def test_an_optimizer_stepped_otherwise_than_by_step_is_left_alone(then, unsafe_fixes):
    # GradScaler unscales, and skips on overflow, for `step()` only: SAM's second step would
    # update the weights with gradients 65,536 times too large (fresh43 X2)
    lines, otherwise = THEN[then]
    source = STEPPED_OTHERWISE.format(then=textwrap.indent(lines, " " * 8))
    result = migrate_source(source, filename="train.py", unsafe_fixes=unsafe_fixes)
    assert (result.new_source == source) == otherwise, result.new_source
    if otherwise:
        assert any("uses the gradients, which apex had unscaled" in d.message for d in result.diagnostics)
