"""Another file of the project reads apex amp's internal state (``amp._amp_state.loss_scalers``),
which ``amp.initialize`` fills: the initialize is not rewritten, not even with --unsafe-fixes,
since without it those reads raise ``AttributeError`` where no marker of this file can say so."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from migrate.api import migrate_paths

TRAIN = textwrap.dedent("""\
    import torch
    from apex import amp


    def main(model, optimizer, loader):
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
            optimizer.step()
            optimizer.zero_grad()
""")

# how a hook reads the loss scales apex keeps
READS = {
    "through amp": "from apex import amp\n\n\ndef scales():\n    return [s._loss_scale for s in amp._amp_state.loss_scalers]\n",
    "module import": ("try:\n    from apex.amp._amp_state import _amp_state\nexcept ImportError:\n    pass\n\n\n"
                      "def overflowed():\n    return any(s._has_overflow for s in _amp_state.loss_scalers)\n"),
    "from amp import": ("from apex.amp import _amp_state\n\n\n"
                        "def scales():\n    return [s.loss_scale() for s in _amp_state.loss_scalers]\n"),
    "aliased": ("from apex.amp import _amp_state as amp_state\n\n\n"
                "def scales():\n    return [s.loss_scale() for s in amp_state.loss_scalers]\n"),
}


def _project(root: Path, reads: str, layout: str = "imported") -> Path:
    """``imported``: ``train.py`` imports from the package ``hooks/`` that reads the state;
    ``one package``: both files in the package ``lib/``; ``flat``: unrelated scripts in one folder."""
    (root / ".git").mkdir(parents=True)
    if layout == "flat":
        (root / "log_scales.py").write_text(reads)
        (root / "train.py").write_text(TRAIN)
        return root / "train.py"
    package = root / ("lib" if layout == "one package" else "hooks")
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "log.py").write_text(reads)
    if layout == "one package":
        (package / "train.py").write_text(TRAIN)
        return package / "train.py"
    (root / "train.py").write_text(TRAIN.replace("import torch\n", "import torch\n\nfrom hooks import log\n", 1))
    return root / "train.py"


@pytest.mark.parametrize("layout", ["imported", "one package"])
@pytest.mark.parametrize("given", ["project", "file"])
@pytest.mark.parametrize("reads", sorted(READS))
def test_the_initialize_that_fills_it_is_not_rewritten(tmp_path, reads, given, layout):
    train = _project(tmp_path, READS[reads], layout)
    source = train.read_text()
    results = migrate_paths([tmp_path if given == "project" else train], write=False, unsafe_fixes=True)
    result = next(r for r in results if Path(r.filename).name == "train.py")
    assert result.new_source in (None, source), result.new_source
    messages = [d.message for d in result.diagnostics if d.code == "AMP002"]
    assert any("reads apex's internal state" in m and "log.py:" in m for m in messages), messages


@pytest.mark.parametrize("reader", ["no such read", "a read in a script of its own", "a read in a trainer of its own",
                                    "an import never read", "an aliased import never read"])
def test_a_file_no_such_read_reaches_is_rewritten(tmp_path, reader):
    reads = {"no such read": ("def scales():\n    return []\n", "imported"),
             "an import never read": ("from apex.amp import _amp_state\n\n\ndef scales():\n    return []\n", "imported"),
             "an aliased import never read": ("from apex.amp._amp_state import _amp_state as state\n\n\n"
                                              "def scales(_amp_state):\n    return _amp_state\n", "imported"),
             "a read in a script of its own": (READS["through amp"], "flat"),
             "a read in a trainer of its own": (TRAIN + READS["through amp"].split("\n\n\n", 1)[1], "imported")}
    train = _project(tmp_path, *reads[reader])
    result = next(r for r in migrate_paths([train], write=False) if Path(r.filename).name == "train.py")
    assert result.new_source and "amp.initialize" not in result.new_source, result.new_source


INITIALIZE_HALF = textwrap.dedent("""\
    import torch
    from apex import amp

    from engine import train_epoch
    from hooks import log


    def main(model, optimizer, loader):
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        train_epoch(model, optimizer, loader)
""")
# the training loop of TRAIN in a function of its own, initializing nothing
SCALE_HALF = TRAIN.replace("def main(", "def train_epoch(").replace(
    '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n', "")


@pytest.mark.parametrize("unsafe_fixes", [False, True])
@pytest.mark.parametrize("reads", sorted(READS))
def test_the_scale_half_stays_beside_an_initialize_half_kept_for_a_state_read(tmp_path, reads, unsafe_fixes):
    """The initialize half is kept for a read of apex's state in a third file; rewritten alone,
    its scale half would step a GradScaler on an optimizer apex's ``initialize`` still wraps."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "__init__.py").write_text("")
    (tmp_path / "hooks" / "log.py").write_text(READS[reads])
    (tmp_path / "train.py").write_text(INITIALIZE_HALF)
    (tmp_path / "engine.py").write_text(SCALE_HALF)
    results = {Path(r.filename).name: r for r in migrate_paths([tmp_path], write=False, unsafe_fixes=unsafe_fixes)}
    for name, source in (("train.py", INITIALIZE_HALF), ("engine.py", SCALE_HALF)):
        assert results[name].new_source in (None, source), (name, results[name].new_source)
    reasons = [d.message for d in results["engine.py"].diagnostics if d.code in ("AMP002", "AMP003")]
    assert any("internal state" in reason for reason in reasons), reasons
