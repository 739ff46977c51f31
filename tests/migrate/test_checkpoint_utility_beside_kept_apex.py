"""A checkpoint utility stays on apex while its project keeps initializing apex amp.

The utility saves ``amp.state_dict()`` or loads ``amp.load_state_dict(...)`` and holds neither
``amp.initialize`` nor ``amp.scale_loss``; no caller the run sees hands it a GradScaler (a
framework calls the runner's ``resume``, or a script outside the run calls the helper). With
``--unsafe-fixes`` it used to take the GradScaler as ``scaler=None`` and save nothing without
one, while the file that initializes apex stayed on apex (outside the run, a model cast to
float16 by hand, apex's internal state read elsewhere): the apex runs then lost their
loss-scaler state from every checkpoint, and the marker asked for a GradScaler that no file of
the project makes. In a project whose extent is known, the utility is left as it was and the
reason names where apex stays initialized. Where the run migrates every ``amp.initialize`` of
the project, or the folder is no known project, the utility is rewritten as before.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from migrate.api import migrate_paths

# how the utility keeps apex's state, where no caller in the run is seen
UTILITIES = {
    "function_local_import": (
        "import torch\n\n\n"
        "def save_checkpoint(model, optimizer, path, save_apex_amp=False):\n"
        '    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}\n'
        "    if save_apex_amp:\n"
        "        from apex import amp\n"
        '        state["amp"] = amp.state_dict()\n'
        "    torch.save(state, path)\n"
    ),
    "runner_method": (
        "import torch\n\n\n"
        "class Runner:\n"
        "    def __init__(self, model, optimizer, use_apex_amp=False):\n"
        "        self.model, self.optimizer, self.use_apex_amp = model, optimizer, use_apex_amp\n\n"
        "    def resume(self, path):\n"
        '        checkpoint = torch.load(path, map_location="cpu")\n'
        '        self.model.load_state_dict(checkpoint["state_dict"])\n'
        "        if self.use_apex_amp:\n"
        "            from apex import amp\n"
        '            amp.load_state_dict(checkpoint["amp"])\n'
    ),
    "module_import": (
        "import torch\n"
        "try:\n    from apex import amp\nexcept ImportError:\n    amp = None\n\n\n"
        "def save_checkpoint(model, optimizer, path):\n"
        '    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}\n'
        "    if amp is not None:\n"
        '        state["amp"] = amp.state_dict()\n'
        "    torch.save(state, path)\n"
    ),
}

_TRAIN = (
    "import torch\nfrom apex import amp\n\n\n"
    "def train(model, optimizer, batches):\n"
    "    {prepare}model, optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n"
    "    for x, y in batches:\n"
    "        loss = torch.nn.functional.mse_loss(model(x), y)\n"
    "        optimizer.zero_grad()\n"
    "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
    "            scaled_loss.backward()\n"
    "        optimizer.step()\n"
)
# a file of the project whose `amp.initialize` stays on apex after an unsafe run, and why
KEPT = {
    # the run is given the utility alone: the initializing file is not in it
    "outside_the_run": ("apex_setup.py", "from apex import amp\n\n\ndef setup(model, optimizer, level):\n"
                        "    return amp.initialize(model, optimizer, opt_level=level)\n"),
    # a model cast to float16 by hand before `initialize`: no run plans the file
    "half_model": ("train.py", _TRAIN.format(prepare="model = model.half()\n    ")),
    # another file of its package reads apex's internal state, which `initialize` fills
    "internal_state_read": ("trainer/train.py", _TRAIN.format(prepare="")),
}
_INTERNAL_READ = ("from apex import amp\n\n\ndef loss_scale():\n"
                  "    return amp._amp_state.loss_scalers[0].loss_scale()\n")
_UTILITY = "tools/checkpoint.py"


def _project(root: Path, utility: str, kept: str | None, marker: bool = True) -> Path:
    (root / "tools").mkdir(parents=True)
    if marker:
        (root / "setup.py").write_text("")
    (root / _UTILITY).write_text(UTILITIES[utility])
    if kept is None:  # an initializing file the unsafe run migrates
        (root / "train.py").write_text(_TRAIN.format(prepare=""))
    else:
        name, text = KEPT[kept]
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text(text)
        if kept == "internal_state_read":
            (root / "trainer" / "__init__.py").write_text("")
            (root / "trainer" / "scales.py").write_text(_INTERNAL_READ)
    return root


def _run(root: Path, kept: str | None) -> list:
    paths = [root / _UTILITY] if kept == "outside_the_run" else [root]
    return migrate_paths(paths, unsafe_fixes=True)


@pytest.mark.parametrize(("utility", "kept"), list(itertools.product(sorted(UTILITIES), sorted(KEPT))))
def test_the_utility_stays_on_apex_where_its_project_keeps_initializing_apex(tmp_path, utility, kept):
    root = _project(tmp_path / "p", utility, kept)
    results = _run(root, kept)
    assert (root / _UTILITY).read_text() == UTILITIES[utility]
    reasons = " ".join(d.message for r in results if r.filename.endswith("checkpoint.py") for d in r.diagnostics)
    place = KEPT[kept][0]
    assert f"apex amp stays initialized at {place}:" in reasons, reasons


@pytest.mark.parametrize("utility", sorted(UTILITIES))
def test_the_utility_is_rewritten_where_the_run_migrates_every_initialize(tmp_path, utility):
    root = _project(tmp_path / "p", utility, None)
    _run(root, None)
    text = (root / _UTILITY).read_text()
    assert "scaler" in text and "TODO(ampmigrate)" in text and "from apex" not in text, text
    assert "from apex" not in (root / "train.py").read_text()


@pytest.mark.parametrize("utility", sorted(UTILITIES))
def test_a_folder_that_is_no_known_project_rewrites_the_utility_as_before(tmp_path, utility):
    # files gathered from many projects: another file's `initialize` is not the utility's
    root = tmp_path / "gathered"
    root.mkdir()
    (root / "checkpoint.py").write_text(UTILITIES[utility])
    (root / "apex_setup.py").write_text(KEPT["outside_the_run"][1])
    migrate_paths([root / "checkpoint.py"], unsafe_fixes=True)
    assert "scaler" in (root / "checkpoint.py").read_text()


@pytest.mark.parametrize("utility", sorted(UTILITIES))
def test_a_safe_run_offers_the_unsafe_fix_where_an_unsafe_run_migrates_every_initialize(tmp_path, utility):
    # O2 is rewritten only with --unsafe-fixes: the safe run leaves both, and says what that run would do
    root = _project(tmp_path / "p", utility, None)
    (root / "train.py").write_text(_TRAIN.format(prepare="").replace('opt_level="O1"', 'opt_level="O2"'))
    results = migrate_paths([root])
    assert (root / _UTILITY).read_text() == UTILITIES[utility]
    found = [d for r in results if r.filename.endswith("checkpoint.py") for d in r.diagnostics]
    assert found and not any("stays initialized" in d.message for d in found), [d.message for d in found]
    assert any(d.fix is not None for d in found), [d.message for d in found]
