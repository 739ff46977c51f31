"""AMP004: ``clip(amp.master_params(opt))`` -> ``scaler.unscale_(opt)`` and the optimizer's parameters."""
from __future__ import annotations

from migrate.rule import Invalid, Valid
from migrate.rules._apex_planned import PlannedApexRule


class AmpMasterParams(PlannedApexRule):
    """What it does:
    Replaces ``amp.master_params(opt)`` with the optimizer's parameters,
    ``(p for group in opt.param_groups for p in group["params"])`` (what apex yields under O1),
    and, when they go into something that reads gradients (a function whose name says clip, norm
    or grad), inserts ``scaler.unscale_(opt)`` once before that statement.

    Why is this bad?
    apex unscaled the gradients when ``scale_loss`` exited; GradScaler keeps them scaled until
    ``unscale_`` or ``step``, so clipping without ``unscale_`` clips scaled gradients.

    Fix safety:
    Safe under O1 (the master parameters are the model's parameters). Unsafe under O2/O3, where
    apex's master parameters were fp32 copies, and where the gradients are read inside a compound
    statement. Applied together with AMP002, AMP003 and AMP005.

    Options:
    None.
    """

    CODE = "AMP004"
    FIX = 'amp.master_params(opt) -> the parameters the optimizer holds'
    MESSAGE = "`amp.master_params` is apex mixed precision"
    VALID = [
        Valid("def master_params(opt):\n    return []\n\nclip_grad_norm_(master_params(opt), 1.0)\n"),
    ]
    INVALID = [
        Invalid(
            """from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x in loader:
    loss = model(x)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    optimizer.step()
""",
            """import torch

scaler = torch.amp.GradScaler("cuda")
for x in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(
        (p for group in optimizer.param_groups for p in group["params"]),
        1.0,
    )
    scaler.step(optimizer)
    scaler.update()
""",
        ),
        Invalid(
            """from apex import amp

def clip(optimizer):
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
"""
        ),
        Invalid(
            """import torch
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, min_scale):
        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1", min_loss_scale=min_scale)

    def step(self, x):
        loss = self.model(x)
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_value_(amp.master_params(self.optimizer), 0.5)
        self.optimizer.step()
""",
            """import torch


class Trainer:
    def __init__(self, model, optimizer, min_scale):
        # TODO(ampmigrate): review, this rewrite is unsafe: `min_loss_scale=min_scale`
        #   is known only at run time: GradScaler's scale, with no floor of its own, may
        #   halve below it
        self.scaler = torch.amp.GradScaler("cuda")
        self.model, self.optimizer = model, optimizer

    def step(self, x):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = self.model(x)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_value_(
            (p for group in self.optimizer.param_groups for p in group["params"]),
            0.5,
        )
        self.scaler.step(self.optimizer)
        self.scaler.update()
""",
            unsafe_fixes=True,
        ),
    ]
