"""A file that scales a loss and initializes nothing, where its project keeps an ``amp.initialize``
on apex that may hold fp32 master weights (O2, O3, ``master_weights=True``, a level set at run time).

Given its own GradScaler (``--unsafe-fixes``), such a file stepped an optimizer whose parameters
are apex's float32 copies: apex fills their gradients in ``scale_loss``, the GradScaler never does,
and ``scaler.step`` raised "No inf checks were recorded for this optimizer" (a GAN's discriminator
loss in one module, the optimizers set up in another, seen in a real repository). It is left on
apex with the place named. Where apex cannot keep master weights there (O0, O1), where the project
migrates that ``initialize`` in the same run, or where no project is known (a lone folder), the
file keeps its marked rewrite.
"""
from __future__ import annotations

import itertools

import pytest

from migrate import api

# how the project's `amp.initialize` is spelled, and whether apex may keep master weights there
INITIALIZE = {
    "o2_keyword": ('amp.initialize(model, [self.g, self.d], opt_level="O2")', True),
    "o3_keyword": ('amp.initialize(model, [self.g, self.d], opt_level="O3")', True),
    "level_at_run_time": ("amp.initialize(model, [self.g, self.d], opt_level=self.args.opt_level)", True),
    "options_unpacked": ("amp.initialize(model, [self.g, self.d], **self.options)", True),
    "o2_positional": ('amp.initialize(model, [self.g, self.d], True, "O2")', True),
    "o1_with_master_weights": ('amp.initialize(model, [self.g, self.d], opt_level="O1", master_weights=True)', True),
    "o1_keyword": ('amp.initialize(model, [self.g, self.d], opt_level="O1")', False),
    "o1_positional": ('amp.initialize(model, [self.g, self.d], True, "O1")', False),
    "default_level": ("amp.initialize(model, [self.g, self.d])", False),
    "o0": ('amp.initialize(model, [self.g, self.d], opt_level="O0")', False),
    "o1_master_weights_off": ('amp.initialize(model, [self.g, self.d], opt_level="O1", master_weights=False)', False),
}
# the optimizers' module: it keeps apex's state in checkpoints, which needs a scaler living
# elsewhere, so the run cannot migrate it (`stays`), or it only initializes (`migrates` unsafely)
OPTIMIZERS = """\
import torch
from apex import amp


class Optimizers:
    def __init__(self, args, options):
        self.args, self.options = args, options

    def set_amp(self, model):
        self.g = torch.optim.SGD(model.g.parameters(), lr=0.1)
        self.d = torch.optim.SGD(model.d.parameters(), lr=0.1)
        model, [self.g, self.d] = {initialize}
        return model
{save}"""
SAVE = """
    def save(self, path):
        torch.save(amp.state_dict(), path)
"""
ADVERSARIAL = """\
import torch
import torch.nn.functional as F

try:
    from apex import amp
except ImportError:
    pass


class Adversarial:
    def __init__(self, args, model, optimizer):
        self.args, self.model, self.optimizer = args, model, optimizer

    def update_discriminator(self, fake, real):
        self.optimizer.d.zero_grad()
        d_fake = self.model.d(fake.detach())
        d_real = self.model.d(real)
        loss_d = F.softplus(d_fake).mean() + F.softplus(-d_real).mean()
        if self.args.amp:
            with amp.scale_loss(loss_d, self.optimizer.d) as scaled:
                scaled.backward()
        else:
            loss_d.backward()
        self.optimizer.d.step()
"""
# where the two files lie: a marked project, packages with no marker, a lone folder
LAYOUTS = {
    "marked": ("optim.py", "adversarial.py", True),
    "packages": ("optim/__init__.py", "loss/adversarial.py", True),
    "lone_folder": ("optim.py", "adversarial.py", False),
}


def _project(tmp_path, layout, initialize, keeps_state):
    optimizers, adversarial, _ = LAYOUTS[layout]
    if layout == "marked":
        (tmp_path / "setup.py").write_text("")
    for relative, text in ((optimizers, OPTIMIZERS.format(initialize=INITIALIZE[initialize][0], save=SAVE if keeps_state else "")),
                           (adversarial, ADVERSARIAL)):
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.parent != tmp_path:
            (path.parent / "__init__.py").touch()  # `optim/__init__.py` is then written over
        path.write_text(text)
    return tmp_path / optimizers, tmp_path / adversarial


def _adversarial(tmp_path, paths, unsafe_fixes):
    [result] = [r for r in api.migrate_paths(paths, write=False, unsafe_fixes=unsafe_fixes)
                if r.filename.endswith("adversarial.py")]
    return result


@pytest.mark.parametrize("initialize, layout, given", list(itertools.product(sorted(INITIALIZE), sorted(LAYOUTS), ["project", "alone"])))
def test_a_scale_half_steps_no_optimizer_apex_may_keep_master_weights_for(tmp_path, initialize, layout, given):
    optimizers, adversarial = _project(tmp_path, layout, initialize, keeps_state=True)
    paths = [str(tmp_path)] if given == "project" else [str(adversarial)]
    result = _adversarial(tmp_path, paths, unsafe_fixes=True)
    refused = INITIALIZE[initialize][1] and LAYOUTS[layout][2]
    assert ("amp.scale_loss(" in result.new_source) is refused, result.new_source
    reasons = " ".join(d.message for d in result.diagnostics)
    assert ("may keep float32 master weights" in reasons) is refused, reasons
    if refused:
        where = optimizers.relative_to(tmp_path)
        assert f"`amp.initialize` at {where}:12 stays on apex amp" in reasons, reasons
        # the safe run offers no fix the unsafe run would refuse
        safe = _adversarial(tmp_path, paths, unsafe_fixes=False)
        assert all(d.fix is None for d in safe.diagnostics if d.code == "AMP003"), safe.diagnostics
    else:
        assert "scaler.scale(loss_d).backward()" in result.new_source and "TODO(ampmigrate)" in result.new_source


@pytest.mark.parametrize("initialize", [name for name, (_, master) in sorted(INITIALIZE.items()) if master])
def test_where_the_same_run_migrates_that_initialize_the_scale_half_keeps_its_rewrite(tmp_path, initialize):
    # the optimizers' module only initializes: --unsafe-fixes removes its call (marked), so apex
    # keeps no master weights and the GradScaler of the scale half steps plain optimizers
    optimizers, _ = _project(tmp_path, "marked", initialize, keeps_state=False)
    result = _adversarial(tmp_path, [str(tmp_path)], unsafe_fixes=True)
    assert "scaler.scale(loss_d).backward()" in result.new_source, result.new_source
    assert "amp.initialize" not in [r for r in api.migrate_paths([str(tmp_path)], write=False, unsafe_fixes=True)
                                    if r.filename == str(optimizers)][0].new_source
