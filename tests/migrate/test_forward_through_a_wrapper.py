"""The model the training loop runs through a wrapper its class keeps (``self.runner =
nn.DataParallel(self.model) if multi_gpu else self.model``, set before or after
``amp.initialize``): that forward pass is the model's, and goes under autocast, however the
wrapper is spelled."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

from generated.apex_scripts import Features
from generated.judge import judge

WRAPPERS = ["nn.DataParallel(self.model) if multi_gpu else self.model",
            "torch.nn.parallel.DistributedDataParallel(self.model, device_ids=[0])",
            "self.model"]

TRAINER = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, multi_gpu=False):
        self.model, self.optimizer = model, optimizer
        {before}
        self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")
        {after}

    def step(self, x, y):
        logits = self.runner(x)
        loss = F.cross_entropy(logits, y)
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
"""


@pytest.mark.parametrize(("wrapper", "before"), list(itertools.product(WRAPPERS, (True, False))))
def test_the_wrappers_forward_goes_under_autocast(wrapper, before):
    line = f"self.runner = {wrapper}"
    source = TRAINER.format(before=line if before else "pass", after="pass" if before else line)
    result = migrate_source(source, "trainer.py")
    fixed = result.new_source
    assert fixed and "apex" not in fixed and "TODO(ampmigrate)" not in fixed, fixed
    lines = fixed.splitlines()
    forward = next(i for i, text in enumerate(lines) if "logits = self.runner(x)" in text)
    assert "torch.autocast(" in lines[forward - 1], fixed
    assert "loss = F.cross_entropy" in lines[forward + 1] and lines[forward + 1].startswith(" " * 12), fixed


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["on", "none"])
def test_a_generated_trainer_running_a_wrapper(flag, tmp_path):
    drawn = Features(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="none",
                     clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False,
                     names=("model", "optimizer", "loss"), holder="method", forward_via="wrapper")
    outcome = judge(drawn, tmp_path)
    assert outcome.safe_complete, outcome.summary


@pytest.mark.parametrize("copy_call", ["copy.deepcopy(self.model)", "deepcopy(self.model)", "copy.copy(self.model)"])
def test_a_copy_of_the_model_is_no_wrapper_of_it(copy_call):
    # a copy has parameters of its own (an EMA): its forward pass is not the trained model's
    source = TRAINER.format(before="pass", after=f"self.runner = {copy_call}")
    source = source.replace("import torch\n", "import copy\nfrom copy import deepcopy\nimport torch\n", 1)
    result = migrate_source(source, "trainer.py")
    assert not result.changed, result.new_source
    assert any("forward call is not seen" in (d.fix.why_unsafe or "") for d in result.diagnostics if d.fix)
