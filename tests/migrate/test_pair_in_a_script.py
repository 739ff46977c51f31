"""A pair of files split across a script and the module it imports: the script's ``amp.initialize``
under ``if __name__ == "__main__":`` (it runs whenever the script does), and apex calls that only
a comment, a docstring or a string spells (they call nothing, so they decide nothing)."""
from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from generated.small_scripts import SCALE_HALF
from migrate import halves
from migrate.api import migrate_paths

SCRIPT = """import argparse

import torch
from apex import amp

from loop import train_epoch

{guard}
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda"
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
{initialize}    batches = [(torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)) for _ in range(args.steps)]
    train_epoch(model, optimizer, batches)
"""

INITIALIZE = '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", loss_scale=128.0)\n'
GUARDS = ('if __name__ == "__main__":', "if __name__ == '__main__':", 'if "__main__" == __name__:')
# apex calls only spelled: a comment, a docstring, a string
ASIDES = ("", "# model, optimizer = amp.initialize(model, optimizer)  (kept from an older version)\n",
          '\n"""Once: `model, optimizer = amp.initialize(model, optimizer)`."""\n',
          'USAGE = "call amp.initialize(model, optimizer) before train_epoch"\n')


def _project(root: Path, guard: str, aside: str = "", initialize: str = INITIALIZE) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "loop.py").write_text(SCALE_HALF.replace("from apex import amp\n", "from apex import amp\n" + aside))
    (root / "train.py").write_text(SCRIPT.format(guard=guard, initialize=initialize))
    return root


def _by_name(results) -> dict:
    return {Path(result.filename).name: result for result in results}


def _reasons(result) -> str:
    return " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix is not None)


@pytest.mark.parametrize("guard, aside", list(itertools.product(GUARDS, ASIDES)))
def test_an_initialize_under_the_main_guard_is_migrated_with_its_loop_safely(tmp_path, guard, aside):
    root = _project(tmp_path / "p", guard, aside)
    results = _by_name(migrate_paths([root]))
    assert results["train.py"].changed and results["loop.py"].changed, _reasons(results["train.py"])
    script, loop = (root / "train.py").read_text(), (root / "loop.py").read_text()
    assert "amp.initialize(model" not in script and "from apex" not in script + loop
    assert 'scaler = torch.amp.GradScaler("cuda", init_scale=128.0, growth_interval=2**31 - 1)' in loop
    assert not any(result.changed for result in migrate_paths([root]))  # idempotent


@pytest.mark.parametrize("guard", [
    'if __name__ == "__main__":\n    pass\nif use_amp:',  # a flag, not the main guard
    'if __name__ != "__main__":',
    'if __name__ == "__main__" and use_amp:',
    'if __name__ == "__main__":\n    pass\nelse:',
])
def test_an_initialize_under_any_other_test_keeps_the_pair_unsafe(tmp_path, guard):
    root = _project(tmp_path / "p", guard)
    (root / "train.py").write_text("use_amp = True\n" + (root / "train.py").read_text())
    results = _by_name(migrate_paths([root]))
    assert not any(result.changed for result in results.values())
    assert "runs inside a block" in _reasons(results["train.py"])


def test_an_initialize_nested_in_the_main_guard_keeps_the_pair_unsafe(tmp_path):
    nested = "    if args.steps:\n    " + INITIALIZE
    root = _project(tmp_path / "p", GUARDS[0], initialize=nested)
    results = _by_name(migrate_paths([root]))
    assert not any(result.changed for result in results.values())
    assert "runs inside a block" in _reasons(results["train.py"])


@pytest.mark.parametrize("aside", ASIDES[1:])
def test_a_call_only_spelled_in_a_file_decides_no_half(tmp_path, aside):
    both = SCALE_HALF.replace("from apex import amp\n", "from apex import amp\n" + aside)
    assert halves.halves_called(both) == {halves.SCALE_LOSS}
    found = halves.find_half(tmp_path / "loop.py", both)
    assert found is not None and found.role == halves.SCALE_LOSS
    keeper = "from apex import amp\n" + aside + "\ndef save(path):\n    return {'amp': amp.state_dict()}\n"
    assert halves.find_state_keeper(tmp_path / "ckpt.py", keeper) is not None


@pytest.mark.slow
def test_a_script_pair_migrated_safely_trains_the_same(tmp_path):
    original = _project(tmp_path / "original", GUARDS[0], ASIDES[1])
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    assert "apex" not in (migrated / "train.py").read_text() + (migrated / "loop.py").read_text()
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    # each script runs beside its own loop.py: the apex one on ampshim, the rewrite on torch.amp
    result = compare(Target(str(original / "train.py")), Target(str(migrated / "train.py")), [], device="cpu",
                     steps=20, parallel=True, timeout=600)
    assert result.verdict == SAME, as_text(result)


# how the script reaches `train_epoch` through the package `utils`, whose `__init__.py` re-exports it
THROUGH_THE_PACKAGE = {
    "import utils": "utils.train_epoch",
    "from utils import train_epoch": "train_epoch",
    "from utils import *": "train_epoch",
    "from utils import train_epoch as run_epoch": "run_epoch",
    "import utils as u": "u.train_epoch",
}
RE_EXPORTS = ("from .loop import train_epoch\nfrom .data import make_batches\n", "from .data import *\nfrom .loop import *\n",
              "from .loop import (\n    train_epoch,\n)\n")


def _package_project(root: Path, spelled: str, called: str, re_export: str, guard: str = GUARDS[0]) -> Path:
    (root / "utils").mkdir(parents=True)
    (root / "utils" / "__init__.py").write_text(re_export)
    (root / "utils" / "data.py").write_text("def make_batches(n):\n    return list(range(n))\n")
    (root / "utils" / "loop.py").write_text(SCALE_HALF)
    script = SCRIPT.format(guard=guard, initialize=INITIALIZE).replace("from loop import train_epoch", spelled)
    (root / "train.py").write_text(script.replace("    train_epoch(model", f"    {called}(model"))
    return root


@pytest.mark.parametrize("spelled, re_export", list(itertools.product(THROUGH_THE_PACKAGE, RE_EXPORTS)))
def test_a_half_reached_through_a_package_that_re_exports_it_is_paired(tmp_path, spelled, re_export):
    root = _package_project(tmp_path / "p", spelled, THROUGH_THE_PACKAGE[spelled], re_export)
    results = _by_name(migrate_paths([root]))
    assert results["train.py"].changed and results["loop.py"].changed, _reasons(results["train.py"])
    script, loop = (root / "train.py").read_text(), (root / "utils" / "loop.py").read_text()
    assert "from apex" not in script + loop and "GradScaler(" in loop
    assert "from utils.loop import scaler" not in script  # the script saves no state: it needs no scaler
    assert not any(result.changed for result in migrate_paths([root]))


def test_a_package_name_that_is_not_re_exported_pairs_nothing(tmp_path):
    root = _package_project(tmp_path / "p", "from utils import make_batches", "make_batches", RE_EXPORTS[0])
    results = _by_name(migrate_paths([root]))
    assert not results["train.py"].changed and not results["loop.py"].changed
    assert "no file found with this one scales the loss" in _reasons(results["train.py"])


@pytest.mark.slow
def test_a_pair_through_a_package_migrated_safely_trains_the_same(tmp_path):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = _package_project(tmp_path / "original", "import utils", "utils.train_epoch", RE_EXPORTS[1])
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    result = compare(Target(str(original / "train.py")), Target(str(migrated / "train.py")), [], device="cpu",
                     steps=20, parallel=True, timeout=600)
    assert result.verdict == SAME, as_text(result)
