"""apex amp split across two files: ``amp.initialize`` in one, ``amp.scale_loss`` in the other."""
from __future__ import annotations

import types
from pathlib import Path

import pytest

from generated.small_scripts import SCALE_HALF
from migrate import halves
from migrate.api import migrate_paths
from migrate.types import ERROR_CODE

ENGINE = SCALE_HALF

TRAIN = """import torch
from apex import amp

from engine import train_epoch


def main(model, optimizer, loader):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1"{options})
    train_epoch(model, optimizer, loader)
    torch.save({{"model": model.state_dict(), "amp": amp.state_dict()}}, "last.pt")
"""


def _project(root: Path, texts: dict[str, str]) -> Path:
    for name, text in texts.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _by_name(results) -> dict:
    return {Path(result.filename).name: result for result in results}


def _reasons(result) -> str:
    return " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix is not None) + " ".join(d.message for d in result.diagnostics)


def test_both_halves_in_one_run_are_migrated_together_safely(tmp_path):
    root = _project(tmp_path, {"engine.py": ENGINE, "train.py": TRAIN.format(options=", loss_scale=128.0")})
    migrate_paths([root])
    engine, train = (root / "engine.py").read_text(), (root / "train.py").read_text()
    # The scale half makes the GradScaler, with the options given to `initialize` in the other file.
    assert 'scaler = torch.amp.GradScaler("cuda", init_scale=128.0, growth_interval=2**31 - 1)' in engine
    assert "scaler.scale(loss).backward()" in engine and "scaler.step(optimizer)" in engine
    assert "with torch.autocast(" in engine
    # The initialize half imports it for its checkpoint.
    assert "from engine import scaler, train_epoch" in train
    assert '"amp": scaler.state_dict()' in train and "amp.initialize" not in train
    assert "apex" not in engine + train
    for text in (engine, train):
        compile(text, "<rewritten>", "exec")
    assert not any(result.changed for result in migrate_paths([root]))  # idempotent


def test_the_scale_half_may_import_the_initialize_half_relatively(tmp_path):
    setup = 'from apex import amp\n\n\ndef build(model, optimizer):\n    return amp.initialize(model, optimizer, opt_level="O1")\n'
    loop = ENGINE.replace("from apex import amp\n", "from apex import amp\n\nfrom .setup_amp import build\n")
    root = _project(tmp_path, {"pkg/__init__.py": "", "pkg/setup_amp.py": setup, "pkg/loop.py": loop})
    results = _by_name(migrate_paths([root]))
    assert results["setup_amp.py"].changed and results["loop.py"].changed
    assert "return model, optimizer" in (root / "pkg" / "setup_amp.py").read_text()
    assert 'scaler = torch.amp.GradScaler("cuda")' in (root / "pkg" / "loop.py").read_text()


def test_a_checkpoint_in_an_imported_initialize_half_is_not_rewritten(tmp_path):
    """Its scaler would live in the file that imports it: importing it back is circular."""
    setup = (
        'from apex import amp\n\n\ndef build(model, optimizer):\n    return amp.initialize(model, optimizer, opt_level="O1")\n\n\n'
        'def save():\n    return {"amp": amp.state_dict()}\n'
    )
    loop = ENGINE.replace("from apex import amp\n", "from apex import amp\n\nfrom setup_amp import build\n")
    (tmp_path / "setup_amp.py").write_text(setup)
    (tmp_path / "loop.py").write_text(loop)
    results = _by_name(migrate_paths([tmp_path], unsafe_fixes=True))
    assert not results["setup_amp.py"].changed and not results["loop.py"].changed  # neither half alone
    assert "circular" in _reasons(results["setup_amp.py"])
    assert "cannot be rewritten" in _reasons(results["loop.py"])


def test_a_guarded_initialize_makes_the_pair_unsafe_in_both_files(tmp_path):
    guarded = TRAIN.format(options="").replace(
        "    model, optimizer = amp.initialize(", "    if fp16:\n        model, optimizer = amp.initialize("
    ).replace("def main(model, optimizer, loader):", "def main(model, optimizer, loader, fp16):")
    (tmp_path / "engine.py").write_text(ENGINE)
    (tmp_path / "train.py").write_text(guarded)
    results = _by_name(migrate_paths([tmp_path]))
    assert not any(result.changed for result in results.values())
    assert "runs inside a block" in _reasons(results["train.py"])
    assert "train.py: `amp.initialize` runs inside a block" in _reasons(results["engine.py"])
    results = _by_name(migrate_paths([tmp_path], unsafe_fixes=True))
    assert all(result.changed for result in results.values())  # both, never one
    assert "if fp16" not in (tmp_path / "train.py").read_text()


