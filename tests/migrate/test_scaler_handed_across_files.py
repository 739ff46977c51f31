"""``amp.initialize`` with an opt level (or ``enabled=``, or a loss scale) known only at run time
in ``main()`` of a script, ``amp.scale_loss`` in the module whose training function it imports
and calls: the GradScaler is made in ``main()``, as a one-file rewrite makes it, and handed over
(``train_epoch(..., scaler=scaler)``), not made once at the module's top level as an O1 one
whatever the level. Generated over the spellings of the level, the import, the call and the
training module; the negatives are the shapes where the scaler could reach the function another way."""
from __future__ import annotations

import itertools
import re
import runpy
import shutil
import sys
from pathlib import Path

import pytest

from migrate.api import migrate_paths

# the runs here are on the CPU, where GradScaler("cuda") turns itself off, saying so
pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

SCRIPT = """import argparse

import torch
from apex import amp

{imports}


{header}
    parser = argparse.ArgumentParser()
    parser.add_argument("--opt-level", default="O1")
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--loss-scale", default=None)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
{setup}    model, optimizer = amp.initialize(model, optimizer, {options})
    batches = [(torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)) for _ in range(args.steps)]
{calls}
{footer}"""
# where the script initializes: in `main()`, or right under its `if __name__ == "__main__":`
WHERE = {
    "main()": ("def main():", '    return model\n\n\nif __name__ == "__main__":\n    main()\n'),
    "script": ('if __name__ == "__main__":', ""),
}

# the opt level, `enabled=` or the loss scale, known when the script runs
OPTIONS = {
    "argument": ("", "opt_level=args.opt_level"),
    "computed": ('    level = "O1" if args.amp else "O0"\n', "opt_level=level"),
    "enabled": ("", 'opt_level="O1", enabled=args.amp'),
    "loss scale": ("", 'opt_level="O1", loss_scale=args.loss_scale'),
}
# how the script reaches the training function: its import, then the name it calls
IMPORTS = {
    "by name": ("from engine import train_epoch", "train_epoch"),
    "renamed": ("from engine import train_epoch as run_epoch", "run_epoch"),
    "beside another": ("from engine import evaluate, train_epoch", "train_epoch"),
    "the module": ("import engine", "engine.train_epoch"),
    "the module renamed": ("import engine as loop", "loop.train_epoch"),
}
CALLS = {
    "once": "    {name}(model, optimizer, batches)\n    evaluate(model, batches)",
    "in a loop": "    for epoch in range(2):\n        {name}(model, optimizer, batches[epoch::2])",
    "by keyword": "    {name}(model=model, optimizer=optimizer, batches=batches)",
}

ENGINE_DIRECT = """import torch
from apex import amp


def train_epoch(model, optimizer, batches):
    for x, y in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()


def evaluate(model, batches):
    with torch.no_grad():
        return sum(float(torch.nn.functional.mse_loss(model(x), y)) for x, y in batches)
"""

ENGINE_THROUGH_A_STEP = """import torch
from apex import amp


def _step(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    return loss


def train_epoch(model, optimizer, batches, log_every=10):
    for index, (x, y) in enumerate(batches):
        loss = _step(model, optimizer, x, y)
        if index % log_every == 0:
            print(index, float(loss))


def evaluate(model, batches):
    with torch.no_grad():
        return sum(float(torch.nn.functional.mse_loss(model(x), y)) for x, y in batches)
"""
ENGINES = {"direct": ENGINE_DIRECT, "through a step": ENGINE_THROUGH_A_STEP}


def _project(root: Path, option: str, spelled: str, call: str, engine: str, where: str = "main()") -> Path:
    setup, options = OPTIONS[option]
    header, footer = WHERE[where]
    imports, name = IMPORTS[spelled]
    calls = CALLS[call].format(name=name)
    if "evaluate" in calls and "evaluate" not in imports:
        imports += "\nfrom engine import evaluate"
    root.mkdir(parents=True, exist_ok=True)
    (root / "engine.py").write_text(ENGINES[engine])
    (root / "train.py").write_text(SCRIPT.format(imports=imports, header=header, setup=setup, options=options, calls=calls,
                                                 footer=footer))
    return root


