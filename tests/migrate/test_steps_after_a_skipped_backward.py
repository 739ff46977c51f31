"""The scaler's steps and updates where a discriminator's backward pass may be skipped.

A GAN trainer's ``optimize`` steps the generator, then calls ``backward_d``, whose scaled backward
runs only where a test holds (a threshold on the losses: vkinakh/Hubble-meets-Webb), then steps
the discriminator. apex stepped it whatever it held. Natively ``scaler.step`` raises where nothing
was scaled for the optimizer ("No inf checks were recorded"), so that step asks whether the
optimizer holds gradients. The update must then still run once after every step through the
scaler: with one scaler for both (the generator's backward plain, scaled by the rewrite, or
apex's per-loss scalers merged), a skipped discriminator left the generator's step without its
update, and the next ``scaler.step`` raised ("step() has already been called since the last update()").
"""
from __future__ import annotations

import ast
import itertools
import subprocess
import sys

import pytest

from migrate.api import migrate_source

HEAD = """import argparse
import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--threshold", type=float, default=0.0)
args = parser.parse_args()


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.net_g = torch.nn.Linear(4, 4)
        self.net_d = torch.nn.Linear(4, 1)
        self.opt_g = torch.optim.SGD(self.net_g.parameters(), lr=0.1)
        self.opt_d = torch.optim.SGD(self.net_d.parameters(), lr=0.1)
        [self.net_g, self.net_d], [self.opt_g, self.opt_d] = amp.initialize(
            [self.net_g, self.net_d], [self.opt_g, self.opt_d], opt_level="O1"{losses})

    def backward_g(self, x):
        self.fake = self.net_g(x)
        loss_g = -self.net_d(self.fake).mean()
{g_backward}
        return loss_g

    def backward_d(self, real):
        loss_real = -self.net_d(real).mean()
        loss_fake = self.net_d(self.fake.detach()).mean()
{d_backward}
        return loss_real + loss_fake

    def optimize(self, x):
        self.opt_g.zero_grad()
        loss_g = self.backward_g(x)
        self.opt_g.step()
        self.opt_d.zero_grad()
        loss_d = self.backward_d(x)
        self.opt_d.step()
        return loss_g.item(), loss_d.item()


trainer = Trainer()
for i in range(5):
    print("step", i, trainer.optimize(torch.randn(8, 4)))
"""
# the generator's backward pass: plain (one scaler: the rewrite scales it), its own scaled one,
# or apex's per-loss scalers merged into one (two loss ids step the discriminator)
G_BACKWARDS = {
    "plain": ("", "loss_g.backward()"),
    "scaled": ("", "with amp.scale_loss(loss_g, self.opt_g) as scaled:\n    scaled.backward()"),
    "merged": (", num_losses=3", "with amp.scale_loss(loss_g, self.opt_g, loss_id=0) as scaled:\n    scaled.backward()"),
}
# how the discriminator's pass is skipped
SKIPS = {
    "test_around": "if (loss_real + loss_fake).item() >= args.threshold:\n{scaled}",
    "early_return": "if (loss_real + loss_fake).item() < args.threshold:\n    return loss_real + loss_fake\n{scaled_flat}",
    "flag_and_test": ("if (loss_real + loss_fake).item() >= args.threshold:\n"
                      "    if args.threshold < 1e9:\n{scaled_deeper}    else:\n        (loss_real + loss_fake).backward()"),
}


def _scaled_d(merged: bool) -> str:
    ids = (", loss_id=1", ", loss_id=2") if merged else ("", "")
    return (f"with amp.scale_loss(loss_real, self.opt_d{ids[0]}) as scaled:\n    scaled.backward()\n"
            f"with amp.scale_loss(loss_fake, self.opt_d{ids[1]}) as scaled:\n    scaled.backward()\n")


def _indent(text: str, by: int) -> str:
    return "".join(" " * by + line + "\n" for line in text.splitlines())


def _script(g_backward: str, skip: str) -> str:
    losses, g_text = G_BACKWARDS[g_backward]
    scaled = _scaled_d(g_backward == "merged")
    d_text = SKIPS[skip].format(scaled=_indent(scaled, 4), scaled_flat=scaled, scaled_deeper=_indent(scaled, 8))
    return HEAD.format(losses=losses, g_backward=_indent(g_text, 8).rstrip("\n"), d_backward=_indent(d_text, 8).rstrip("\n"))


CASES = list(itertools.product(sorted(G_BACKWARDS), sorted(SKIPS)))


def _is_call(statement: ast.stmt, method: str) -> bool:
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
            and isinstance(statement.value.func, ast.Attribute) and statement.value.func.attr == method
            and "scaler" in ast.unparse(statement.value.func.value))


def _stepped_after(body: list[ast.stmt], paths: set[frozenset]) -> set[frozenset]:
    """On each path from ``paths``, the optimizers stepped through the scaler and waiting for its
    update after ``body``. Stepping one again before an update, or an update with nothing
    stepped, fails the test: both raise in GradScaler."""
    for statement in body:
        if _is_call(statement, "step"):
            optimizer = ast.unparse(statement.value.args[0])
            assert not any(optimizer in path for path in paths), f"stepped again before an update: {optimizer}"
            paths = {path | {optimizer} for path in paths}
        elif _is_call(statement, "update"):
            assert all(paths), f"an update where nothing may have stepped: {ast.unparse(statement)}"
            paths = {frozenset()}
        elif isinstance(statement, ast.If):
            paths = _stepped_after(statement.body, paths) | _stepped_after(statement.orelse, paths)
    return paths


@pytest.mark.parametrize(("g_backward", "skip"), CASES)
def test_each_step_through_the_scaler_is_updated_on_every_path(g_backward, skip):
    source = _script(g_backward, skip)
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py", unsafe_fixes=True).new_source
    assert "with amp.scale_loss(" not in new, new
    optimize = next(node for node in ast.walk(ast.parse(new)) if isinstance(node, ast.FunctionDef) and node.name == "optimize")
    assert _stepped_after(optimize.body, {frozenset()}) == {frozenset()}, new  # each iteration ends updated
    d_step = next(node for node in ast.walk(optimize) if isinstance(node, ast.If) and "self.opt_d.param_groups" in ast.unparse(node.test))
    assert ast.unparse(d_step.orelse[0]) == "self.opt_d.step()", new


@pytest.mark.slow
@pytest.mark.parametrize(("g_backward", "skip"), [("plain", "test_around"), ("merged", "early_return"), ("scaled", "flag_and_test")])
def test_the_rewrite_runs_where_every_pass_is_skipped(g_backward, skip, tmp_path):
    """On the CPU (ampshim maps CUDA's float16 to bfloat16): the unsafe rewrite runs five steps
    with the discriminator's pass skipped each time (threshold 100) and taken each time (-100)."""
    script = tmp_path / "train.py"
    script.write_text(migrate_source(_script(g_backward, skip), "train.py", unsafe_fixes=True).new_source)
    for threshold in ("100", "-100"):
        run = subprocess.run([sys.executable, "-m", "ampshim", "--device", "cpu", str(script), "--threshold", threshold],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and run.stdout.count("step ") == 5, run.stderr[-2000:]