def test_a_run_time_opt_level_has_the_scaler_made_where_initialize_was_and_handed_over(tmp_path):
    """(``test_scaler_handed_across_files`` generates the shapes.)"""
    (tmp_path / "engine.py").write_text(ENGINE)
    (tmp_path / "train.py").write_text(TRAIN.format(options="").replace('opt_level="O1"', "opt_level=args.opt_level"))
    results = _by_name(migrate_paths([tmp_path]))
    assert all(result.changed for result in results.values())
    train = (tmp_path / "train.py").read_text()
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=args.opt_level != "O0")' in train
    assert "train_epoch(model, optimizer, loader, scaler=scaler)" in train and '"amp": scaler.state_dict()' in train


def test_a_run_time_opt_level_makes_the_pair_unsafe_where_the_scaler_cannot_be_handed_over(tmp_path):
    (tmp_path / "engine.py").write_text(ENGINE)
    train = TRAIN.format(options="").replace('opt_level="O1"', "opt_level=args.opt_level")
    (tmp_path / "train.py").write_text(train.replace("    model, optimizer = amp.initialize(",
                                                     "    train_epoch(model, optimizer, [])\n    model, optimizer = amp.initialize("))
    results = _by_name(migrate_paths([tmp_path]))
    assert not any(result.changed for result in results.values())
    assert "opt level is computed at run time" in _reasons(results["engine.py"])


def test_one_half_given_alone_names_the_other_half(tmp_path):
    (tmp_path / "engine.py").write_text(ENGINE)
    (tmp_path / "train.py").write_text(TRAIN.format(options=""))
    (tmp_path / "pyproject.toml").write_text("")
    engine, = migrate_paths([tmp_path / "engine.py"])
    assert not engine.changed
    assert "`amp.initialize` is in train.py (line 8): give ampmigrate both files" in _reasons(engine).replace(str(tmp_path) + "/", "")
    train, = migrate_paths([tmp_path / "train.py"])
    assert not train.changed
    assert "`amp.scale_loss` is in engine.py (line 9)" in _reasons(train).replace(str(tmp_path) + "/", "")


def test_two_initialize_halves_importing_one_loop_are_not_paired(tmp_path):
    (tmp_path / "engine.py").write_text(ENGINE)
    (tmp_path / "train.py").write_text(TRAIN.format(options=""))
    (tmp_path / "finetune.py").write_text(TRAIN.format(options=", loss_scale=8.0"))
    results = _by_name(migrate_paths([tmp_path]))
    assert not any(result.changed for result in results.values())
    assert "nothing is initialized in this file" in _reasons(results["engine.py"])


def test_a_half_is_found_through_every_apex_spelling():
    found = halves.find_half(Path("a.py"), "import apex\n\ndef f(m, o):\n    return apex.amp.initialize(m, o)\n")
    assert found is not None and found.role == halves.INITIALIZE and found.line == 4
    found = halves.find_half(Path("b.py"), "from apex import amp as apex_amp\nwith apex_amp.scale_loss(l, o) as s:\n    s.backward()\n")
    assert found is not None and found.role == halves.SCALE_LOSS
    both = "from apex import amp\nm, o = amp.initialize(m, o)\nwith amp.scale_loss(l, o) as s:\n    s.backward()\n"
    assert halves.find_half(Path("c.py"), both) is None
    not_apex = "import apex\nfrom torch.cuda import amp\ncfg.initialize(x)\nwith amp.autocast():\n    pass\n"
    assert halves.find_half(Path("d.py"), not_apex) is None


def test_an_o0_initialize_half_makes_the_loop_plain_fp32(tmp_path):
    (tmp_path / "engine.py").write_text(ENGINE)
    (tmp_path / "train.py").write_text(TRAIN.format(options="").replace('opt_level="O1"', 'opt_level="O0"').replace(
        '    torch.save({"model": model.state_dict(), "amp": amp.state_dict()}, "last.pt")\n', ""))
    results = _by_name(migrate_paths([tmp_path]))
    assert all(result.changed for result in results.values())
    engine = (tmp_path / "engine.py").read_text()
    assert "loss.backward()" in engine and "GradScaler" not in engine and "autocast" not in engine


def test_a_half_given_alone_names_no_file_when_its_project_pairs_it_ambiguously(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "engine.py").write_text(ENGINE)
    (tmp_path / "train.py").write_text(TRAIN.format(options=""))
    (tmp_path / "finetune.py").write_text(TRAIN.format(options=", loss_scale=8.0"))
    engine, = migrate_paths([tmp_path / "engine.py"])
    assert "nothing is initialized in this file" in _reasons(engine)
    assert "train.py" not in _reasons(engine) and "finetune.py" not in _reasons(engine)
    train, = migrate_paths([tmp_path / "train.py"])  # the loop is finetune.py's too: not this file's alone
    # it stays on apex, needing this file's `initialize`: this file is left as it is, and says why
    assert not train.changed and "`amp.scale_loss` at engine.py:9 stays on apex amp" in _reasons(train), _reasons(train)


