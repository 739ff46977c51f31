"""A plain backward pass that takes a loss the file's own GradScaler scaled on the way.

Trainers offering native AMP beside apex scale the loss before the switch (``if use_native:
loss = self.native_scaler.scale(loss)``), then run apex's scaled pass or a plain
``loss.backward()``. Where the rewrite's GradScaler is on whatever the switch (its ``initialize``
is in another file), scaling that plain pass would scale the native path's loss twice, and
leaving it would step fp32 runs through a scaler that unscales what was never scaled: the file
is left alone. A pass every run of which takes a natively scaled loss is the native path's own.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from migrate.api import migrate_paths

TRAIN = """from apex import amp

from engine import Trainer


def main(args, model, optimizer, batches):
    if args.apex:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    Trainer(model, optimizer, args.apex, args.native).train(batches)
"""

ENGINE = """import torch
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, use_apex, use_native):
        self.model = model
        self.optimizer = optimizer
        self.use_apex = use_apex
        self.use_native = use_native
        {scaler} = torch.amp.GradScaler("cuda", enabled=use_native)

    def _forward_backward(self, x, y):
        loss = torch.nn.functional.mse_loss(self.model(x), y)
{scaling}
        return loss

    def _step(self):
        if self.use_native:
            {scaler}.step(self.optimizer)
            {scaler}.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad()

    def train(self, batches):
        for x, y in batches:
            self._forward_backward(x, y)
            self._step()
"""

# the native scaling on the way to a backward pass that fp32 runs take too
MIXED = {
    "before_the_switch": """        if self.use_native:
            loss = {scaler}.scale(loss)
        if self.use_apex:
            with amp.scale_loss(loss, self.optimizer) as scaled:
                scaled.backward()
        else:
            loss.backward()""",
    "after_apex_returns": """        if self.use_apex:
            with amp.scale_loss(loss, self.optimizer) as scaled:
                scaled.backward()
            return loss
        if self.use_native:
            loss = {scaler}.scale(loss)
        loss.backward()""",
}
# every run that reaches the plain pass takes the natively scaled loss
NATIVE_ONLY = {
    "assigned": """        if self.use_apex:
            with amp.scale_loss(loss, self.optimizer) as scaled:
                scaled.backward()
        else:
            scaled_loss = {scaler}.scale(loss)
            scaled_loss.backward()""",
    "inline": """        if self.use_apex:
            with amp.scale_loss(loss, self.optimizer) as scaled:
                scaled.backward()
        else:
            {scaler}.scale(loss).backward()""",
}
SCALERS = ["self.native_scaler", "self._scaler"]


def _project(root: Path, scaling: str, scaler: str) -> Path:
    (root / "train.py").write_text(TRAIN)
    (root / "engine.py").write_text(ENGINE.format(scaler=scaler, scaling=scaling.format(scaler=scaler)))
    return root


@pytest.mark.parametrize(("shape", "scaler"), list(itertools.product(sorted(MIXED), SCALERS)))
def test_a_plain_pass_fp32_and_native_runs_share_leaves_the_project_alone(tmp_path, shape, scaler):
    root = _project(tmp_path, MIXED[shape], scaler)
    before = {path.name: path.read_text() for path in root.iterdir()}
    results = migrate_paths([root], unsafe_fixes=True)
    assert {path.name: path.read_text() for path in root.iterdir()} == before
    messages = " ".join(d.message for result in results for d in result.diagnostics)
    assert "a second GradScaler cannot scale only the unscaled one" in messages, messages


@pytest.mark.parametrize(("shape", "scaler"), list(itertools.product(sorted(NATIVE_ONLY), SCALERS)))
def test_a_pass_only_native_runs_take_is_not_scaled_again(tmp_path, shape, scaler):
    root = _project(tmp_path, NATIVE_ONLY[shape], scaler)
    migrate_paths([root], unsafe_fixes=True)
    engine = (root / "engine.py").read_text()
    assert "amp.scale_loss" not in engine, engine
    native = "scaled_loss.backward()" if shape == "assigned" else f"{scaler}.scale(loss).backward()"
    assert f"\n            {native}\n" in engine, engine
    assert f"scaler.scale({scaler}.scale(" not in engine and "scaler.scale(scaled_loss)" not in engine, engine
