"""A run plans every file from the project as it found it, and a later run reads it again.

A file's plan reads other files of its project from disk (where a model's parameters are frozen,
``migrate.frozen_parameters``). Those files may be rewritten by the same run: the rewrite of each
file must not depend on which file a worker happened to write first, so what ``--diff`` shows is
what the fixing run writes. A second run in the same process (an editor, a test) must see the
files as they are now, not as the first run read them.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from migrate.api import migrate_paths

# A model file the run rewrites (two apex imports go, so every line below moves up by two) and
# that freezes a BatchNorm weight; a script converting that model's BatchNorm layers, whose
# marker names the freezing line.
_MODEL = '''import torch
from apex import amp
from apex.optimizers import FusedAdam


def make_optimizer(model):
    return FusedAdam(model.parameters(), lr=1e-3)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(3)
        self.bn.weight.requires_grad = False
'''
_CONVERTING = '''import torch
from apex.parallel import convert_syncbn_model
from {model} import Net

model = convert_syncbn_model(Net())
'''
_FILLER = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"


def _project(root: Path, model: str, script: str, fillers: int) -> None:
    root.mkdir()
    (root / f"{model}.py").write_text(_MODEL)
    (root / f"{script}.py").write_text(_CONVERTING.format(model=model))
    for number in range(fillers):  # enough files for the run to use worker processes
        (root / f"filler_{number}.py").write_text(_FILLER)


@pytest.mark.parametrize("model, script", [("a_model", "b_train"), ("z_model", "b_train")],
                         ids=["model-first", "model-last"])
@pytest.mark.parametrize("jobs, fillers", [(1, 0), (2, 8)], ids=["here", "workers"])
def test_what_a_fixing_run_writes_is_what_its_diff_shows(tmp_path, model, script, jobs, fillers):
    _project(tmp_path / "p", model, script, fillers)
    shown = {r.filename: r.new_source for r in migrate_paths([tmp_path / "p"], unsafe_fixes=True, write=False, jobs=jobs)}
    migrate_paths([tmp_path / "p"], unsafe_fixes=True, jobs=jobs)
    written = {filename: Path(filename).read_text() for filename in shown}
    assert written == shown
    assert f"({model}.py:14)" in written[str(tmp_path / "p" / f"{script}.py")]  # the line as the run found it


def test_a_second_run_reads_the_project_as_it_is_now(tmp_path):
    _project(tmp_path / "p", "a_model", "b_train", 0)
    first = migrate_paths([tmp_path / "p"], unsafe_fixes=True, write=False, jobs=1)
    assert any("parameters are frozen" in (r.new_source or "") for r in first)
    model = tmp_path / "p" / "a_model.py"
    model.write_text(model.read_text().replace("        self.bn.weight.requires_grad = False\n", ""))
    second = migrate_paths([tmp_path / "p"], unsafe_fixes=True, write=False, jobs=1)
    assert not any("parameters are frozen" in (r.new_source or "") for r in second)
