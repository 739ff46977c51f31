"""apex's per-loss scalers (``num_losses=2``, ``amp.scale_loss(..., loss_id=k)``) where each
optimizer takes one loss id's gradients (a GAN): one GradScaler per loss id, a safe rewrite.

Generated over the ways a script spells it: where the loop lives (the script, a function, a
function handed the models by the one initializing, a trainer's method), how the loss id is given (keyword, position, left to its default), the
optimizer alone or in a list, which loss takes id 0, a clip through ``amp.master_params`` and
``num_losses`` above the ids used. Run, the rewrite trains as apex did, where the discriminator's
loss alone overflows once: apex halved that loss's scale only."""
from __future__ import annotations

import ast
import itertools

import pytest

from generated.small_scripts import compared, script_head
from migrate.api import migrate_source

HOLDERS = ("script", "function", "handed", "method")
SPELLINGS = ("keyword", "positional", "default")
ORDERS = ("D first", "G first")

PRELUDE = script_head() + "real = torch.randn(64, 8, device=device) * 0.5 + 1.0\n"

MODELS = """\
netG = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).to(device)
netD = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
optG = torch.optim.SGD(netG.parameters(), lr=0.05)
optD = torch.optim.SGD(netD.parameters(), lr=0.05)
"""

STEP = """\
noise = torch.randn(16, 8, device=device)
start = (step * 16) % 64
lossD = F.softplus(-{p}netD(real[start:start + 16])).mean() + F.softplus({p}netD({p}netG(noise).detach())).mean()
if step == 5:
    lossD = lossD * float("inf")  # the discriminator's loss alone overflows, once
{p}optD.zero_grad()
with amp.scale_loss(lossD, {d_args}) as scaled_d:
    scaled_d.backward()
{p}optD.step()
lossG = F.softplus(-{p}netD({p}netG(noise))).mean()
{p}optG.zero_grad()
with amp.scale_loss(lossG, {g_args}) as scaled_g:
    scaled_g.backward()
{clip}{p}optG.step()
"""


def _indent(text: str, depth: int) -> str:
    return "".join(" " * depth + line if line.strip() else line for line in text.splitlines(keepends=True))


def _comments(source: str) -> str:
    """The file's comments as one text: a marker's reason is wrapped over lines."""
    return " ".join(line.split("#", 1)[1].strip() for line in source.splitlines() if "#" in line)


def _ids(order: str) -> tuple[int, int]:
    return (0, 1) if order == "D first" else (1, 0)


def _scale_args(optimizer: str, loss_id: int, spelling: str, listed: bool) -> str:
    given = f"[{optimizer}]" if listed else optimizer
    if spelling == "default" and loss_id == 0:
        return given
    return f"{given}, {loss_id}" if spelling == "positional" else f"{given}, loss_id={loss_id}"


def _script(holder: str, spelling: str, listed: bool, order: str, clip: bool, num_losses: int = 2) -> str:
    p = "self." if holder == "method" else ""
    d_id, g_id = _ids(order)
    nets = f"[{p}netD, {p}netG], [{p}optD, {p}optG]"
    given = "[netD, netG], [optD, optG]"
    initialize = f'{nets} = amp.initialize({given}, opt_level="O1", num_losses={num_losses})\n'
    step = STEP.format(p=p, d_args=_scale_args(f"{p}optD", d_id, spelling, listed),
                       g_args=_scale_args(f"{p}optG", g_id, spelling, listed),
                       clip=f"torch.nn.utils.clip_grad_norm_(amp.master_params({p}optG), 1.0)\n" if clip else "")
    loop = "for step in range(args.steps):\n" + _indent(step, 4)
    if holder == "script":
        return PRELUDE + MODELS + initialize + loop
    if holder == "function":
        return PRELUDE + "\n\ndef main():\n" + _indent(MODELS + initialize + loop, 4) + "\n\nmain()\n"
    if holder == "handed":  # `main` initializes, `train` is handed the models and optimizers
        train = "def train(netD, netG, optD, optG):\n" + _indent(loop, 4)
        main = "def main():\n" + _indent(MODELS + initialize + "train(netD, netG, optD, optG)\n", 4)
        return PRELUDE + "\n\n" + train + "\n\n" + main + "\n\nmain()\n"
    trainer = (
        "class GanTrainer:\n"
        "    def __init__(self, netD, netG, optD, optG):\n"
        + _indent(initialize, 8)
        + "\n    def train(self):\n"
        + _indent(loop, 8)
    )
    return PRELUDE + "\n\n" + trainer + "\n\n" + MODELS + "GanTrainer(netD, netG, optD, optG).train()\n"


