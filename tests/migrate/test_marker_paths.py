"""Paths in markers and messages: another file of the project is named relative to the project's
root, wherever the run starts (a user's repository copied under a scratch folder), and a marker
never breaks a path across its comment lines (``...cvpod`` / ``s/engine/hooks.py``)."""
from __future__ import annotations

import pytest

from migrate import api

PACKAGE = "detection_models_with_a_rather_long_package_name"
TRAIN_NET = f"""\
import torch
from apex import amp

from {PACKAGE}.engine_components.training_loop_of_the_detector import do_train


def train(cfg, model, optimizer, loader):
    use_mixed_precision = cfg.DTYPE == "float16"
    amp_opt_level = "O1" if use_mixed_precision else "O0"
    if cfg.SOLVER.AMP_ON:  # in a block: the scaler cannot be handed over, the pair is unsafe
        model, optimizer = amp.initialize(model, optimizer, opt_level=amp_opt_level)
    do_train(model, loader, optimizer)
"""
TRAINER = """\
import torch
from apex import amp


def do_train(model, loader, optimizer):
    for images, targets in loader:
        loss_dict = model(images, targets)
        losses = sum(loss for loss in loss_dict.values())
        optimizer.zero_grad()
        with amp.scale_loss(losses, optimizer) as scaled_losses:
            scaled_losses.backward()
        optimizer.step()
"""
TRAINER_PATH = f"{PACKAGE}/engine_components/training_loop_of_the_detector.py"


@pytest.mark.parametrize("start", ["above", "root", "inside"])
def test_the_other_half_is_named_from_the_project_root_and_kept_whole(tmp_path, monkeypatch, start):
    root = tmp_path / "scratch" / "copies" / "a_repository_copied_for_review"
    (root / "tools").mkdir(parents=True)
    (root / "setup.py").write_text("from setuptools import setup\n\nsetup(name='detector')\n")
    (root / "tools" / "train_net.py").write_text(TRAIN_NET)
    trainer = root / TRAINER_PATH
    trainer.parent.mkdir(parents=True)
    for folder in (trainer.parent, trainer.parent.parent):
        (folder / "__init__.py").write_text("")
    trainer.write_text(TRAINER)
    monkeypatch.chdir({"above": tmp_path, "root": root, "inside": root / "tools"}[start])
    results = {r.filename: r for r in api.migrate_paths([str(root)], write=False, unsafe_fixes=True)}
    new = results[str(root / "tools" / "train_net.py")].new_source
    comments = [line.strip().lstrip("#").strip() for line in new.splitlines() if line.strip().startswith("#")]
    assert any(TRAINER_PATH in line for line in comments), comments  # whole, on one line
    assert "scratch" not in new and "copies" not in new, new
    messages = " ".join(f"{d.message} {d.fix.message} {d.fix.why_unsafe}" for r in results.values() for d in r.diagnostics if d.fix)
    assert f"{TRAINER_PATH} (line" in messages or f"{TRAINER_PATH} gets" in messages, messages
    assert "scratch/copies" not in messages, messages
