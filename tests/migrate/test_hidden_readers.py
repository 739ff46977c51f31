"""Gradients read out of the training function's sight between the scaled backward and the step:
in a helper of the file, or by code the file does not show that is handed what holds them
(callbacks given the trainer, a handler made with it, a hook given the model or a part of it: a
sparsity term added to a layer's gradient). apex unscaled as
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
        self.by_groups = GroupClip(self.optimizer)
        self.regularizer = make_regularizer(model)
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
        norms = NormClip(self.model)
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        if self.use_amp:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
{between}
        self.optimizer.step()


class NormClip:
    def __init__(self, model):
        self.model = model

    def update(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)


class GroupClip:
    def __init__(self, optimizer):
        self.optimizer = optimizer

    def update(self):
        torch.nn.utils.clip_grad_norm_([p for group in self.optimizer.param_groups for p in group["params"]], 1.0)
"""
# What runs between the backward and the step, and whether it reads the gradients (clips them).
BETWEEN = {
    "a helper method that clips": ("self.clip()", True),
    "callbacks handed the trainer": ("for callback in self.callbacks:\n    callback(self)", True),
    "a helper firing callbacks": ("self.fire()", True),
    "a handler made with the trainer": ("self.handler.fire_event('backward')", True),
    "a hook handed the model": ("self.hook.on_backward(self.model)", True),
    "an object of a class of the file, kept": ("self.by_groups.update()", True),
    "an object of a class of the file, made in the function": ("norms.update()", True),
    "an object made by code not shown, handed the model": ("self.regularizer.update()", True),
    "a closure that clips": ("def clip_now():\n    torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)\nclip_now()", True),
    "code not shown handed a part of the model": ("add_sparsity(self.model.weight, 0.5)", True),
    "code not shown handed another attribute of the trainer": ("self.logger.info(self.use_amp)", False),
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


class Regularizer:  # code the file does not show, made with the model: it clips its gradients
    def __init__(self, model):
        self.model = model

    def update(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)


def add_sparsity(weight, strength):  # code the file does not show, handed a part of the model: a sparsity term on its gradient
    weight.grad.add_(strength * torch.sign(weight.detach()))


def _update(source: str, use_amp: bool) -> float:
    namespace = {"Handler": Handler, "Logger": Logger, "make_regularizer": Regularizer, "add_sparsity": add_sparsity}
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


MASTER_CLIP = """\
import torch
from apex import amp


def train(model, optimizer, batches, every):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")

    def {name}(max_norm):
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), max_norm)

    for i, (x, y) in enumerate(batches):
        loss = torch.nn.functional.mse_loss(model(x), y) / every
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        {name}(1.0)
{step}
"""
STEP = "optimizer.step()\noptimizer.zero_grad()"


def _train(source: str, every: int) -> torch.Tensor:
    namespace = {}
    exec(compile(source, "train.py", "exec"), namespace)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    batches = [(torch.randn(16, 8), torch.randn(16, 1) * 100) for _ in range(4)]
    namespace["train"](model, torch.optim.SGD(model.parameters(), lr=0.1), batches, every)
    return model.weight.detach()


@pytest.mark.parametrize("name", ["clip", "bound_norm"])
def test_a_helper_clipping_master_params_is_unscaled_once_before_its_call(name, monkeypatch):
    """The step follows each call: one ``unscale_``, before the call (not a second in the helper,
    which raised), and the clip cuts the true gradients, as under apex."""
    source = MASTER_CLIP.format(name=name, step=textwrap.indent(STEP, " " * 8))
    result = migrate_source(source, filename="train.py")
    assert {d.fix.applicability for d in result.diagnostics if d.fix} == {Safety.SAFE}
    assert sum(".unscale_(" in line for line in result.new_source.splitlines()) == 1, result.new_source
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    reference = migrate_source(source.replace('opt_level="O1"', 'opt_level="O0"'), filename="train.py").new_source
    assert torch.allclose(_train(result.new_source, 1), _train(reference, 1), rtol=1e-3)


@pytest.mark.parametrize("name", ["clip", "bound_norm"])
def test_a_helper_clipping_after_each_micro_batch_gets_no_unscale(name, monkeypatch):
    """The step follows every second call: an ``unscale_`` in the helper would run twice before
    the update (GradScaler raises). Unsafe, said so, and it runs."""
    source = MASTER_CLIP.format(name=name, step=textwrap.indent("if (i + 1) % every == 0:\n" + textwrap.indent(STEP, "    "), " " * 8))
    assert migrate_source(source, filename="train.py").new_source == source  # not a safe fix
    result = migrate_source(source, filename="train.py", unsafe_fixes=True)
    called = [line for line in result.new_source.splitlines() if ".unscale_(" in line and not line.lstrip().startswith("#")]
    assert not called and "TODO(ampmigrate)" in result.new_source, result.new_source
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    _train(result.new_source, 2)


BEFORE_AN_AUXILIARY_BACKWARD = """\
import torch
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, regularizer):
        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")
        self.regularizer = Regularizer(self.model)
        self.use_reg = regularizer

    def train(self, batches):
        for x, y in batches:
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
{between}
            self.optimizer.step()
"""
AUXILIARY = {  # a regulariser reads the gradients, then its penalty is scaled and backed
    "in the same block": "if self.use_reg:\n    self.regularizer.update()\n    penalty = self.regularizer.penalty()\n"
                         "    with amp.scale_loss(penalty, self.optimizer) as scaled_penalty:\n        scaled_penalty.backward()",
    "the backward under its own test": "if self.use_reg:\n    if self.rank == 0:\n        self.regularizer.update()\n"
                                        "    penalty = self.regularizer.penalty()\n    if penalty != 0:\n"
                                        "        with amp.scale_loss(penalty, self.optimizer) as scaled_penalty:\n"
                                        "            scaled_penalty.backward()",
    "in the else arm": "if not self.use_reg:\n    pass\nelse:\n    self.regularizer.update()\n"
                       "    with amp.scale_loss(self.regularizer.penalty(), self.optimizer) as scaled_penalty:\n"
                       "        scaled_penalty.backward()",
}


@pytest.mark.parametrize("shape", sorted(AUXILIARY))
def test_a_read_before_another_backward_in_the_same_statement_is_not_unscaled(shape):
    """apex unscaled the first backward's gradients before the regulariser read them; natively
    an ``unscale_`` there would be followed by a backward adding scaled gradients: unsafe, said so."""
    source = BEFORE_AN_AUXILIARY_BACKWARD.format(between=textwrap.indent(AUXILIARY[shape], " " * 12))
    assert migrate_source(source, filename="trainer.py").new_source == source
    result = migrate_source(source, filename="trainer.py", unsafe_fixes=True)
    said = " ".join(line.strip().lstrip("#").strip() for line in result.new_source.splitlines())
    # said at the statement that reads them (the regulariser's update, in its arm)
    assert ("this reads gradients still scaled by the loss scale (apex had unscaled them), and another scaled backward "
            "adds to them before `self.optimizer.step()`") in said, result.new_source
    marked = result.new_source.split("this reads gradients still scaled")[1].split("\n")
    assert next(line for line in marked[1:] if not line.lstrip().startswith("#")).strip() == "self.regularizer.update()", result.new_source
    called = [line for line in result.new_source.splitlines() if ".unscale_(" in line and not line.lstrip().startswith("#")]
    assert not called, result.new_source


ACCUMULATED = """\
import torch
from apex import amp

from losses import compute


def train(model, optimizer, batches, every, log):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for i, (x, y) in enumerate(batches):
        loss = compute(model, x, y)
        if every > 1:
            loss = loss / every
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        log.append(loss.item())
        if (i + 1) % every == 0:
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
            optimizer.step()
            optimizer.zero_grad()
"""


def test_a_value_a_call_handed_the_model_returned_reads_no_gradient():
    """``loss = compute(model, x, y)`` is a value, not an object holding the model: ``loss.item()``
    after each micro-batch's backward reads no gradient, and the clip at the boundary gets the
    one ``unscale_`` (before, the read made the rewrite unsafe)."""
    result = migrate_source(ACCUMULATED, filename="train.py")
    assert {d.fix.applicability for d in result.diagnostics if d.fix} == {Safety.SAFE}, result.diagnostics
    lines = result.new_source.splitlines()
    [unscale] = [i for i, line in enumerate(lines) if ".unscale_(" in line]
    assert "clip_grad_norm_" in lines[unscale + 1], result.new_source