def _run(root: Path, *argv: str) -> dict:
    """The script run in this process, on the CPU, as ``python train.py``: its globals."""
    saved = sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = ["train.py", *argv], [str(root)]
    try:
        return runpy.run_path(str(root / "train.py"), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved
        for name in [name for name, module in sys.modules.items() if str(getattr(module, "__file__", "")).startswith(str(root))]:
            del sys.modules[name]  # the next project's `engine` is another


def _by_name(results) -> dict:
    return {Path(result.filename).name: result for result in results}


# every option, import and training module; the calls and places cycled through them (all six pairs)
VARIANTS = [(option, spelled, call, engine, where) for (option, spelled, engine), call, where in
            zip(itertools.product(OPTIONS, IMPORTS, ENGINES), itertools.cycle(CALLS), itertools.cycle(WHERE))]


@pytest.mark.parametrize("option, spelled, call, engine, where", VARIANTS)
def test_the_scaler_is_made_where_initialize_was_and_handed_over(tmp_path, option, spelled, call, engine, where):
    root = _project(tmp_path, option, spelled, call, engine, where)
    results = _by_name(migrate_paths([root]))
    assert results["train.py"].changed and results["engine.py"].changed  # safe: both, in the default run
    script, module = (root / "train.py").read_text(), (root / "engine.py").read_text()
    assert "import amp" not in script + module and "GradScaler(" not in module
    name = IMPORTS[spelled][1]
    assert script.count(f"{name}(") == script.count("scaler=scaler") >= 1  # at each call of it, and only there
    assert re.search(r"def train_epoch\([^)]*batches,[^)]* scaler: torch\.amp\.GradScaler\s*\)", module)
    assert "enabled=scaler.is_enabled()" in module and "scaler.step(optimizer)" in module
    assert "def evaluate(model, batches):" in module  # it scales nothing: it takes nothing
    if engine == "through a step":
        assert "loss = _step(model, optimizer, x, y, scaler=scaler)" in module
    assert not any(result.changed for result in migrate_paths([root]))  # idempotent
    for argv in ([], ["--amp"], ["--opt-level", "O0"]):  # runs each way (on the CPU, GradScaler("cuda") is off)
        _run(root, *argv)  # an exception (a call without the scaler, a TypeError) fails it


@pytest.mark.parametrize("option", ["argument", "computed"])
def test_the_opt_level_keeps_its_meaning_and_o2_stops(tmp_path, option):
    root = _project(tmp_path, option, "by name", "once", "direct")
    migrate_paths([root])
    script = (root / "train.py").read_text()
    if option == "argument":
        assert 'scaler = torch.amp.GradScaler("cuda", enabled=args.opt_level != "O0")' in script
        with pytest.raises(RuntimeError, match="native torch.amp has no O2/O3"):
            _run(root, "--opt-level", "O2")
    else:
        assert 'enabled=level != "O0"' in script


def _unchanged_pair_is_unsafe(root: Path) -> None:
    results = _by_name(migrate_paths([root]))
    assert not results["train.py"].changed and not results["engine.py"].changed
    reasons = " ".join(d.fix.why_unsafe for d in results["engine.py"].diagnostics if d.fix is not None)
    assert "computed at run time" in reasons or "decided at run time" in reasons or "known only at run time" in reasons, reasons


def _edit(root: Path, name: str, old: str, new: str) -> None:
    path = root / name
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("option", list(OPTIONS))
def test_called_before_the_scaler_is_made_it_stays_unsafe(tmp_path, option):
    root = _project(tmp_path, option, "by name", "by keyword", "direct")
    _edit(root, "train.py", "    model, optimizer = amp.initialize(",
          "    train_epoch(model, optimizer, [])\n    model, optimizer = amp.initialize(")
    _unchanged_pair_is_unsafe(root)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_called_from_another_function_of_the_script_it_stays_unsafe(tmp_path, option):
    root = _project(tmp_path, option, "by name", "by keyword", "direct")
    _edit(root, "train.py", "\n\nif __name__", "\n\ndef warm_up(model, optimizer):\n    train_epoch(model, optimizer, [])\n\n\nif __name__")
    _unchanged_pair_is_unsafe(root)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_handed_on_rather_than_called_it_stays_unsafe(tmp_path, option):
    root = _project(tmp_path, option, "by name", "by keyword", "direct")
    _edit(root, "train.py", "    train_epoch(model=model", "    run = train_epoch\n    run(model=model")
    _unchanged_pair_is_unsafe(root)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_called_by_its_own_module_too_it_stays_unsafe(tmp_path, option):
    root = _project(tmp_path, option, "by name", "by keyword", "direct")
    _edit(root, "engine.py", "\n\ndef evaluate(", "\n\ndef retrain(model, optimizer, batches):\n    train_epoch(model, optimizer, batches)\n"
          "\n\ndef evaluate(")
    _unchanged_pair_is_unsafe(root)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_imported_by_a_third_file_too_it_stays_unsafe(tmp_path, option):
    root = _project(tmp_path, option, "by name", "by keyword", "direct")
    (root / "finetune.py").write_text("from engine import train_epoch\n\n\ndef finetune(model, optimizer, batches):\n"
                                      "    train_epoch(model, optimizer, batches)\n")
    _unchanged_pair_is_unsafe(root)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_an_initialize_under_a_flag_stays_unsafe(tmp_path, option):
    root = _project(tmp_path, option, "by name", "by keyword", "direct")
    _edit(root, "train.py", "    model, optimizer = amp.initialize(model, optimizer,",
          "    if args.steps:\n        model, optimizer = amp.initialize(model, optimizer,")
    results = _by_name(migrate_paths([root]))
    assert not results["train.py"].changed and not results["engine.py"].changed


@pytest.mark.parametrize("option", list(OPTIONS))
def test_the_module_s_function_handed_on_stays_unsafe(tmp_path, option):
    root = _project(tmp_path, option, "the module", "by keyword", "direct")
    _edit(root, "train.py", "    engine.train_epoch(model=model", "    run = engine.train_epoch\n    run(model=model")
    _unchanged_pair_is_unsafe(root)


@pytest.mark.parametrize("spelled", ["from pkg import engine", "from pkg import engine as loop", "from pkg.engine import train_epoch"])
def test_a_module_of_a_package_is_handed_the_scaler_too(tmp_path, spelled):
    root = _project(tmp_path, "argument", "by name", "once", "direct")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "engine.py").rename(root / "pkg" / "engine.py")
    called = {"from pkg import engine": "engine.train_epoch", "from pkg import engine as loop": "loop.train_epoch"}.get(spelled, "train_epoch")
    _edit(root, "train.py", "from engine import train_epoch\nfrom engine import evaluate", f"{spelled}\nfrom pkg.engine import evaluate")
    _edit(root, "train.py", "    train_epoch(model, optimizer, batches)", f"    {called}(model, optimizer, batches)")
    results = _by_name(migrate_paths([root]))
    assert results["train.py"].changed and results["engine.py"].changed
    assert f"{called}(model, optimizer, batches, scaler=scaler)" in (root / "train.py").read_text()
    _run(root)


def test_a_decorated_training_function_stays_unsafe(tmp_path):
    """A decorator may call it some other way: its calls are not all seen."""
    root = _project(tmp_path, "argument", "by name", "once", "direct")
    _edit(root, "engine.py", "def train_epoch(", "def logged(function):\n    return function\n\n\n@logged\ndef train_epoch(")
    _unchanged_pair_is_unsafe(root)


@pytest.mark.slow
@pytest.mark.parametrize("argv, where", [(["--opt-level", "O1"], "main()"), (["--opt-level", "O0"], "main()"),
                                         (["--opt-level", "O1"], "script")])
def test_a_pair_handed_its_scaler_trains_the_same(tmp_path, argv, where):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = _project(tmp_path / "original", "argument", "by name", "in a loop", "through a step", where)
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    result = compare(Target(str(original / "train.py")), Target(str(migrated / "train.py")), argv, device="cpu",
                     steps=6, parallel=True, timeout=600)
    assert result.verdict == SAME, as_text(result)