VARIANTS = list(itertools.product(HOLDERS, SPELLINGS, (False, True), ORDERS, (False, True)))


@pytest.mark.parametrize(("holder", "spelling", "listed", "order", "clip"), VARIANTS)
def test_each_loss_id_gets_its_own_grad_scaler_in_the_safe_run(holder, spelling, listed, order, clip):
    source = _script(holder, spelling, listed, order, clip)
    result = migrate_source(source, filename="train.py")
    fixed = result.new_source
    assert fixed != source and "apex" not in fixed and "TODO(ampmigrate)" not in fixed, fixed
    ast.parse(fixed)
    p = "self." if holder == "method" else ""
    d_scaler, g_scaler = (f"{p}scaler_{loss_id}" for loss_id in _ids(order))
    lines = [line.strip() for line in fixed.splitlines()]
    for scaler, loss, optimizer in ((d_scaler, "lossD", "optD"), (g_scaler, "lossG", "optG")):
        assert lines.count(f'{scaler} = torch.amp.GradScaler("cuda")') == 1, fixed
        at = lines.index(f"{scaler}.scale({loss}).backward()")
        after = lines[at:]
        assert after.index(f"{scaler}.step({p}{optimizer})") < after.index(f"{scaler}.update()"), fixed
    assert lines.count(f"{g_scaler}.unscale_({p}optG)") == (1 if clip else 0), fixed
    again = migrate_source(fixed, filename="train.py")
    assert again.new_source == fixed and not [d for d in again.diagnostics if d.code.startswith("AMP0")], again.diagnostics


@pytest.mark.parametrize("num_losses", [1, 3])
def test_num_losses_above_the_ids_used_or_one_id_used(num_losses):
    # `num_losses=3` with ids 0 and 1 used: two scalers; ids all 0: apex's one scaler, no suffix
    source = _script("script", "keyword", False, "D first", False, num_losses=3)
    if num_losses == 1:
        source = source.replace(", loss_id=1", "").replace("num_losses=3", "num_losses=2")
    fixed = migrate_source(source, filename="train.py").new_source
    assert "TODO(ampmigrate)" not in fixed and fixed != source, fixed
    if num_losses == 1:
        assert "scaler_0" not in fixed and fixed.count('scaler = torch.amp.GradScaler("cuda")') == 1, fixed
    else:
        assert "scaler_0.scale(lossD)" in fixed and "scaler_1.scale(lossG)" in fixed and "scaler_2" not in fixed, fixed


STILL_MERGED = {
    # two loss ids into one optimizer's gradients, at two scales: no GradScaler unscales that
    "one optimizer, two ids": [("with amp.scale_loss(lossG, optG, loss_id=1)", "with amp.scale_loss(lossG, [optG, optD], loss_id=1)")],
    "a computed loss id": [("with amp.scale_loss(lossG, optG, loss_id=1)", "with amp.scale_loss(lossG, optG, loss_id=step % 2)")],
    "apex's state saved": [("    optG.step()\n", "    optG.step()\n    torch.save(amp.state_dict(), 'amp.pt')\n")],
    "the name is taken": [('device = "cuda"\n', 'device = "cuda"\nscaler_1 = None\n')],
    # one line steps both optimizers: it cannot go through two scalers
    "one step line for both": [("    optD.step()\n", ""), ("    optG.step()\n", "    optD.step(); optG.step()\n")],
}


