"""AMP007 in a file that registers a cast function and initializes nothing (a model file beside
its trainer): apex amp starts in another file. Where the project's extent is known and a safe run
migrates its every ``amp.initialize``, apex's registry stops with them and native autocast casts
in its place, so dropping a registration native autocast already makes is safe, and the message
names the trainer. Anywhere else (no project known, a trainer the run cannot migrate safely,
none at all) it stays as before: reported, or removed unsafely with a marker.

Over how the registration is written, where the files sit, and what the trainers hold."""
from __future__ import annotations

import itertools
import shutil
import subprocess
import sys

import pytest

from migrate import api

REGISTRATIONS = {  # ops.py's registration, and whether native autocast already makes its cast
    "from_import": ("from apex import amp\n\namp.register_half_function(torch, 'einsum')\n", True),
    "module_import": ("import apex\n\napex.amp.register_half_function(torch, 'einsum')\n", True),
    "guarded": ("import os\n\nfrom apex import amp\n\nif os.environ.get('FP16'):\n    amp.register_half_function(torch, 'bmm')\n",
                True),
    "in_function": ("from apex import amp\n\n\ndef setup():\n    amp.register_float_function(torch, 'softmax')\n", True),
    "not_native": ("from apex import amp\n\namp.register_float_function(torch, 'sigmoid')\n", False),
}
OPS_BODY = "\n\ndef attend(q, k):\n    return torch.einsum('bij,bkj->bik', q, k)\n"
TRAINER = """\
import torch
from apex import amp

from {ops} import attend


def train(model, optimizer, loader):
    model, optimizer = amp.initialize(model, optimizer, opt_level="{level}")
    for x in loader:
        loss = attend(model(x), x).mean()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
"""
LAYOUTS = {  # where ops.py sits, what marks the project, and the trainer's import of ops.py
    "marker": ("ops.py", "pyproject.toml", "ops"),
    "git": ("model/ops.py", ".git", "model.ops"),
    "package": ("lib/layers/ops.py", None, "lib.layers.ops"),
    "lone_folder": ("ops.py", None, "ops"),  # a folder of files gathered from anywhere: no project
}
TRAINERS = {  # the trainers beside ops.py: their opt levels
    "o1": ("O1",),
    "two_o1": ("O1", "O1"),
    "o2": ("O2",),  # a safe run leaves it on apex
    "o1_and_o2": ("O1", "O2"),
    "none": (),
}


def _project(root, registration: str, layout: str, trainers: str):
    where, marker, dotted = LAYOUTS[layout]
    ops = root / where
    ops.parent.mkdir(parents=True, exist_ok=True)
    ops.write_text("import torch\n" + REGISTRATIONS[registration][0] + OPS_BODY)
    if marker == ".git":
        (root / ".git").mkdir()
    elif marker:
        (root / marker).write_text("[project]\nname = 'p'\n")
    if layout == "package":
        for folder in (ops.parent, ops.parent.parent):
            (folder / "__init__.py").write_text("")
    for index, level in enumerate(TRAINERS[trainers]):
        (root / f"train{index}.py").write_text(TRAINER.format(ops=dotted, level=level))
    return ops


@pytest.mark.parametrize("registration, layout, trainers", list(itertools.product(REGISTRATIONS, LAYOUTS, TRAINERS)))
def test_a_registration_goes_safely_only_with_every_initialize_of_its_project(tmp_path, registration, layout, trainers):
    ops = _project(tmp_path, registration, layout, trainers)
    native = REGISTRATIONS[registration][1]
    levels, original = TRAINERS[trainers], ops.read_text()
    [safe_run] = [r for r in api.migrate_paths([str(tmp_path)], write=False) if r.filename == str(ops)]
    [finding] = [d for d in safe_run.diagnostics if d.code == "AMP007"]
    if "O2" in levels:  # apex still starts there after a safe run, and casts through the registry
        assert finding.fix is None and "train" in finding.message, finding
        assert safe_run.new_source in (None, original), safe_run.new_source
        return
    assert finding.fix is not None, finding.message
    safe = native and layout != "lone_folder" and bool(levels)
    assert (finding.fix.applicability.value == "safe") == safe, finding.fix.why_unsafe
    if safe:
        assert f"apex amp starts at {', '.join(f'train{i}.py:8' for i in range(len(levels)))}, which this run migrates" in finding.message
        assert "apex" not in safe_run.new_source and "attend" in safe_run.new_source, safe_run.new_source
        compile(safe_run.new_source, str(ops), "exec")
        return
    assert safe_run.new_source in (None, original), safe_run.new_source
    [unsafe_run] = [r for r in api.migrate_paths([str(tmp_path)], write=False, unsafe_fixes=True) if r.filename == str(ops)]
    assert "# TODO(ampmigrate): review, this rewrite is unsafe" in unsafe_run.new_source, unsafe_run.new_source
    reason = "native autocast does not cast 'sigmoid'" if not native else "apex amp is initialized in another file"
    assert reason in " ".join(line.strip(" #") for line in unsafe_run.new_source.splitlines()), unsafe_run.new_source


