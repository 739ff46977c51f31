"""apex's cast decorators (``@amp.float_function``, ``amp.float_function(_C.nms)``,
``amp.disable_casts()``) in a file of the project that stays on apex after the run: they cast
only while apex's ``amp.initialize`` runs, so the rewrite of an ``amp.initialize`` (native
autocast from then on) would hand their float32-only kernels float16 inputs. Such a rewrite is
unsafe, on both halves of a pair; it is safe where the decorators are migrated with it."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from migrate.api import migrate_paths

LAYERS = {
    "decorator": "import torch\nfrom apex import amp\n\n\n@amp.float_function\ndef roi_pool(features, boxes):\n"
                 "    return features.sum(dim=1) + boxes.sum()\n",
    "call form": "import torch\nfrom apex import amp\n\n\ndef _pool(features, boxes):\n    return features.sum(dim=1) + boxes.sum()\n\n\n"
                 "roi_pool = amp.float_function(_pool)\n",
    "half decorator": "import torch\nfrom apex import amp\n\n\n@amp.half_function\ndef roi_pool(features, boxes):\n"
                      "    return features.sum(dim=1) + boxes.sum()\n",
    "disabled casts": "import torch\nfrom apex import amp\n\n\ndef roi_pool(features, boxes):\n    with amp.disable_casts():\n"
                      "        return features.float().sum(dim=1) + boxes.sum()\n",
}

ONE_FILE = """import torch
from apex import amp

from layers import roi_pool


def main(model, optimizer, batches):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(roi_pool(model(x), y), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""
TRAIN_HALF = """import torch
from apex import amp

from engine import train_epoch


def main(args, model, optimizer, batches):
    model, optimizer = amp.initialize(model, optimizer, opt_level={level})
    train_epoch(model, optimizer, batches)
"""
ENGINE_HALF = """import torch
from apex import amp

from layers import roi_pool


def train_epoch(model, optimizer, batches):
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(roi_pool(model(x), y), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""
# another training script whose `amp.initialize` a safe run leaves on apex (O2)
KEEPER = ONE_FILE.replace('opt_level="O1"', 'opt_level="O2"')
SHAPES = {
    "one file": {"train.py": ONE_FILE},
    "pair, run-time level": {"train.py": TRAIN_HALF.format(level="args.opt_level"), "engine.py": ENGINE_HALF},
    "pair, literal level": {"train.py": TRAIN_HALF.format(level='"O1"'), "engine.py": ENGINE_HALF},
}


def _project(root: Path, shape: str, layers: str, keeper: bool) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'detector'\n")
    (root / "layers.py").write_text(LAYERS[layers])
    for name, text in SHAPES[shape].items():
        (root / name).write_text(text)
    if keeper:
        (root / "finetune.py").write_text(KEEPER)
    return root


def _by_name(results) -> dict:
    return {Path(result.filename).name: result for result in results}


def _reasons(result) -> str:
    return " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix is not None)


@pytest.mark.parametrize("shape, layers", list(itertools.product(SHAPES, LAYERS)))
def test_kept_by_another_initialize_the_rewrite_is_unsafe_on_both_halves(tmp_path, shape, layers):
    root = _project(tmp_path, shape, layers, keeper=True)
    results = _by_name(migrate_paths([root]))
    for name in SHAPES[shape]:
        assert not results[name].changed, name
        reasons = _reasons(results[name])
        assert "apex's cast decorators stay on apex (layers.py:" in reasons and "finetune.py:" in reasons, reasons
    assert not results["layers.py"].changed  # they stay with finetune.py's apex
    # with --unsafe-fixes finetune.py goes too, and the decorators with it: nothing keeps them
    results = _by_name(migrate_paths([root], unsafe_fixes=True))
    assert all(result.changed for result in results.values())
    assert "cast decorators stay on apex" not in " ".join(_reasons(results[name]) for name in SHAPES[shape])


@pytest.mark.parametrize("shape, layers", list(itertools.product(SHAPES, LAYERS)))
def test_left_out_of_the_run_the_decorators_make_the_rewrite_unsafe(tmp_path, shape, layers):
    root = _project(tmp_path, shape, layers, keeper=False)
    results = _by_name(migrate_paths([root / name for name in SHAPES[shape]]))
    for name in SHAPES[shape]:
        assert not results[name].changed, name
        assert "layers.py is not in this run" in _reasons(results[name]), _reasons(results[name])


def test_in_a_folder_gathered_from_many_projects_another_file_s_decorators_are_not_counted(tmp_path):
    root = _project(tmp_path, "one file", "decorator", keeper=True)
    (root / "pyproject.toml").unlink()
    results = _by_name(migrate_paths([root]))
    assert results["train.py"].changed and "cast decorators" not in _reasons(results["train.py"])


@pytest.mark.parametrize("shape, layers", list(itertools.product(SHAPES, LAYERS)))
def test_migrated_with_the_decorators_the_rewrite_is_as_safe_as_before(tmp_path, shape, layers):
    root = _project(tmp_path, shape, layers, keeper=False)
    results = _by_name(migrate_paths([root]))
    assert "cast decorators stay on apex" not in " ".join(_reasons(result) for result in results.values())
    assert all(result.changed for result in results.values()), {n: _reasons(r) for n, r in results.items()}
    assert "from apex" not in (root / "layers.py").read_text()
