"""``amp.initialize`` alone in each arm of an ``if``/``else`` chain under ``if flag:``
(``if mixed_precision: if t_cfg: [model, t_model], optimizer = amp.initialize([model, t_model],
...) else: model, optimizer = amp.initialize(model, ...)``, a distillation run's teacher joining
the student): whichever arm ran, apex made its one loss scaler alike and cast every model, so the
chain is one ``initialize`` under the flag. The GradScaler is made before the ``if``, enabled by
its test, and the chain goes. It used to be refused ("in arms that exclude each other"). Where an
arm holds more, the chain can be passed by no arm, the arms' options differ, or the ``if`` holds
more than the chain, the file stays as it was.
"""
from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from migrate.api import migrate_paths

pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

SCRIPT = """import argparse

import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--amp", action="store_true")
parser.add_argument("--teacher", action="store_true")
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()
{flag_line}

def train(args):
    torch.manual_seed(0)
    device = "cuda"
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    t_model = torch.nn.Linear(8, 1).to(device) if args.teacher else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if {flag}:
{chain}
    for _ in range(args.steps):
        x, y = torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if args.teacher:
            with torch.no_grad():
                target = t_model(x)
            loss = loss + 0.1 * torch.nn.functional.mse_loss(model(x), target)
        optimizer.zero_grad()
        if {flag}:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
    return model


train(args)
"""
# how the script says whether apex runs: the line setting it, and its test
FLAGS = {
    "argparse": ("", "args.amp"),
    "module global": ("mixed_precision = args.amp\n", "mixed_precision"),
}
BOTH = "[model, t_model], optimizer = amp.initialize([model, t_model], optimizer, opt_level='O1', verbosity=0)"
ALONE = "model, optimizer = amp.initialize(model, optimizer, opt_level='O1', verbosity=0)"
# the chain under the flag, each arm's lines at its own depth
CHAINS = {
    "if-else": [("if args.teacher:", BOTH), ("else:", ALONE)],
    "negated": [("if not args.teacher:", ALONE), ("else:", BOTH)],
    "tuple of models": [("if args.teacher:", BOTH.replace("[model, t_model]", "(model, t_model)")), ("else:", ALONE)],
    "elif": [("if args.teacher:", BOTH), ("elif args.steps > 100:", ALONE), ("else:", ALONE)],
}


def _chain(arms: list[tuple[str, str]]) -> str:
    return "".join(f"        {head}\n            {line}\n" for head, line in arms)


def _script(flag: str, arms: list[tuple[str, str]]) -> str:
    flag_line, test = FLAGS[flag]
    return SCRIPT.format(flag_line=flag_line, flag=test, chain=_chain(arms))


def _migrated(tmp_path: Path, source: str) -> tuple[str, object]:
    path = tmp_path / "train.py"
    path.write_text(source)
    [result] = migrate_paths([path])
    return path.read_text(), result


@pytest.mark.parametrize(("flag", "chain"), list(itertools.product(FLAGS, CHAINS)))
def test_the_chain_becomes_one_scaler_before_the_flags_if(tmp_path, flag, chain):
    text, result = _migrated(tmp_path, _script(flag, CHAINS[chain]))
    assert result.changed, [d.message for d in result.diagnostics]
    test = FLAGS[flag][1]
    assert "apex" not in text and "amp.initialize" not in text and "if args.teacher:\n            [model" not in text
    assert any(f'scaler = torch.amp.GradScaler("cuda", enabled={on})' in text for on in (test, f"bool({test})")), text
    assert "scaler.scale(loss).backward()" in text and "enabled=scaler.is_enabled()" in text
    compile(text, "train.py", "exec")
    assert not migrate_paths([tmp_path / "train.py"])[0].changed  # idempotent


EXTRA = "print('apex on')"
NEGATIVES = {
    "an arm holding more": [("if args.teacher:", BOTH + "\n            " + EXTRA), ("else:", ALONE)],
    "no else": [("if args.teacher:", BOTH), ("elif not args.teacher:", ALONE)],
    "other options": [("if args.teacher:", BOTH), ("else:", ALONE.replace("verbosity=0", "verbosity=1"))],
    "a test that calls": [("if prepare(t_model):", BOTH), ("else:", ALONE)],  # its call would go with the chain
}


@pytest.mark.parametrize("negative", sorted(NEGATIVES))
def test_a_chain_that_is_not_one_initialize_stays(tmp_path, negative):
    source = _script("argparse", NEGATIVES[negative])
    text, result = _migrated(tmp_path, source)
    assert text == source and not result.changed
    assert any("in arms that exclude each other" in d.message for d in result.diagnostics), [d.message for d in result.diagnostics]


def test_an_if_holding_more_than_the_chain_stays(tmp_path):
    source = _script("argparse", CHAINS["if-else"]).replace("    if args.amp:\n", "    if args.amp:\n        print('amp')\n", 1)
    text, result = _migrated(tmp_path, source)
    assert text == source and not result.changed


@pytest.mark.slow
@pytest.mark.parametrize(("flag", "chain"), [("argparse", "if-else"), ("module global", "elif")])
def test_the_rewrite_trains_the_same_each_way(tmp_path, flag, chain):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = tmp_path / "original"
    original.mkdir()
    (original / "train.py").write_text(_script(flag, CHAINS[chain]))
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    for argv in ([], ["--amp"], ["--amp", "--teacher"], ["--teacher"]):
        result = compare(Target(str(original / "train.py")), Target(str(migrated / "train.py")), argv, device="cpu",
                         steps=12, parallel=True, timeout=600)
        assert result.verdict == SAME, (argv, as_text(result))
