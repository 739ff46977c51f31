"""A loss computed from tensors another file of the project made by a forward pass: apex O1 cast
that forward pass too, the autocast region the rewrite puts around the loss does not reach it.
So the rewrite is unsafe, and says where the caller is; a caller that hands in data is no reason."""
from __future__ import annotations

import textwrap

import pytest

from migrate import api
from migrate.forward_callers import Handed, handed_elsewhere

TRAINER = """\
import torch
from apex import amp


class Trainer:
    def __init__(self):
        self.gen, self.dis = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
        self.opt = torch.optim.SGD([*self.gen.parameters(), *self.dis.parameters()], lr=0.1)
        [self.gen, self.dis], self.opt = amp.initialize([self.gen, self.dis], self.opt, opt_level="O1")

    def forward(self, x):
        fake = self.gen(x)
        return fake, x

    def update(self, fake, target):
        loss = ((fake - target) ** 2).mean() - self.dis(fake).mean()
        with amp.scale_loss(loss, self.opt) as scaled:
            scaled.backward()
        self.opt.step()
        return loss
"""
TRAIN = """\
from trainer import Trainer


def prepare(x):
    return x * 2


def main(batches):
    trainer = Trainer()
    for x, y in batches:
{caller}
"""
CALLERS = {  # how train.py makes what it hands `update`, and whether a forward pass of trainer.py made it
    "unpacked": ("fake, _ = trainer.forward(x)\ntrainer.update(fake, y)", True),
    "inline": ("trainer.update(trainer.forward(x)[0], y)", True),
    "keyword": ("out = trainer.forward(x)\ntrainer.update(fake=out[0], target=y)", True),
    "model_attribute": ("fake = trainer.gen(x)\ntrainer.update(fake, y)", True),
    "annotated": ("fake: object = trainer.gen(x)\ntrainer.update(fake, y)", True),
    "batch_itself": ("trainer.update(x, y)", False),
    "moved": ("fake = x.float()\ntrainer.update(fake, y)", False),
    "prepared_by_a_helper": ("fake = prepare(x)\ntrainer.update(fake, y)", False),
    "target_only": ("t, _ = trainer.forward(y)\ntrainer.update(x, t)", True),
    "after_a_starred": ("trainer.update(*[x], trainer.forward(y))", False),
    "by_an_update_that_scales_itself": ("fake = trainer.update(x, y)\ntrainer.update(fake, y)", False),
}


def _project(tmp_path, caller: str):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "trainer.py").write_text(TRAINER)
    (tmp_path / "train.py").write_text(TRAIN.replace("{caller}", textwrap.indent(caller, " " * 8)))
    return tmp_path / "trainer.py"


def _reasons(result) -> str:
    return " ".join(d.fix.why_unsafe or "" for d in result.diagnostics if d.fix)


@pytest.mark.parametrize("shape", sorted(CALLERS))
@pytest.mark.parametrize("given", ["the_file", "the_project"])
def test_a_loss_from_a_forward_pass_another_file_ran_is_no_safe_region(tmp_path, shape, given):
    caller, forward = CALLERS[shape]
    target = _project(tmp_path, caller)
    paths = [str(target)] if given == "the_file" else [str(tmp_path)]
    [result] = [r for r in api.migrate_paths(paths, write=False) if r.filename.endswith("trainer.py")]
    reasons = _reasons(result)
    assert ("handed in at train.py:" in reasons) == forward, reasons
    safe = {d.fix.applicability.value for d in result.diagnostics if d.fix} == {"safe"}
    assert safe == (not forward)
    assert ("with torch.autocast" in result.new_source) == (not forward)  # a safe run leaves the unsafe plan out


def test_the_calls_found_name_the_parameter_and_what_made_it(tmp_path):
    target = _project(tmp_path, "fake, _ = trainer.forward(x)\ntrainer.update(fake, target=y)")
    found = handed_elsewhere({target: TRAINER})
    assert found == {target: (Handed("update", "train.py:12", 0, "forward"),)}


def test_a_file_that_scales_in_a_function_without_parameters_searches_nothing(tmp_path):
    text = TRAINER.replace("def update(self, fake, target):", "def update(self):\n        fake = target = self.gen(1)")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "trainer.py").write_text(text)
    assert handed_elsewhere({tmp_path / "trainer.py": text}) == {}


def test_each_project_fact_reaches_the_setting_its_module_names():
    from migrate import (amp_reexports, apex_kept, apex_state_reads, base_bindings, cast_registrations, forward_callers,
                         forwardless_models, grad_norms, half_helpers, importers, level_settings, loop_feeds, optimizer_resumes,
                         scale_kept, state_helpers, subclass_overrides)
    from migrate.apex_plan.vocabulary import PARTNER
    from migrate.file_run import _PROJECT_FACTS

    assert [setting for _, setting in _PROJECT_FACTS] == [
        PARTNER, importers.SETTING, importers.FUNCTIONS_SETTING, cast_registrations.SETTING, apex_state_reads.SETTING, optimizer_resumes.SETTING, forward_callers.SETTING, apex_kept.SETTING,
        apex_kept.MASTER_WEIGHTS_SETTING, apex_kept.MIGRATED_SETTING, apex_kept.DECORATORS_SETTING,
        scale_kept.SETTING, scale_kept.INITIALIZED_SETTING, level_settings.SETTING, state_helpers.KEEPER_SETTING,
        state_helpers.CALLER_SETTING, state_helpers.KEPT_SETTING, apex_kept.STATE_SETTING, forwardless_models.SETTING, grad_norms.SETTING,
        half_helpers.SETTING, subclass_overrides.SETTING, base_bindings.SETTING, amp_reexports.SETTING, loop_feeds.SETTING]
