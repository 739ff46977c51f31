"""A GAN model class whose training method calls its steps by name: ``forward()`` sets
``self.fake = self.gen(self.real)``, a helper turns the discriminator's ``requires_grad`` off and on
(``set_requires_grad(nets, flag)``, ``toggle_grad(net, flag)``, from another file), and
``backward_g()``/``backward_d()`` each scale their loss, the steps after them.

- Turning ``requires_grad`` on or off reads no gradient: no ``unscale_`` goes before it (one went
  before the discriminator's own backward pass, and the next ``scaler.step`` raised).
- The losses are computed from ``self.fake``, which ``forward()`` makes outside the regions at the
  scaled backward passes: apex O1 cast that pass, so it goes under an autocast of its own, from the
  first model call to the last pass the losses read; where it cannot (in a base class, in an ``if``
  or a loop), the rewrite is unsafe and says so. Where the method scaling the loss calls
  ``forward()`` itself, its region covers it.
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
def test_a_forward_pass_in_another_method_goes_under_an_autocast_of_its_own(toggle, names):
    source = _script(toggle, names, "optimize")
    forward, fake = NAMES[names]
    for unsafe_fixes in (False, True):
        result = migrate_source(source, filename="models/gan.py", unsafe_fixes=unsafe_fixes)
        assert result.changed and "outside autocast" not in result.new_source, [d.message for d in result.diagnostics]
        assert f"    def {forward}(self):\n        with torch.autocast(" in result.new_source, result.new_source
        assert f"dtype=torch.float16):\n            self.{fake} = self.gen(self.real)\n" in result.new_source


# `forward()`'s body, by how its forward passes are laid out: what goes under autocast (the lines
# from the first model call to the last, whichever the losses read: each loss plans the same), or None where the rewrite stays
# unsafe and says so
FORWARD_BODIES = {
    "preamble": ("        real = self.real * 1.0\n        self.fake = self.gen(real)\n        self.steps = 1\n",
                 "        self.fake = self.gen(real)\n"),
    "cycle": ("        self.fake = self.gen(self.real)\n        self.rec = self.gen(self.fake)\n        self.count = 2\n",
              "        self.fake = self.gen(self.real)\n        self.rec = self.gen(self.fake)\n"),
    "between": ("        self.fake = self.gen(self.real)\n        noise = torch.randn_like(self.fake) * 0.0\n"
                "        self.rec = self.gen(self.fake + noise)\n",
                "        self.fake = self.gen(self.real)\n        noise = torch.randn_like(self.fake) * 0.0\n"
                "        self.rec = self.gen(self.fake + noise)\n"),
    "in_if": ("        if self.real is not None:\n            self.fake = self.gen(self.real)\n", None),
    "in_loop": ("        for _ in range(1):\n            self.fake = self.gen(self.real)\n", None),
    "helper_defined": ("        def run(t):\n            return self.gen(t)\n        self.fake = run(self.real)\n", None),
}


@pytest.mark.parametrize("body", list(FORWARD_BODIES))
@pytest.mark.parametrize("uses_rec", [False, True])
def test_which_forward_passes_go_under_autocast(body, uses_rec):
    lines, wrapped = FORWARD_BODIES[body]
    source = _script("own_function", "forward", "optimize").replace("        self.fake = self.gen(self.real)\n", lines)
    if uses_rec and "self.rec" in lines:
        source = source.replace("(self.disc(self.fake) - 1).pow(2).mean()", "(self.disc(self.fake) - 1).pow(2).mean() + (self.rec - self.real).abs().mean()")
    safe = migrate_source(source, filename="models/gan.py")
    unsafe = migrate_source(source, filename="models/gan.py", unsafe_fixes=True)
    if wrapped is None:
        assert not safe.changed, safe.new_source
        assert "which `forward()` computes by a forward pass outside autocast" in unsafe.new_source.replace("\n        #   ", " ")
        return
    assert safe.changed, [d.message for d in safe.diagnostics]
    region = "".join("    " + line + "\n" for line in wrapped.splitlines())
    assert f"dtype=torch.float16):\n{region}" in safe.new_source, safe.new_source
    assert safe.new_source.count("with torch.autocast(") == 3, safe.new_source  # forward(), backward_d(), backward_g()


def test_a_base_class_forward_keeps_the_rewrite_unsafe():
    """``forward()`` defined in a base class of the file: other subclasses may run it with no scaler."""
    source = _script("own_function", "forward", "optimize").replace(
        "class GANModel(object):", "class Base:\n    def forward(self):\n        self.fake = self.gen(self.real)\n\n\nclass GANModel(Base):").replace(
        "    def forward(self):\n        self.fake = self.gen(self.real)\n\n    def backward_d", "    def backward_d")
    assert not migrate_source(source, filename="models/gan.py").changed
    unsafe = migrate_source(source, filename="models/gan.py", unsafe_fixes=True).new_source
    assert "which `forward()` computes by a forward pass outside autocast" in unsafe.replace("\n        #   ", " "), unsafe


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


@pytest.mark.slow
@pytest.mark.parametrize("body", ["plain", "cycle"])
def test_the_safe_rewrite_of_the_gan_model_trains_as_apex_did(body, tmp_path):
    """``forward()`` under an autocast of its own: the same steps, losses and weights as apex O1
    (which cast that pass as it cast every other)."""
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    source = _script("own_function", "forward", "optimize") + MAIN
    if body == "cycle":
        source = source.replace("        self.fake = self.gen(self.real)\n", FORWARD_BODIES["cycle"][0]).replace(
            "(self.disc(self.fake) - 1).pow(2).mean()", "(self.disc(self.fake) - 1).pow(2).mean() + (self.rec - self.real).abs().mean()")
    rewritten = migrate_source(source, filename="train.py")
    assert rewritten.changed and "def forward(self):\n        with torch.autocast(" in rewritten.new_source, rewritten.new_source
    (tmp_path / "original.py").write_text(source)
    (tmp_path / "rewritten.py").write_text(rewritten.new_source)
    comparison = compare(Target(str(tmp_path / "original.py")), Target(str(tmp_path / "rewritten.py")), [],
                         device="cpu", steps=15, parallel=True, timeout=240)
    assert comparison.verdict == SAME, as_text(comparison)


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
