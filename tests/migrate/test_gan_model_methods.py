"""A GAN model class whose training method calls its steps by name: ``forward()`` sets
``self.fake = self.gen(self.real)``, a helper turns the discriminator's ``requires_grad`` off and on
(``set_requires_grad(nets, flag)``, ``toggle_grad(net, flag)``, from another file), and
``backward_g()``/``backward_d()`` each scale their loss, the steps after them.

- Turning ``requires_grad`` on or off reads no gradient: no ``unscale_`` goes before it (one went
  before the discriminator's own backward pass, and the next ``scaler.step`` raised).
- The losses are computed from ``self.fake``, which ``forward()`` makes outside the regions at the
  scaled backward passes: apex O1 cast that pass, so the rewrite is unsafe and says so. Where the
  method scaling the loss calls ``forward()`` itself, its region covers it.
"""
from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from migrate.api import migrate_source

SCRIPT = '''\
import torch
import torch.nn as nn
from apex import amp
{imports}


class GANModel({base}):
    def __init__(self):
        super().__init__()
        self.gen = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4)).cuda()
        self.disc = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).cuda()
        self.opt_g = torch.optim.SGD(self.gen.parameters(), lr=0.05)
        self.opt_d = torch.optim.SGD(self.disc.parameters(), lr=0.05)
        [self.gen, self.disc], [self.opt_g, self.opt_d] = amp.initialize(
            [self.gen, self.disc], [self.opt_g, self.opt_d], opt_level="O1", num_losses=2, verbosity=0)

    def {forward}(self):
        self.{fake} = self.gen(self.real)

    def backward_d(self):
        pred_fake = self.disc(self.{fake}.detach())
        self.loss_d = pred_fake.pow(2).mean() + (self.disc(self.real) - 1).pow(2).mean()
        with amp.scale_loss(self.loss_d, self.opt_d, loss_id=0) as scaled:
            scaled.backward()

    def backward_g(self):
{g_forward}        self.loss_g = (self.disc(self.{fake}) - 1).pow(2).mean()
        with amp.scale_loss(self.loss_g, self.opt_g, loss_id=1) as scaled:
            scaled.backward()

    def optimize(self, real):
        self.real = real
{forward_call}        {toggle}(self.disc, False)
        self.opt_g.zero_grad()
        self.backward_g()
        self.opt_g.step()
        {toggle}(self.disc, True)
        self.opt_d.zero_grad()
        self.backward_d()
        self.opt_d.step()
'''
# how the discriminator's requires_grad is turned, and where that helper comes from
TOGGLES = {
    "base_method": ("from models.base import BaseModel", "BaseModel", "self.set_requires_grad"),
    "imported": ("from utils import toggle_grad", "object", "toggle_grad"),
    "module": ("import utils", "object", "utils.set_requires_grad"),
    "own_function": ("\n\ndef requires_grad(net, flag):\n    for p in net.parameters():\n        p.requires_grad = flag",
                     "object", "requires_grad"),
}
NAMES = {"forward": ("forward", "fake"), "run": ("run_generator", "fake_b")}


def _script(toggle: str, names: str, forward_in: str) -> str:
    imports, base, call = TOGGLES[toggle]
    forward, fake = NAMES[names]
    in_backward = forward_in == "backward_g"
    return SCRIPT.format(imports=imports, base=base, toggle=call, forward=forward, fake=fake,
                         g_forward=f"        self.{forward}()\n" if in_backward else "",
                         forward_call="" if in_backward else f"        self.{forward}()\n")


@pytest.mark.parametrize("toggle, names", list(itertools.product(TOGGLES, NAMES)))
def test_turning_requires_grad_reads_no_gradient(toggle, names):
    result = migrate_source(_script(toggle, names, "optimize"), filename="models/gan.py", unsafe_fixes=True)
    assert result.changed, [d.message for d in result.diagnostics]
    assert "unscale_" not in result.new_source, result.new_source


@pytest.mark.parametrize("toggle, names", list(itertools.product(TOGGLES, NAMES)))
def test_a_forward_pass_in_another_method_makes_the_rewrite_unsafe_and_says_so(toggle, names):
    source = _script(toggle, names, "optimize")
    assert not migrate_source(source, filename="models/gan.py").changed
    result = migrate_source(source, filename="models/gan.py", unsafe_fixes=True)
    forward, fake = NAMES[names]
    assert f"`self.{fake}`, which `{forward}()` computes by a forward pass outside autocast" in result.new_source.replace(
        "\n        #   ", " "), result.new_source


