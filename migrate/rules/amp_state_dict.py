"""AMP005: ``amp.state_dict()`` / ``amp.load_state_dict(x)`` -> the GradScaler's, old checkpoints included."""
from __future__ import annotations

from migrate.apex_plan import HELPER_SOURCE
from migrate.rule import Invalid, Valid
from migrate.rules._apex_planned import PlannedApexRule


class AmpStateDict(PlannedApexRule):
    """What it does:
    Replaces ``amp.state_dict()`` with ``scaler.state_dict()`` and ``amp.load_state_dict(x)`` with
    ``scaler.load_state_dict(_scaler_state_from_apex(x, scaler))``, adding that small helper once
    after the imports: it turns apex's ``{"loss_scaler0": {"loss_scale": ..., "unskipped": ...}}``
    into GradScaler's state (the saved scale and count; growth and backoff stay the scaler's own,
    so a static scale stays static) and passes native state through, so checkpoints written
    before and after the migration both load.

    Why is this bad?
    apex's loss-scaler state no longer exists once ``amp.initialize`` is gone; resuming would
    restart the loss scale at 2**16 and fail on old checkpoints.

    Fix safety:
    Safe with the rest of the file's rewrite; it shares their safety. ``amp.state_dict(destination)``
    and O0 (no scaler) are reported. Applied together with AMP002-AMP004.

    Options:
    None.
    """

    CODE = "AMP005"
    FIX = "amp.state_dict / load_state_dict -> the GradScaler's"
    MESSAGE = "`amp.state_dict` is apex's loss-scaler state"
    VALID = [
        Valid("import torch\ncheckpoint = {'model': model.state_dict(), 'scaler': scaler.state_dict()}\n"),
    ]
    INVALID = [
        Invalid(
            """from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
amp.load_state_dict(checkpoint["amp"])
for x in loader:
    loss = model(x)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
save({"model": model.state_dict(), "amp": amp.state_dict()}, f"{out}/last.pt")
""",
            "import torch\n"
            + HELPER_SOURCE
            + """

scaler = torch.amp.GradScaler("cuda")
scaler.load_state_dict(_scaler_state_from_apex(checkpoint["amp"], scaler))
for x in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
save({"model": model.state_dict(), "amp": scaler.state_dict()}, f"{out}/last.pt")
""",
        ),
        Invalid(
            """from apex import amp

def save(path):
    torch.save({"amp": amp.state_dict()}, path)
"""
        ),
        Invalid(
            """import torch
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1", loss_scale="dynamic", min_loss_scale=args.min_scale)
step = 0
while step < total_steps:
    loss = model(next(batches))
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    step += 1
checkpoint = {"step": step, "amp": amp.state_dict()}
""",
            """import torch

# TODO(ampmigrate): review, this rewrite is unsafe: `min_loss_scale=args.min_scale` is
#   known only at run time: GradScaler's scale, with no floor of its own, may halve
#   below it
scaler = torch.amp.GradScaler("cuda")
step = 0
while step < total_steps:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(next(batches))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    step += 1
checkpoint = {"step": step, "amp": scaler.state_dict()}
""",
            unsafe_fixes=True,
        ),
    ]
