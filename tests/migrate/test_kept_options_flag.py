"""A pix2pix-style model: ``__init__(self, opt)`` initializes apex under ``if opt.apex:`` (inside
``if self.isTrain:``) and hands ``opt`` to ``BaseModel.__init__(self, opt)``; ``backward_D()``
scales the loss under ``if self.opt.apex:``, its plain backward in the ``else:``.

- ``self.opt.apex`` is the flag that held ``initialize`` where the class keeps ``opt`` as
  ``self.opt``: ``self.opt = opt`` in the file, or a base in another file of the project whose
  ``__init__`` keeps that parameter so (``migrate.base_bindings``). The plain arm then runs only
  where the scaler is off: a safe rewrite. A base that keeps something else, binds ``self.opt``
  again, or cannot be found, or a file setting the flag, keeps it unsafe.
- ``forward()`` (``self.fake = self.gen(self.real)``) runs at test time too, where ``if
  self.isTrain:`` made no scaler: its autocast asks whether the scaler exists.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from migrate import api

MODEL = '''\
import torch
import torch.nn as nn
from apex import amp
from base_model import BaseModel


class GANModel(BaseModel):
    def __init__(self, opt):
        BaseModel.__init__(self, opt)
{keep}        self.gen = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4)).cuda()
        self.disc = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).cuda()
        if {train_test}:
            self.opt_g = torch.optim.SGD(self.gen.parameters(), lr=0.05)
            self.opt_d = torch.optim.SGD(self.disc.parameters(), lr=0.05)
            if opt.apex:
                [self.gen, self.disc], [self.opt_g, self.opt_d] = amp.initialize(
                    [self.gen, self.disc], [self.opt_g, self.opt_d], opt_level="O1", num_losses=2, verbosity=0)

    def forward(self):
        self.fake = self.gen(self.real)

    def backward_d(self):
        self.loss_d = self.disc(self.fake.detach()).pow(2).mean() + (self.disc(self.real) - 1).pow(2).mean()
        if self.opt.apex:
            with amp.scale_loss(self.loss_d, self.opt_d, loss_id=0) as scaled:
                scaled.backward()
        else:
            self.loss_d.backward()

    def backward_g(self):
        self.loss_g = (self.disc(self.fake) - 1).pow(2).mean() + (self.fake - self.real).abs().mean()
        if self.opt.apex:
            with amp.scale_loss(self.loss_g, self.opt_g, loss_id=1) as scaled:
                scaled.backward()
        else:
            self.loss_g.backward()

    def optimize(self, real):
        self.real = real
        self.forward()
        self.opt_d.zero_grad()
        self.backward_d()
        self.opt_d.step()
        self.opt_g.zero_grad()
        self.backward_g()
        self.opt_g.step()

    def test(self, real):
        self.real = real
        with torch.no_grad():
            self.forward()
        return self.fake
'''
# how the base class keeps the options, by case: (its __init__'s lines, whether the rewrite is safe)
BASES = {
    "kept": ("        self.opt = opt\n        self.isTrain = opt.isTrain\n", True),
    "kept_second": ("        self.name = name\n        self.opt = opt\n        self.isTrain = opt.isTrain\n", True),
    "copied": ("        self.opt = copy.copy(opt)\n        self.isTrain = opt.isTrain\n", False),
    "rebound": ("        self.opt = opt\n        self.isTrain = opt.isTrain\n\n    def reset(self, other):\n        self.opt = other\n", False),
    "flag_set": ("        self.opt = opt\n        self.opt.apex = True\n        self.isTrain = opt.isTrain\n", False),
}
MAIN = '''

class Options:
    apex = {apex}
    isTrain = True


if __name__ == "__main__":
    torch.manual_seed(0)
    model = GANModel(Options())
    data = [torch.randn(16, 4, device="cuda") for _ in range(4)] * 4
    for real in data:
        model.optimize(real)
    Options.isTrain = False
    print(float(GANModel(Options()).test(data[0]).sum()))
'''


def _project(tmp_path, base: str, keep: str = "", train_test: str = "self.isTrain"):
    lines, _ = BASES[base]
    second = base == "kept_second"
    (tmp_path / "base_model.py").write_text(
        ("import copy\n\n\n" if base == "copied" else "") + "class BaseModel:\n    def __init__(self, "
        + ("name, opt" if second else "opt") + "):\n" + lines)
    model = MODEL.format(keep=keep, train_test=train_test)
    if second:
        model = model.replace("BaseModel.__init__(self, opt)", 'BaseModel.__init__(self, "gan", opt)')
    (tmp_path / "gan_model.py").write_text(model)
    return tmp_path / "gan_model.py"


def _rewrite(path, unsafe_fixes=False):
    [result] = [r for r in api.migrate_paths([str(path.parent)], write=False, unsafe_fixes=unsafe_fixes)
                if r.filename.endswith("gan_model.py")]
    return result


@pytest.mark.parametrize("base", list(BASES))
def test_a_flag_on_the_options_a_base_in_another_file_keeps(base, tmp_path):
    result = _rewrite(_project(tmp_path, base))
    safe = BASES[base][1]
    assert result.changed == safe, [d.message for d in result.diagnostics]
    if safe:
        # the plain arm runs where the scaler is off: the `if`/`else` is the scaled line alone
        assert "        self.scaler_0.scale(self.loss_d).backward()\n\n    def backward_g" in result.new_source, result.new_source
        assert "from apex" not in result.new_source


@pytest.mark.parametrize("call, safe", [
    ("super().__init__(opt)", True), ("super(GANModel, self).__init__(opt)", True),
    ("BaseModel.__init__(self, opt=opt)", False), ("BaseModel.__init__(self, *[opt])", False)])
def test_each_spelling_of_the_bases_init(call, safe, tmp_path):
    """The parameter handed by position, through ``super()`` or the base by name; by keyword or
    unpacked, the position it lands in is not read."""
    path = _project(tmp_path, "kept")
    path.write_text(path.read_text().replace("BaseModel.__init__(self, opt)", call))
    assert _rewrite(path).changed == safe


def test_the_base_file_not_found_keeps_the_rewrite_unsafe(tmp_path):
    path = _project(tmp_path, "kept")
    (tmp_path / "base_model.py").unlink()
    assert not _rewrite(path).changed


@pytest.mark.parametrize("keep, safe", [("        self.opt = opt\n", True), ("        self.opt = dict(opt=opt)\n", False)])
def test_the_options_kept_in_the_same_file(keep, safe, tmp_path):
    """``self.opt = opt`` in the file's own ``__init__``: the base's keeping is not needed."""
    path = _project(tmp_path, "copied", keep=keep)
    assert _rewrite(path).changed == safe


@pytest.mark.parametrize("train_test, asks", [("self.isTrain", True), ("True", True)])
def test_a_forward_running_without_the_scaler_asks_whether_it_exists(train_test, asks, tmp_path):
    """Initialize inside ``if self.isTrain:``: at test time no scaler exists, and ``forward()``
    runs there too. (``if True:`` is a block all the same: nothing reads its test.)"""
    fixed = _rewrite(_project(tmp_path, "kept", train_test=train_test)).new_source
    forward = _forward(fixed)
    assert forward.startswith("    def forward(self):\n        with torch.autocast("), fixed
    assert ('getattr(self, "scaler_0", None) is not None and self.scaler_0.is_enabled()' in forward) == asks, forward


def _forward(fixed: str) -> str:
    return fixed[fixed.index("    def forward(self):"):fixed.index("    def backward_d(self):")]


def test_a_scaler_made_in_inits_own_lines_is_read_as_it_is(tmp_path):
    source = _project(tmp_path, "kept").read_text().replace(
        "        if self.isTrain:\n            self.opt_g", "        if self.isTrain:\n            pass\n        if True:\n            self.opt_g")
    unindented = source.replace("            if opt.apex:\n                [self.gen", "        if opt.apex:\n            [self.gen").replace(
        "                    [self.gen, self.disc], [self.opt_g, self.opt_d], opt_level", "                [self.gen, self.disc], [self.opt_g, self.opt_d], opt_level")
    (tmp_path / "gan_model.py").write_text(unindented)
    forward = _forward(_rewrite(tmp_path / "gan_model.py").new_source)
    assert "enabled=self.scaler_0.is_enabled()):\n            self.fake = self.gen(self.real)" in forward, forward


@pytest.mark.slow
@pytest.mark.parametrize("apex", [True, False])
def test_the_safe_rewrite_trains_and_tests_as_apex_did(apex, tmp_path):
    """Trained under the flag both ways, then a model built for testing (no scaler) runs ``forward()``."""
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    path = _project(tmp_path, "kept")
    original = path.read_text() + MAIN.format(apex=apex)
    rewritten = _rewrite(path)
    assert rewritten.changed, [d.message for d in rewritten.diagnostics]
    (tmp_path / "original.py").write_text(original)
    (tmp_path / "rewritten.py").write_text(rewritten.new_source + MAIN.format(apex=apex))
    run = subprocess.run([sys.executable, "-m", "ampshim", "--device", "cpu", "rewritten.py"],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    comparison = compare(Target(str(tmp_path / "original.py")), Target(str(tmp_path / "rewritten.py")), [],
                         device="cpu", steps=15, parallel=True, timeout=240)
    assert comparison.verdict == SAME, as_text(comparison)
