"""A FusedAdam swapped for torch's Adam where the project resumes optimizers: a checkpoint saved
with apex's FusedAdam (step count per parameter group) does not load into torch's Adam (per
parameter), so there the swap is reported, not made."""
from __future__ import annotations

import pytest

from migrate import api

OPTIMIZER = "from apex.optimizers import FusedAdam\n\n\ndef build(model):\n    return FusedAdam(model.parameters(), lr=1e-3)\n"
RESUMES = {
    "plain": "optimizer.load_state_dict(checkpoint['optimizer'])",
    "attribute": "self.loss_optimizer.load_state_dict(state['optimizer'])",
    "short": "opt.load_state_dict(sd['opt'])",
}


def _project(tmp_path, loader: str | None):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "optim.py").write_text(OPTIMIZER)
    if loader is not None:
        (tmp_path / "train.py").write_text(f"def resume(optimizer, opt, self, checkpoint, state, sd):\n    {loader}\n")
    return tmp_path / "optim.py"


@pytest.mark.parametrize("spelling", sorted(RESUMES))
def test_a_project_that_loads_optimizer_state_keeps_fused_adam_and_says_where(tmp_path, spelling):
    target = _project(tmp_path, RESUMES[spelling])
    for unsafe in (False, True):
        result = api.migrate_paths([str(target)], write=False, unsafe_fixes=unsafe)[0]
        assert result.new_source == OPTIMIZER
        [finding] = [d for d in result.diagnostics if d.code == "AMP012"]
        assert "not rewritten: optimizer state is loaded (train.py:2)" in finding.message


def test_a_project_that_never_loads_optimizer_state_gets_the_native_adam(tmp_path):
    target = _project(tmp_path, "model.load_state_dict(checkpoint['model'])")  # a model's state: no matter
    result = api.migrate_paths([str(target)], write=False)[0]
    assert "torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)" in result.new_source
