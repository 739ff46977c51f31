"""A plain backward pass after the scaled step, nothing clearing the models' gradients before the
next scaled backward (``critic_loss.backward(); critic_opt.step()``): where its loss comes only
from a network the file builds apart from the models and from their outputs detached, its
gradients never reach what the scaler unscales, and the safe fix migrates the file. Where a
gradient can go back into a model (not detached, a critic built around the model's layers, a
critic that is the model's own layer, a loss on the scaled optimizer's parameters), it stays
unsafe with its reason."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

SCRIPT = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F
from apex import amp


def train(batches):
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    {made}
    critic_opt = torch.optim.SGD({critic}.parameters(), lr=0.05)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for {target} in {loop}:
{prepare}        loss = F.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
{critic_pass}        critic_loss.backward()
        critic_opt.step()
        critic_opt.zero_grad()
'''
MADE = {"sequential": ("critic = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1)).cuda()", "critic"),
        "moved": ("critic = nn.Linear(1, 1)\n    critic = critic.to('cuda')", "critic"),
        "class": ("critic = Critic(hidden=8)", "critic")}
# how the critic's input is taken from the model, detached
DETACHED = {
    "call": "        fake = model(x).detach()\n        out = critic(fake)\n",
    "inline": "        out = critic(model(x).detach())\n",
    "later": "        fake = model(x)\n        out = critic(fake.detach() * 0.5)\n",
    "batch": "        out = critic(x[:, :1]) - critic(model(x).detach())\n",
}
LOSSES = {"bce": "        critic_loss = F.binary_cross_entropy_with_logits(out, torch.ones_like(out))\n",
          "mean": "        critic_loss = out.mean()\n"}
LOOPS = {"pairs": ("x, y", "batches", ""), "batch": ("batch", "batches", "        x, y = batch\n"),
         "enumerate": ("step, (x, y)", "enumerate(batches)", "")}
# gradients that may reach the model: each stays unsafe
SHARED = {
    "not_detached": ("critic = nn.Linear(1, 1)", "critic", "        out = critic(model(x))\n"),
    "around_the_model": ("critic = nn.Sequential(model[2], nn.Linear(1, 1))", "critic", "        out = critic(model(x).detach())\n"),
    "a_layer_of_it": ("critic = model[2]", "critic", "        out = critic(model[1](model[0](x)).detach())\n"),
    "its_parameters": ("critic = nn.Linear(1, 1)", "critic",
                       "        out = sum(p.pow(2).sum() for p in optimizer.param_groups[0]['params']) + critic(y)\n"),
    "handed": (None, "critic", "        out = critic(model(x).detach())\n"),
}


def _script(made: str | None, critic: str, critic_pass: str, loss: str, loop: str) -> str:
    target, loop_over, prepare = LOOPS[loop]
    source = SCRIPT.format(made=made or "", critic=critic, critic_pass=critic_pass + LOSSES[loss],
                           target=target, loop=loop_over, prepare=prepare)
    if made is None:  # the critic handed in: what it holds is not known
        source = source.replace("def train(batches):", "def train(batches, critic):")
    if "Critic(" in source:
        source = source.replace("\n\ndef train", "\n\nclass Critic(nn.Module):\n    def __init__(self, hidden):\n"
                                "        super().__init__()\n        self.layer = nn.Linear(1, hidden)\n\n"
                                "    def forward(self, x):\n        return self.layer(x).sum(1, keepdim=True)\n\n\ndef train")
    return source


@pytest.mark.parametrize("made, detached, loss, loop", list(itertools.product(MADE, DETACHED, LOSSES, LOOPS)))
def test_a_critic_apart_from_the_model_is_migrated(made, detached, loss, loop):
    source = _script(*MADE[made], DETACHED[detached], loss, loop)
    result = migrate_source(source, filename="train.py")
    assert result.changed and "apex" not in result.new_source, [d.message for d in result.diagnostics]
    assert "critic_loss.backward()" in result.new_source and "scaler.step(optimizer)" in result.new_source


@pytest.mark.parametrize("shared, loss", list(itertools.product(SHARED, LOSSES)))
def test_gradients_that_may_reach_the_model_keep_it_unsafe(shared, loss):
    source = _script(*SHARED[shared], loss, "pairs")
    result = migrate_source(source, filename="train.py")
    assert not result.changed, result.new_source
    reasons = " ".join(d.fix.why_unsafe or "" for d in result.diagnostics if d.fix is not None)
    assert "`critic_loss.backward()`" in reasons, reasons