@pytest.mark.parametrize("case", sorted(STILL_MERGED))
def test_where_one_grad_scaler_per_loss_cannot_do_it_one_serves_all_unsafely(case):
    source = _script("script", "keyword", False, "D first", False)
    for old, new in STILL_MERGED[case]:
        assert old in source
        source = source.replace(old, new, 1)
    assert migrate_source(source, filename="train.py").new_source == source
    fixed = migrate_source(source, filename="train.py", unsafe_fixes=True).new_source
    assert "one GradScaler serves every loss" in _comments(fixed) and "scaler_0" not in fixed, fixed


@pytest.mark.slow
@pytest.mark.parametrize(("holder", "spelling", "listed", "order", "clip"), [
    ("script", "keyword", False, "D first", False),
    ("handed", "default", False, "D first", True),
    ("method", "positional", True, "G first", True),
])
def test_the_rewrite_trains_as_apex_did_and_one_scaler_would_not(holder, spelling, listed, order, clip, tmp_path, monkeypatch):
    from ampshim.compare import SAME
    from ampshim.compare.report import as_text
    from migrate.apex_plan import planner

    source = _script(holder, spelling, listed, order, clip)
    with monkeypatch.context() as patched:  # the rewrite before: one GradScaler for both losses
        patched.setattr(planner, "scalers_per_loss", lambda *_: None)
        merged = migrate_source(source, filename="train.py", unsafe_fixes=True).new_source
    assert "one GradScaler serves every loss" in _comments(merged)
    kept = compared(tmp_path, source, migrate_source(source, filename="train.py").new_source, "rewritten")
    assert kept.verdict == SAME, as_text(kept)
    one = compared(tmp_path, source, merged, "merged")
    assert one.verdict != SAME, as_text(one)


TRAINER_SAVING = """\
import torch
from apex import amp


class Trainer:
    def __init__(self, netD, netG, optD, optG):
        [self.netD, self.netG], [self.optD, self.optG] = amp.initialize([netD, netG], [optD, optG], opt_level="O1", num_losses=2)

    def step(self, real, noise):
        lossD = self.netD(real).mean() - self.netD(self.netG(noise).detach()).mean()
        self.optD.zero_grad()
        with amp.scale_loss(lossD, self.optD, loss_id=0) as scaled:
            scaled.backward()
        self.optD.step()
        lossG = -self.netD(self.netG(noise)).mean()
        self.optG.zero_grad()
        with amp.scale_loss(lossG, self.optG, loss_id=1) as scaled:
            scaled.backward()
        self.optG.step()

    def save(self, path):
{saves}"""


def test_each_checkpoint_saves_the_scaler_that_steps_its_optimizer():
    saves = ('        torch.save({"g_model": self.netG.state_dict(), "g_opt": self.optG.state_dict()}, path + "_g.pt")\n'
             '        torch.save({"d_model": self.netD.state_dict(), "d_opt": self.optD.state_dict()}, path + "_d.pt")\n')
    fixed = migrate_source(TRAINER_SAVING.format(saves=saves), filename="train.py").new_source
    save = fixed[fixed.index("    def save"):]
    assert save.index('"g_opt"') < save.index('"scaler": self.scaler_1.state_dict()') < save.index('"d_opt"'), save
    assert save.index('"d_opt"') < save.index('"scaler": self.scaler_0.state_dict()'), save


def test_a_checkpoint_of_both_optimizers_is_left_to_the_user():
    # two scalers, one dict: which goes under "scaler" is the user's to say (AMP107 reports it)
    saves = ('        torch.save({"g": self.netG.state_dict(), "opts": [self.optD.state_dict(), self.optG.state_dict()],\n'
             '                    "g_opt": self.optG.state_dict(), "d_opt": self.optD.state_dict()}, path)\n')
    result = migrate_source(TRAINER_SAVING.format(saves=saves), filename="train.py")
    assert "scaler_0" in result.new_source and ".state_dict()}, path)" in result.new_source
    again = migrate_source(result.new_source, filename="train.py")
    assert again.new_source == result.new_source and [d.code for d in again.diagnostics] == ["AMP107"], again.diagnostics
