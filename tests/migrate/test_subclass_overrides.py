"""A trainer whose methods hold the scaled backward or the step, overridden by a subclass in
another file of the project (``HVDTrainer(FP16Trainer)`` redefining ``_apex_backward``): the
rewrite changes what those methods are handed and must do, which the overrides do not. The
file is left, in either mode, naming the override."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from migrate.api import migrate_paths

BASE = textwrap.dedent("""\
    import torch
    from apex import amp


    class FP16Trainer:
        def __init__(self, model, optimizer):
            self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

        def _apex_backward(self, loss):
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()

        def _apex_step(self):
            self.optimizer.step()

        def fit(self, batches):
            for x, y in batches:
                loss = torch.nn.functional.mse_loss(self.model(x), y)
                self._apex_backward(loss)
                self._apex_step()
                self.optimizer.zero_grad()
""")
SUBCLASSES = {
    "backward": "    def _apex_backward(self, loss):\n        loss.backward()\n        self.optimizer.synchronize()\n",
    "step": "    def _apex_step(self):\n        with self.optimizer.skip_synchronize():\n            self.optimizer.step()\n",
}
BASES = {"by name": ("from trainers.fp16 import FP16Trainer", "FP16Trainer"),
         "through its module": ("from trainers import fp16", "fp16.FP16Trainer")}


def _project(root: Path, subclass: str | None, base: str = "by name") -> Path:
    (root / ".git").mkdir(parents=True)
    package = root / "trainers"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fp16.py").write_text(BASE)
    if subclass is not None:
        imports, name = BASES[base]
        (package / "hvd.py").write_text(f"{imports}\n\n\nclass HVDTrainer({name}):\n{SUBCLASSES[subclass]}")
    return package / "fp16.py"


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("subclass", sorted(SUBCLASSES))
def test_a_method_a_subclass_elsewhere_overrides_keeps_the_file(tmp_path, subclass, base):
    trainer = _project(tmp_path, subclass, base)
    for unsafe in (False, True):
        [result] = [r for r in migrate_paths([trainer], write=False, unsafe_fixes=unsafe) if r.filename.endswith("fp16.py")]
        assert result.new_source in (None, BASE), result.new_source
        messages = " ".join(d.message for d in result.diagnostics)
        assert f"is overridden in another file (trainers/hvd.py:" in messages, messages


def test_without_a_subclass_the_trainer_is_migrated(tmp_path):
    trainer = _project(tmp_path, None)
    [result] = [r for r in migrate_paths([trainer], write=False) if r.filename.endswith("fp16.py")]
    assert result.new_source and "amp.scale_loss" not in result.new_source, result.new_source


def test_an_override_of_a_method_holding_no_site_keeps_the_rewrite(tmp_path):
    trainer = _project(tmp_path, None)
    (trainer.parent / "hvd.py").write_text("from trainers.fp16 import FP16Trainer\n\n\nclass Quiet(FP16Trainer):\n"
                                          "    def describe(self):\n        return 'quiet'\n")
    [result] = [r for r in migrate_paths([trainer], write=False) if r.filename.endswith("fp16.py")]
    assert result.new_source and "amp.scale_loss" not in result.new_source, result.new_source


def test_a_class_of_the_same_name_from_another_module_is_another_class(tmp_path):
    trainer = _project(tmp_path, None)
    (trainer.parent / "hvd.py").write_text("from other.lib import FP16Trainer\n\n\nclass HVDTrainer(FP16Trainer):\n"
                                          + SUBCLASSES["backward"])
    [result] = [r for r in migrate_paths([trainer], write=False) if r.filename.endswith("fp16.py")]
    assert result.new_source and "amp.scale_loss" not in result.new_source, result.new_source
