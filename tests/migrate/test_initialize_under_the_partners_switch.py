"""``amp.initialize`` under ``if args.fp16:`` in a script, ``amp.scale_loss`` in the trainer module
it calls, under a test of the same switch read there (``if self.args.fp16:``, ``if p['fp16']:``):
the pair is migrated safely. The trainer's GradScaler is made at its module level and is on
whatever the script did, but its autocast is enabled by that switch and its scaled backward and
step through the scaler run only under it: with the switch on both halves ran, with it off
neither did. The two reads are taken for one setting by their name. Where the trainer's test
reads another switch, scales unconditionally, or the script's test is more than the switch, the
pair stays unsafe with the reason it had.
"""
from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from migrate.api import migrate_paths

pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

# how the script holds its settings, and the switch read on them
SETTINGS = {
    "argparse": ("    args = parser.parse_args()\n", "args.fp16"),
    "dict": ("    args = vars(parser.parse_args())\n", "args['fp16']"),
    "local": ("    args = parser.parse_args()\n    fp16 = args.fp16\n", "fp16"),
}
SCRIPT = """import argparse

import torch
from apex import amp

from trainer import {trainer_import}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--steps", type=int, default=12)
{settings}    torch.manual_seed(0)
    device = "cuda"
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if {test}:
        # apex, O1
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
    batches = [(torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)) for _ in range(12)]
{call}


if __name__ == "__main__":
    main()
"""
# the trainer, and how the script hands it the switch; {backward}: the arms of the backward pass
TRAINERS = {
    "function": ("train_epoch", "    train_epoch(model, optimizer, batches, {switch})",
                 "def train_epoch(model, optimizer, batches, fp16):\n    for x, y in batches:\n"
                 "        optimizer.zero_grad()\n        loss = torch.nn.functional.mse_loss(model(x), y)\n"
                 "{backward}        optimizer.step()\n", "fp16", "        "),
    "class": ("Trainer", "    Trainer(fp16={switch}).train(model, optimizer, batches)",
              "class Trainer:\n    def __init__(self, fp16=False):\n        self.params = {{'fp16': fp16, 'clip': 1.0}}\n\n"
              "    def train(self, model, optimizer, batches):\n        p = self.params\n        for x, y in batches:\n"
              "            optimizer.zero_grad()\n            loss = torch.nn.functional.mse_loss(model(x), y)\n"
              "{backward}            torch.nn.utils.clip_grad_norm_(model.parameters(), p['clip'])\n"
              "            optimizer.step()\n", "p['fp16']", "            "),
}
ARMS = {
    "scaled first": "if {test}:\n    with amp.scale_loss(loss, optimizer) as scaled:\n        scaled.backward()\nelse:\n    loss.backward()\n",
    "plain first": "if not {test}:\n    loss.backward()\nelse:\n    with amp.scale_loss(loss, optimizer) as scaled:\n        scaled.backward()\n",
}


def _project(root: Path, settings: str, trainer: str, arms: str, *, script_test: str | None = None,
             trainer_test: str | None = None) -> Path:
    holding, switch = SETTINGS[settings]
    name, call, body, own_test, indent = TRAINERS[trainer]
    backward = "".join(indent + line + "\n" for line in ARMS[arms].format(test=trainer_test or own_test).splitlines())
    root.mkdir(parents=True, exist_ok=True)
    (root / "trainer.py").write_text("import torch\nfrom apex import amp\n\n\n" + body.format(backward=backward))
    (root / "train.py").write_text(SCRIPT.format(trainer_import=name, settings=holding, test=script_test or switch,
                                                 call=call.format(switch="args.fp16" if settings == "argparse" else switch)))
    return root


def _by_name(results) -> dict:
    return {Path(result.filename).name: result for result in results}


def _reasons(result) -> str:
    return " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix is not None)


@pytest.mark.parametrize(("settings", "trainer", "arms"), list(itertools.product(SETTINGS, TRAINERS, ARMS)))
def test_initialize_under_the_switch_the_trainer_tests_is_migrated_safely(tmp_path, settings, trainer, arms):
    root = _project(tmp_path / "p", settings, trainer, arms)
    results = _by_name(migrate_paths([root]))
    assert results["train.py"].changed and results["trainer.py"].changed, _reasons(results["train.py"])
    script, module = (root / "train.py").read_text(), (root / "trainer.py").read_text()
    assert "apex" not in script + module and "amp.initialize" not in script
    assert 'scaler = torch.amp.GradScaler("cuda")' in module and "scaler.scale(loss).backward()" in module
    own_test = TRAINERS[trainer][3]
    assert f"enabled={own_test}" in module or f"enabled=bool({own_test})" in module, module
    assert not any(result.changed for result in migrate_paths([root]))  # idempotent


NEGATIVES = {
    "another switch": {"trainer_test": "use_apex"},
    "a compound test": {"script_test": "args.fp16 and torch.cuda.is_available()"},
    "a call": {"script_test": "bool(args.fp16) is True"},
}


@pytest.mark.parametrize("negative", sorted(NEGATIVES))
def test_initialize_under_another_test_stays_unsafe(tmp_path, negative):
    root = _project(tmp_path / "p", "argparse", "function", "scaled first", **NEGATIVES[negative])
    if negative == "another switch":  # the trainer takes the switch under that name
        text = (root / "trainer.py").read_text().replace("batches, fp16)", "batches, use_apex)")
        (root / "trainer.py").write_text(text)
    results = _by_name(migrate_paths([root]))
    assert not results["train.py"].changed and not results["trainer.py"].changed
    assert "runs inside a block here" in _reasons(results["train.py"])


def test_a_trainer_scaling_whatever_the_switch_stays_unsafe(tmp_path):
    root = _project(tmp_path / "p", "argparse", "function", "scaled first")
    text = (root / "trainer.py").read_text()
    unguarded = ("        with amp.scale_loss(loss, optimizer) as scaled:\n            scaled.backward()\n")
    start, end = text.index("        if fp16:\n"), text.index("        optimizer.step()")
    (root / "trainer.py").write_text(text[:start] + unguarded + text[end:])
    results = _by_name(migrate_paths([root]))
    assert not results["train.py"].changed and "runs inside a block here" in _reasons(results["train.py"])


def test_initialize_under_the_switch_in_a_loop_stays_unsafe(tmp_path):
    root = _project(tmp_path / "p", "argparse", "function", "scaled first")
    text = (root / "train.py").read_text().replace(
        "    if args.fp16:\n        # apex, O1\n        model, optimizer",
        "    for _ in range(1):\n        if args.fp16:\n            model, optimizer")
    (root / "train.py").write_text(text)
    results = _by_name(migrate_paths([root]))
    assert not results["train.py"].changed and "runs inside a block here" in _reasons(results["train.py"])


@pytest.mark.slow
@pytest.mark.parametrize(("settings", "trainer", "arms"), [("dict", "class", "plain first"), ("local", "function", "scaled first")])
def test_the_pair_trains_the_same_with_the_switch_on_and_off(tmp_path, settings, trainer, arms):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = _project(tmp_path / "original", settings, trainer, arms)
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    assert "apex" not in (migrated / "train.py").read_text() + (migrated / "trainer.py").read_text()
    for argv in ([], ["--fp16"]):
        result = compare(Target(str(original / "train.py")), Target(str(migrated / "train.py")), argv, device="cpu",
                         steps=12, parallel=True, timeout=600)
        assert result.verdict == SAME, as_text(result)