@pytest.mark.parametrize("names", list(NAMES))
def test_a_forward_pass_the_scaling_method_calls_is_in_its_region(names):
    result = migrate_source(_script("own_function", names, "backward_g"), filename="models/gan.py", unsafe_fixes=True)
    assert "outside autocast" not in result.new_source, result.new_source


MAIN = '''

if __name__ == "__main__":
    torch.manual_seed(0)
    model = GANModel()
    data = [torch.randn(16, 4, device="cuda") for _ in range(4)] * 6
    for real in data:
        model.optimize(real)
'''


@pytest.mark.slow
def test_the_unsafe_rewrite_of_the_gan_model_runs(tmp_path):
    """It ran into ``scaler.step``'s "No inf checks were recorded" where an ``unscale_`` went before
    the discriminator's backward pass."""
    source = _script("imported", "forward", "optimize") + MAIN
    (tmp_path / "utils.py").write_text("def toggle_grad(net, flag):\n    for p in net.parameters():\n        p.requires_grad_(flag)\n")
    (tmp_path / "rewritten.py").write_text(migrate_source(source, filename="train.py", unsafe_fixes=True).new_source)
    run = subprocess.run([sys.executable, "-m", "ampshim", "--device", "cpu", str(tmp_path / "rewritten.py")],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]


# the test around each scaled backward and its plain arm, as written, and whether the rewrite
# folds the two arms once both go through the scaler (a test that may change, or a comment, stays)
ARMS = {"flag": ("if self.use_apex:", "", True), "negated": ("if not self.fp32:", "", True),
        "commented": ("if self.use_apex:  # mixed precision", "", False),
        "called": ("if random.random() < 2:", "import random\n", False)}


@pytest.mark.parametrize("toggle, arms", list(itertools.product(TOGGLES, ARMS)))
def test_a_plain_backward_beside_a_scaled_one_takes_that_losss_scaler(toggle, arms):
    """``if self.use_apex: with amp.scale_loss(self.loss_g, self.opt_g, loss_id=1) ... else:
    self.loss_g.backward()``: the plain arm goes through the scaler of loss id 1, which steps
    ``opt_g``, not through the first loss's; the two arms, then alike, are one line."""
    test, imports, folded = ARMS[arms]
    source = imports + _script(toggle, "forward", "backward_g")
    for loss, scaled in (("loss_d", "opt_d, loss_id=0"), ("loss_g", "opt_g, loss_id=1")):
        source = source.replace(
            f"        with amp.scale_loss(self.{loss}, self.{scaled}) as scaled:\n            scaled.backward()\n",
            f"        {test}\n            with amp.scale_loss(self.{loss}, self.{scaled}) as scaled:\n"
            f"                scaled.backward()\n        else:\n            self.{loss}.backward()\n")
    source = source.replace("        super().__init__()\n", "        super().__init__()\n        self.use_apex = True\n        self.fp32 = False\n")
    rewritten = migrate_source(source, filename="models/gan.py", unsafe_fixes=True).new_source
    for loss, scaler in (("loss_d", "scaler_0"), ("loss_g", "scaler_1")):
        assert rewritten.count(f"self.{scaler}.scale(self.{loss}).backward()") == (1 if folded else 2), rewritten
    assert (test in rewritten) != folded, rewritten
    compile(rewritten, "gan.py", "exec")


WRAPPED = '''\
import torch
import torch.nn as nn
from apex import amp


class Trainer:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")
        self.model = {wrapped}
        self.head = {head}

    def loss(self, batch, model):
        x, y = batch
        return nn.functional.mse_loss(model(x), y)

    def train(self, batches):
        for batch in batches:
            loss = self.loss(batch, {handed})
            self.optimizer.zero_grad()
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
            self.optimizer.step()
'''


@pytest.mark.parametrize("wrapped", ["nn.DataParallel(self.model)", "self.model.cuda()", "self.model.to('cuda')"])
@pytest.mark.parametrize("handed", ["self.model", "self.head"])
def test_a_model_kept_on_self_and_handed_to_the_loss_is_no_forward_output(wrapped, handed):
    """``self.model = nn.DataParallel(self.model)`` in ``__init__``, the loss computed from the
    model handed in: no forward pass ran in ``__init__``, the safe rewrite goes ahead."""
    source = WRAPPED.format(wrapped=wrapped, head="self.model" if handed == "self.head" else "None", handed=handed)
    result = migrate_source(source, filename="trainer.py")
    assert result.changed and "outside autocast" not in result.new_source, [d.message for d in result.diagnostics]
