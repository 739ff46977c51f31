"""Several scripts initializing apex amp alike, each importing one trainer module that scales the
loss (a folder of experiment scripts and their shared ``trainer.py``): the trainer's module-level
GradScaler serves each script, so each is paired with it where their plans agree, and all are
migrated safely together. ``initialize`` in a ``with`` block (``with timer("model"):``) or a
``try`` body runs whenever the script does. Where one script initializes differently, or sits
under a test, none is paired: the rewrites stay unsafe, as for a loop shared by scripts that
disagree."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from generated.small_scripts import SCALE_HALF
from migrate.api import migrate_paths
from test_pair_in_a_script import INITIALIZE, SCRIPT

GUARD = 'if __name__ == "__main__":'
# where each script's `initialize` sits: the main guard's body, a `with` block, a `try` body
PLACES = {
    "guard": INITIALIZE,
    "with": "    with timer(\"model\"):\n    " + INITIALIZE,
    "try": "    try:\n    " + INITIALIZE + "    except RuntimeError:\n        raise\n",
}
TIMER = "import contextlib\n\n\n@contextlib.contextmanager\ndef timer(name):\n    yield\n\n\n"


def _project(root: Path, places: list[str], initializes: list[str] | None = None) -> Path:
    """``loop.py`` scaling the loss and one script per place, ``exp<i>.py``, each initializing
    with its line of ``initializes`` (``INITIALIZE`` by default)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "loop.py").write_text(SCALE_HALF)
    for index, place in enumerate(places):
        line = (initializes or [INITIALIZE] * len(places))[index]
        script = SCRIPT.format(guard=GUARD, initialize=PLACES[place].replace(INITIALIZE, line))
        if place == "with":
            script = script.replace("from loop import train_epoch\n", "from loop import train_epoch\n\n" + TIMER)
        (root / f"exp{index}.py").write_text(script)
    return root


def _by_name(results) -> dict:
    return {Path(result.filename).name: result for result in results}


def _reasons(result) -> str:
    return " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix is not None)


@pytest.mark.parametrize("places", [["guard", "guard"], ["guard", "with", "try"], ["with", "with"], ["try", "guard"]],
                         ids="-".join)
def test_scripts_initializing_alike_are_migrated_with_their_trainer(tmp_path, places):
    root = _project(tmp_path / "p", places)
    results = _by_name(migrate_paths([root]))
    assert all(result.changed for result in results.values()), {name: _reasons(r) for name, r in results.items()}
    loop = (root / "loop.py").read_text()
    assert 'scaler = torch.amp.GradScaler("cuda", init_scale=128.0, growth_interval=2**31 - 1)' in loop
    assert "scaler.scale(loss).backward()" in loop and "with torch.autocast(" in loop
    for index in range(len(places)):
        script = (root / f"exp{index}.py").read_text()
        assert "amp.initialize" not in script and "apex" not in script, script
        compile(script, f"exp{index}.py", "exec")
    assert not any(result.changed for result in migrate_paths([root]))  # idempotent


@pytest.mark.parametrize("other", [
    INITIALIZE.replace("loss_scale=128.0", "loss_scale=8.0"),
    INITIALIZE.replace('opt_level="O1"', 'opt_level="O0"'),
    "    if args.steps > 10:\n    " + INITIALIZE,
], ids=["other-scale", "O0", "under-a-test"])
def test_one_script_initializing_differently_pairs_none(tmp_path, other):
    root = _project(tmp_path / "p", ["guard", "guard", "guard"], [INITIALIZE, other, INITIALIZE])
    results = _by_name(migrate_paths([root]))
    assert not any(result.changed for result in results.values()), {name: r.new_source for name, r in results.items()}


def test_a_script_also_importing_another_trainer_pairs_none(tmp_path):
    root = _project(tmp_path / "p", ["guard", "guard"])
    (root / "loop2.py").write_text(SCALE_HALF.replace("train_epoch", "train_again"))
    script = (root / "exp1.py").read_text()
    (root / "exp1.py").write_text(script.replace("from loop import train_epoch\n", "from loop import train_epoch\nfrom loop2 import train_again\n"))
    results = _by_name(migrate_paths([root]))
    assert not results["loop.py"].changed and not results["exp0.py"].changed


def test_the_trainer_given_alone_names_no_script(tmp_path):
    """Which script's options it would take is not one file's: none is named, nothing changes."""
    root = _project(tmp_path / "p", ["guard", "guard"])
    (root / "pyproject.toml").write_text("")
    loop, = migrate_paths([root / "loop.py"])
    assert not loop.changed and "exp0.py" not in _reasons(loop) and "exp1.py" not in _reasons(loop)


@pytest.mark.slow
def test_each_script_trains_the_same_after_the_migration(tmp_path):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = _project(tmp_path / "original", ["with", "guard"])
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    for name in ("exp0.py", "exp1.py"):
        result = compare(Target(str(original / name)), Target(str(migrated / name)), [], device="cpu",
                         steps=20, parallel=True, timeout=600)
        assert result.verdict == SAME, as_text(result)
