"""A file using apex's casts (``amp.register_half_function(torch, "einsum")``) whose own project
is known (a marker, a package) is told where apex amp is still initialized after the run: in
its project, not in another project the same run was given (a monorepo's sibling folder with a
marker of its own, run together: thunlp's examples named a file of another project by its
absolute path, and kept the registration on apex). Where no project is known (a folder of
gathered files), the run's files still count: nothing says where the project ends."""
from __future__ import annotations

import pytest

from migrate import api

TRAINER = """\
import torch
from apex import amp
{registration}

def train(model, optimizer, loader):
    model, optimizer = amp.initialize(model, optimizer, opt_level="{level}")
    for x in loader:
        loss = torch.einsum("bi,bi->b", model(x), x).mean()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
"""
MARKERS = {"pyproject": ("pyproject.toml", "[project]\nname = 'p'\n"), "setup": ("setup.py", "import setuptools\n"),
           "none": None}
REGISTRATIONS = ['\namp.register_half_function(torch, "einsum")\n',
                 '\nif torch.cuda.is_available():\n    amp.register_half_function(torch, "einsum")\n']


@pytest.mark.parametrize("marker", sorted(MARKERS))
@pytest.mark.parametrize("registration", REGISTRATIONS)
@pytest.mark.parametrize("sibling_level", ["O2", "O1"])
def test_another_project_of_the_run_does_not_keep_apex_here(tmp_path, marker, registration, sibling_level):
    for name, text in (("qa", TRAINER.format(registration=registration, level="O1")),
                       ("other", TRAINER.format(registration="", level=sibling_level))):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "train.py").write_text(text)
        if MARKERS[marker]:
            (folder / MARKERS[marker][0]).write_text(MARKERS[marker][1])
    results = {r.filename: r for r in api.migrate_paths([str(tmp_path)], write=False)}
    mine = results[str(tmp_path / "qa" / "train.py")]
    [finding] = [d for d in mine.diagnostics if d.code == "AMP007"]
    kept_on_apex = marker == "none" and sibling_level == "O2"  # the O2 trainer stays on apex in a safe run
    assert (finding.fix is None) == kept_on_apex, finding
    assert marker == "none" or str(tmp_path) not in finding.message, finding.message  # no other project's file named
    if not kept_on_apex:
        assert "apex" not in mine.new_source, mine.new_source
