"""``amp.initialize(model, optimizer)`` in a file of a project where no file scales a loss with
``amp.scale_loss``: a trainer from a library (ceshine/pytorch-helper-bot's ``BaseBot(...,
use_amp=True)``) may scale it with apex, which raises once the call is gone ("Amp state has not
been initialized"). The unsafe rewrite's marker says so beside its autocast step, and its reason
no longer says a file that scales the loss exists; a model readied for inference alone (no
optimizer) is marked as before."""
from __future__ import annotations

import pytest

from migrate import api

SCRIPT = """import torch
from apex import amp
from trainer_library import Bot


def train(model, level):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if level != "O0":
        {call}
    Bot(model, optimizer, use_amp=level != "O0").train()
"""
CALLS = {
    "optimizer": ("model, optimizer = amp.initialize(model, optimizer, opt_level=level)", True),
    "optimizer_keyword": ("model, optimizer = amp.initialize(model, optimizers=optimizer, opt_level=level)", True),
    "inference": ("model = amp.initialize(model, opt_level=level)", False),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_the_marker_names_a_library_that_may_scale_with_apex(tmp_path, call):
    text, trains = CALLS[call]
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(call=text))
    [result] = [r for r in api.migrate_paths([str(tmp_path)], write=False, unsafe_fixes=True) if r.filename.endswith("train.py")]
    new = " ".join(result.new_source.replace("#", " ").split())
    assert "TODO(ampmigrate): run `model` under torch.autocast" in new, result.new_source
    assert ("where code handed `optimizer` (another file, a library) scales the loss with apex's `amp.scale_loss`, "
            "it raises once this call is gone" in new) == trains, result.new_source
    said = " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix is not None and d.fix.why_unsafe)
    assert "the file that scales the loss gets" not in said, said