@pytest.mark.parametrize("layout", sorted(set(LAYOUTS) - {"lone_folder"}))
def test_a_trainer_left_out_of_the_run_keeps_the_registration(tmp_path, layout):
    ops = _project(tmp_path, "from_import", layout, "o1")
    [result] = api.migrate_paths([str(ops)], write=False)
    [finding] = [d for d in result.diagnostics if d.code == "AMP007"]
    assert finding.fix is None and "train0.py:8" in finding.message, finding
    assert result.new_source in (None, ops.read_text())


def test_the_safe_run_migrates_both_files_together(tmp_path):
    ops = _project(tmp_path, "guarded", "marker", "o1")
    results = {r.filename: r for r in api.migrate_paths([str(tmp_path)], write=False)}
    trainer = results[str(tmp_path / "train0.py")].new_source
    assert "apex" not in trainer and "torch.amp.GradScaler" in trainer and "torch.autocast" in trainer, trainer
    assert "register_half_function" not in results[str(ops)].new_source


RUNNABLE_TRAINER = """\
import torch
from apex import amp

from ops import attend


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    data = torch.randn(64, 8).cuda()
    for step in range(20):
        x = data[(step * 8) % 64:(step * 8) % 64 + 8]
        loss = attend(model(x), x).pow(2).mean()
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
def test_the_project_without_its_registration_trains_as_apex_did(tmp_path):
    original = tmp_path / "original"
    original.mkdir()
    (original / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (original / "ops.py").write_text("import torch\n" + REGISTRATIONS["from_import"][0] +
                                     "\n\ndef attend(q, k):\n    return torch.einsum('bi,bj->bij', q, k).sum(dim=2)\n")
    (original / "train.py").write_text(RUNNABLE_TRAINER)
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    api.migrate_paths([str(migrated)], write=True)
    assert "apex" not in (migrated / "ops.py").read_text() + (migrated / "train.py").read_text()
    run = subprocess.run([sys.executable, "-m", "ampshim", "compare", "--device", "cpu", str(original / "train.py"),
                          str(migrated / "train.py")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("level_setting", [None, "O0", "O1"])
def test_an_opt_level_known_from_the_setting_counts_as_migrated(tmp_path, level_setting):
    """A trainer whose opt level is computed by a call (``os.environ.get(...)``) migrates safely
    where the ``opt-level`` setting names it: the registration beside it goes as safely."""
    ops = _project(tmp_path, "from_import", "marker", "o1")
    trainer = tmp_path / "train0.py"
    trainer.write_text("import os\n" + trainer.read_text().replace('opt_level="O1"', 'opt_level=os.environ.get("OPT_LEVEL", "O1")'))
    settings = {"opt-level": level_setting} if level_setting else None
    results = {r.filename: r for r in api.migrate_paths([str(tmp_path)], write=False, settings=settings)}
    assert ("apex" not in (results[str(trainer)].new_source or "apex")) == bool(level_setting), results[str(trainer)].new_source
    [finding] = [d for d in results[str(ops)].diagnostics if d.code == "AMP007"]
    known = level_setting is not None
    assert (finding.fix is not None and finding.fix.applicability.value == "safe") == known, finding