def test_a_run_in_workers_gives_the_results_of_a_run_in_one_process(tmp_path, monkeypatch):
    """Many files are read, prefiltered and migrated in worker processes while the halves are
    paired here: each file's result is the one a run in this process gives."""
    from migrate import run_in_workers

    notebook = (
        '{"cells": [{"cell_type": "code", "execution_count": null, "metadata": {}, "outputs": [], "source": '
        '["from apex import amp\\n", "model, optimizer = amp.initialize(model, optimizer)\\n"]}], '
        '"metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}\n'
    )
    root = _project(tmp_path, {
        "engine.py": ENGINE,
        "train.py": TRAIN.format(options=""),
        "notes.py": "# install apex for fp16\nuse_amp = True\n",  # not worth parsing
        "broken.py": "from apex import amp\ndef (:\n",
        "book.ipynb": notebook,
        "native.py": "import torch\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n    print(loss.item())\n",
        **{f"deprecated_{index}.py": "import torch\nscaler = torch.cuda.amp.GradScaler()\n" for index in range(3)},
    })
    (root / "latin.py").write_bytes(b"from apex import amp\nname = '\xe9'\n")  # not UTF-8
    pools = []
    monkeypatch.setattr(run_in_workers, "cores", lambda: 2)
    run = run_in_workers.WorkerPool.run
    monkeypatch.setattr(run_in_workers.WorkerPool, "run", lambda pool, *args: (pools.append(pool), run(pool, *args))[1])

    here = migrate_paths([root], jobs=1, write=False, select=["ALL"])
    assert not pools
    in_workers = migrate_paths([root], jobs=2, write=False, select=["ALL"])
    assert len(pools) == 2  # the triage, then the work, each in its workers
    assert in_workers == here
    results = _by_name(in_workers)
    assert "from engine import scaler, train_epoch" in results["train.py"].new_source  # paired
    assert results["latin.py"].error and results["broken.py"].diagnostics[0].code == ERROR_CODE
    assert results["notes.py"].diagnostics == () and results["book.ipynb"].diagnostics[0].code == "AMP002"


