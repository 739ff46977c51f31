"""A training step with a native-AMP arm and an fp32 arm beside the apex one, tested again at the
clip (``if native: ... elif apex: ... else: ...`` twice): only the apex arm's clip reads the
gradients apex had unscaled, so only it changes. The migration runs on the CPU in the arms
that do not use apex (before, their clips asked a scaler that only the apex arm makes)."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source

torch = pytest.importorskip("torch")

SOURCE = '''\
import torch
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, fp16, native, accumulate):
        self.model, self.optim = model, optimizer
        self.fp16, self.native, self.accumulate = fp16, native, accumulate
        if fp16 and native:
            self.scaler = torch.amp.GradScaler("cpu")
        elif fp16:
            self.model, self.optim = amp.initialize(self.model, self.optim, opt_level="O1")

    def step(self, x, y, update):
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        if self.fp16 and self.native:
            self.scaler.scale(loss).backward()
        elif self.fp16:
            with amp.scale_loss(loss, self.optim) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        if self.fp16 and self.native:
            self.scaler.unscale_(self.optim)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        elif self.fp16:
            torch.nn.utils.clip_grad_norm_(amp.master_params(self.optim), 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        if update:
            if self.fp16 and self.native:
                self.scaler.step(self.optim)
                self.scaler.update()
            else:
                self.optim.step()
            self.optim.zero_grad()
'''


def _train(source: str, fp16: bool, native: bool) -> list[float]:
    namespace: dict = {}
    exec(compile(source, "trainer.py", "exec"), namespace)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    trainer = namespace["Trainer"](model, torch.optim.SGD(model.parameters(), lr=0.1), fp16, native, False)
    for i in range(4):
        trainer.step(torch.randn(8, 4), torch.randn(8, 1), update=True)
    return [float(p.detach().sum()) for p in model.parameters()]


def test_only_the_apex_arms_clip_changes_and_the_other_arms_run_as_before():
    migrated = migrate_source(SOURCE, "trainer.py", unsafe_fixes=True).new_source
    assert "from apex" not in migrated and "amp.master_params(" not in migrated, migrated
    clips = [line.strip() for line in migrated.splitlines() if "clip_grad_norm_(" in line]
    assert clips.count("torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)") == 2, migrated
    assert sum("get_scale()" in line for line in migrated.splitlines()) == 1, migrated
    for fp16, native in ((False, False), (True, True)):  # the arms apex never ran in
        assert _train(migrated, fp16, native) == _train(SOURCE.replace("from apex import amp\n", ""), fp16, native)


# The trainer's step is taken in another method (not next to `amp.scale_loss`), so every step of the
# file goes through the new scaler and a plain backward beside the scaled one gets scaled too; the
# native arm's `scaler.scale(loss).backward()` is scaled already and stays as written.
STEP_ELSEWHERE = '''\
import torch
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, fp16, native):
        self.model, self.optim, self.fp16, self.native = model, optimizer, fp16, native
        self.{scaler} = torch.amp.GradScaler("cpu") if fp16 and native else None
        if fp16 and not native:
            self.model, self.optim = amp.initialize(self.model, self.optim, opt_level="O1")

    def backward(self, x, y):
        loss = torch.nn.functional.mse_loss(self.model(x), y)
{arms}
        return loss

    def train(self, batches):
        for x, y in batches:
            self.backward(x, y)
            if self.fp16 and self.native:
                self.{scaler}.step(self.optim)
                self.{scaler}.update()
            else:
                self.optim.step()
            self.optim.zero_grad()
'''
NATIVE_ARM = "        if self.native:\n            self.{scaler}.scale(loss).backward()\n"
APEX_ARM = "        if self.fp16:\n            with amp.scale_loss(loss, self.optim) as scaled_loss:\n                scaled_loss.backward()\n"
PLAIN_ARM = "        else:\n            loss.backward()\n"


def _arms(native_first: bool) -> str:
    if native_first:
        return NATIVE_ARM + "        el" + APEX_ARM.lstrip() + PLAIN_ARM
    return APEX_ARM.replace("if self.fp16:", "if self.fp16 and not self.native:") + "        el" + NATIVE_ARM.lstrip() + PLAIN_ARM


@pytest.mark.parametrize("scaler", ["scaler", "grad_scaler", "amp_scaler"])
@pytest.mark.parametrize("native_first", [True, False])
def test_a_native_arms_scaled_backward_is_not_scaled_again(scaler, native_first):
    source = STEP_ELSEWHERE.format(scaler=scaler, arms=_arms(native_first).replace("{scaler}", scaler))
    migrated = migrate_source(source, "trainer.py", unsafe_fixes=True).new_source
    assert "from apex" not in migrated, migrated
    native = [line.strip() for line in migrated.splitlines() if f"self.{scaler}.scale(" in line]
    assert native == [f"self.{scaler}.scale(loss).backward()"], migrated
    native_line = source.splitlines().index(f"            self.{scaler}.scale(loss).backward()") + 1
    assert f"backward pass at line {native_line} unscaled" not in migrated, migrated
    namespace: dict = {}
    exec(compile(migrated, "trainer.py", "exec"), namespace)
    original: dict = {}
    exec(compile(source.replace("from apex import amp\n", ""), "trainer.py", "exec"), original)
    for fp16, native in ((False, False), (True, True)):  # the arms apex never ran in
        weights = []
        for space in (namespace, original):
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            trainer = space["Trainer"](model, torch.optim.SGD(model.parameters(), lr=0.1), fp16, native)
            trainer.train([(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)])
            weights.append([float(p.detach().sum()) for p in model.parameters()])
        assert weights[0] == weights[1], (fp16, native)
