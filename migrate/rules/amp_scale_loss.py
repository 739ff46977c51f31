"""AMP003: ``with amp.scale_loss(loss, opt) as s: s.backward()`` -> ``scaler.scale(loss).backward()``."""
from __future__ import annotations

from migrate.rule import Invalid, Valid
from migrate.rules._apex_planned import PlannedApexRule


class AmpScaleLoss(PlannedApexRule):
    """What it does:
    Replaces ``with amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward(...)``
    with ``scaler.scale(loss).backward(...)``, and the ``optimizer.step()`` that follows it (in the
    same block, or at the accumulation boundary after it) with ``scaler.step(optimizer)`` and
    ``scaler.update()``. A list of optimizers steps each through the scaler. A body that does more
    than ``backward()`` becomes ``scaled_loss = scaler.scale(loss)`` followed by the body. When the
    scaled backward runs only under ``if flag:`` (or an ``elif``/``else``) and the step runs on
    every path, the step becomes ``if flag: scaler.step(opt); scaler.update()`` /
    ``else: opt.step()`` with the branch's whole condition, unless the scaler is already off
    exactly when the flag is.

    Why is this bad?
    ``amp.scale_loss`` is apex's loss scaling, removed from apex; GradScaler is the native one.

    Fix safety:
    Safe for one loss with a body that does anything (apex only unscaled when the body ended),
    for ``delay_unscale`` accumulation (the scale is constant until the boundary, where the
    scaler unscales, checks for overflow and steps, as apex did), and for a step found elsewhere
    in the file when no backward pass of the file skips the scaler while it is on. Gradients read
    between the scaled backward and the step (clipping ``model.parameters()``, a gradient norm,
    ``p.grad``) were unscaled under apex: ``scaler.unscale_(optimizer)`` goes before the first
    read, in each branch that reads. Safe with ``loss_id`` where each optimizer is scaled for one
    loss id (a GAN's ``optD`` and ``optG``): one GradScaler per loss id, as apex kept one scaler per
    loss. Unsafe where an optimizer is scaled for two loss ids or the id is computed (one GradScaler
    serves every loss and is updated after the last step of each block of optimizer steps),
    ``delay_overflow_check``, gradients read where the step
    may not follow (apex unscaled them at every micro-batch), an unscaled backward pass with the
    step elsewhere, or no ``amp.initialize`` in the file (see AMP002) unless the run also holds the
    file that initializes, paired through their imports (then the GradScaler is made here, at the
    top of the module, with that file's options). Reported without a fix when
    ``scale_loss`` is not a ``with`` (entered by hand, returned), when no ``optimizer.step()``
    follows, when the step takes a closure (GradScaler does not support them), or when the
    backward's condition calls something. Applied together with AMP002, AMP004 and AMP005.

    Options:
    None.
    """

    CODE = "AMP003"
    FIX = 'amp.scale_loss -> scaler.scale(loss).backward(), scaler.step, update'
    MESSAGE = "`amp.scale_loss` is apex mixed precision"
    VALID = [
        Valid("def scale_loss(loss, optimizer):\n    return loss\n\nscale_loss(loss, optimizer).backward()\n"),
        Valid("from torch.cuda import amp\nscaler = amp.GradScaler()\nscaler.scale(loss).backward()\n"),
    ]
    INVALID = [
        Invalid(
            """from apex import amp

model, opt = amp.initialize(model, opt)
for batch in loader:
    loss = model(batch)
    with amp.scale_loss(loss, opt) as scaled_loss: scaled_loss.backward()
    opt.step(); opt.zero_grad()
""",
            """import torch

scaler = torch.amp.GradScaler("cuda")
for batch in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(batch)
    scaler.scale(loss).backward()
    scaler.step(opt); scaler.update(); opt.zero_grad()
""",
        ),
        Invalid(
            """from apex import amp

model, opt = amp.initialize(model, opt, opt_level="O1")
for i, batch in enumerate(loader):
    loss = model(batch) / accumulation
    with amp.scale_loss(loss, opt, delay_unscale=(i + 1) % accumulation != 0) as scaled_loss:
        scaled_loss.backward()
    if (i + 1) % accumulation == 0:
        opt.step()
        opt.zero_grad()
""",
            """import torch

scaler = torch.amp.GradScaler("cuda")
for i, batch in enumerate(loader):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(batch) / accumulation
    scaler.scale(loss).backward()
    if (i + 1) % accumulation == 0:
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
""",
        ),
        Invalid(
            """from apex import amp

def backward(loss, optimizer):
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
"""
        ),
        Invalid(
            """from apex import amp

model, opt = amp.initialize(model, opt, opt_level="O1", num_losses=2)
for batch in loader:
    loss_a, loss_b = model(batch)
    with amp.scale_loss(loss_a, opt, loss_id=0) as scaled_loss:
        scaled_loss.backward()
    with amp.scale_loss(loss_b, opt, loss_id=1) as scaled_loss:
        scaled_loss.backward()
    opt.step()
""",
            """import torch

# TODO(ampmigrate): review, this rewrite is unsafe: one GradScaler serves every loss
#   (apex keeps one scaler per loss), updated after the last step of each block of
#   optimizer steps
scaler = torch.amp.GradScaler("cuda")
for batch in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss_a, loss_b = model(batch)
    scaler.scale(loss_a).backward()
    scaler.scale(loss_b).backward()
    scaler.step(opt)
    scaler.update()
""",
            unsafe_fixes=True,
        ),
        Invalid(
            """from apex import amp

[netD, netG], [optD, optG] = amp.initialize([netD, netG], [optD, optG], opt_level="O1", num_losses=2)
for real, noise in loader:
    lossD = netD(real).mean() - netD(netG(noise).detach()).mean()
    optD.zero_grad()
    with amp.scale_loss(lossD, optD, loss_id=0) as scaled_loss:
        scaled_loss.backward()
    optD.step()
    lossG = -netD(netG(noise)).mean()
    optG.zero_grad()
    with amp.scale_loss(lossG, optG, loss_id=1) as scaled_loss:
        scaled_loss.backward()
    optG.step()
""",
            """import torch

scaler_0 = torch.amp.GradScaler("cuda")
scaler_1 = torch.amp.GradScaler("cuda")
for real, noise in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        lossD = netD(real).mean() - netD(netG(noise).detach()).mean()
    optD.zero_grad()
    scaler_0.scale(lossD).backward()
    scaler_0.step(optD)
    scaler_0.update()
    with torch.autocast("cuda", dtype=torch.float16):
        lossG = -netD(netG(noise)).mean()
    optG.zero_grad()
    scaler_1.scale(lossG).backward()
    scaler_1.step(optG)
    scaler_1.update()
""",
        ),
    ]