def _package(root: Path, engine: str) -> Path:
    """``lib/`` with a trainer that initializes and a models module that scales the loss, joined
    at run time (the model object is handed over): neither file imports the other."""
    package = root / "lib"
    for folder in (package, package / "training", package / "models"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text("")
    (root / "setup.py").write_text("")
    (package / "models" / "engine.py").write_text(engine)
    (package / "training" / "trainer.py").write_text(TRAIN.format(options="").replace("from engine import train_epoch\n", "").replace(
        '    torch.save({"model": model.state_dict(), "amp": amp.state_dict()}, "last.pt")\n', ""))
    return package


@pytest.mark.parametrize("given", ["package", "trainer"])
def test_an_initialize_half_stays_where_its_unpaired_other_half_cannot_be_rewritten(tmp_path, given):
    """Rewritten alone, even unsafe, the initialize half lost its call while the other half (its
    ``scale_loss`` takes ``**options``) kept calling apex's, which raises without ``initialize``."""
    package = _package(tmp_path, ENGINE.replace("amp.scale_loss(loss, optimizer)", "amp.scale_loss(loss, optimizer, **options)").replace(
        "def train_epoch(model, optimizer, loader):", "def train_epoch(model, optimizer, loader, **options):"))
    trainer = package / "training" / "trainer.py"
    results = migrate_paths([tmp_path] if given == "package" else [trainer], unsafe_fixes=True)
    assert not any(result.changed for result in results)
    result = next(result for result in results if result.filename.endswith("trainer.py"))
    assert "its other half, " in _reasons(result) and "engine.py" in _reasons(result) and "neither file imports the other" in _reasons(result)


def test_unpaired_halves_in_a_package_that_can_be_rewritten_keep_their_unsafe_rewrites(tmp_path):
    _package(tmp_path, ENGINE)
    results = _by_name(migrate_paths([tmp_path], unsafe_fixes=True))
    assert results["engine.py"].changed and results["trainer.py"].changed


def test_a_scale_half_alone_runs_autocast_only_where_its_scaled_backward_does(tmp_path):
    """``initialize`` is elsewhere, its flag unseen: the region is enabled by the test of the arms
    the scaled backward runs in (a native arm, an apex one, a plain one), not on every run (the
    default fp32 runs took an unscaled half-precision forward)."""
    engine = (
        "import torch\nfrom apex import amp\n\n\n"
        "def train_epoch(model, optimizer, loader, cfg, scaler=None):\n"
        "    for x, y in loader:\n"
        "        loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "        if cfg.amp == 'native':\n"
        "            scaler.scale(loss).backward()\n"
        "        elif not cfg.amp == 'none':\n"
        "            with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "                scaled_loss.backward()\n"
        "        else:\n"
        "            loss.backward()\n"
        "        optimizer.step()\n"
    )
    (tmp_path / "engine.py").write_text(engine)
    result, = migrate_paths([tmp_path / "engine.py"], unsafe_fixes=True)
    migrated = (tmp_path / "engine.py").read_text()
    assert result.changed and "enabled=not (cfg.amp == 'native') and not cfg.amp == 'none'" in migrated, migrated


@pytest.mark.parametrize("test, enabled", [
    ("cfg.fp16", "bool(cfg.fp16)"),
    ("cfg.fp16 and not cfg.cpu", "bool(cfg.fp16 and not cfg.cpu)"),
    ("cfg.fp16 == 1", "cfg.fp16 == 1"),
    ("not cfg.fp32", "not cfg.fp32"),
])
def test_a_scale_halfs_arm_test_enables_autocast_as_a_bool(tmp_path, test, enabled):
    """The arms' test becomes autocast's ``enabled=``, which takes a bool only: an int flag
    (argparse ``type=int``, a JSON 0/1) raised TypeError there, on the fp32 path too."""
    (tmp_path / "engine.py").write_text(
        "import torch\nfrom apex import amp\n\n\n"
        "def train_epoch(model, optimizer, loader, cfg):\n"
        "    for x, y in loader:\n"
        "        loss = torch.nn.functional.mse_loss(model(x), y)\n"
        f"        if {test}:\n"
        "            with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "                scaled_loss.backward()\n"
        "        else:\n"
        "            loss.backward()\n"
        "        optimizer.step()\n"
    )
    result, = migrate_paths([tmp_path / "engine.py"], unsafe_fixes=True)
    migrated = (tmp_path / "engine.py").read_text()
    written = "".join(migrated.split())  # however the line is wrapped
    assert result.changed and any(f"enabled={spelling})".replace(" ", "") in written
                                  for spelling in (enabled, f"({enabled})")), migrated
    cfg = types.SimpleNamespace(fp16=1, cpu=0, fp32=0)
    assert type(eval(enabled, {"cfg": cfg})) is bool


def test_num_losses_in_the_initialize_half_is_read_where_the_losses_are_scaled(tmp_path):
    """``num_losses=2`` beside ``initialize``: apex made two scalers, but a file scaling every loss
    with id 0 used one, which one GradScaler is. Where the scale half uses two ids, one GradScaler
    serves both (the scale half makes it, with no ``initialize`` of its own): unsafe, said there."""
    train = TRAIN.format(options=", num_losses=2")
    one = _project(tmp_path / "one", {"engine.py": ENGINE, "train.py": train})
    migrate_paths([one])
    assert "from apex" not in (one / "engine.py").read_text() + (one / "train.py").read_text()
    assert "TODO(ampmigrate)" not in (one / "engine.py").read_text()
    two_ids = ENGINE.replace("amp.scale_loss(loss, optimizer)", "amp.scale_loss(loss, optimizer, loss_id=1)")
    two = _project(tmp_path / "two", {"engine.py": two_ids, "train.py": train})
    migrate_paths([two])
    assert (two / "engine.py").read_text() == two_ids and (two / "train.py").read_text() == train
    results = _by_name(migrate_paths([two], unsafe_fixes=True, fix=False))
    assert "one GradScaler serves every loss" in _reasons(results["engine.py"])


def test_a_half_failing_on_its_own_reason_gives_that_reason_not_the_loop_through_its_other_half(tmp_path):
    """The initialize half hands the module on (``Checkpointer(model, amp=amp)``): the scale half
    cannot be rewritten because of it, and the initialize half says its own reason, once."""
    train = TRAIN.format(options="").replace(
        "    train_epoch(model, optimizer, loader)\n", "    checkpointer = Checkpointer(model, amp=amp)\n    train_epoch(model, optimizer, loader)\n")
    root = _project(tmp_path, {"engine.py": ENGINE, "train.py": train})
    results = _by_name(migrate_paths([root], unsafe_fixes=True, write=False))
    [initialize] = [d.message for d in results["train.py"].diagnostics if "amp.initialize" in d.message]
    assert "handed on here" in initialize and "its other half" not in initialize, initialize
    [scaled] = [d.message for d in results["engine.py"].diagnostics if "amp.scale_loss" in d.message]
    assert scaled.count("its other half") == 1 and "handed on here" in scaled, scaled
