"""The same ``amp.initialize`` in each arm of an ``if``/``else`` (``if multi_gpu: initialize;
DistributedDataParallel(...) else: initialize``): the GradScaler is made in every arm, so it exists
after the chain whichever arm ran, as apex's loss scaler did. It used to be refused ("in arms that
exclude each other"). Where an arm makes none (no ``else``), or the arms initialize differently,
the file stays as it was.
"""
from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from migrate.engine import run_rules
from migrate.rules import all_rules

RULES = all_rules()

TESTS = ("torch.cuda.device_count() > 1", "cfg.distributed", "cfg.world_size > 1 and cfg.ddp")
# what follows `initialize` in an arm: {model} is the model's name
AFTERS = {
    "ddp": "        {model} = torch.nn.parallel.DistributedDataParallel({model})\n        bare = {model}.module\n",
    "plain": "        bare = {model}\n",
    "nothing": "",
}


def _arm(guarded: bool, after: str, model: str) -> str:
    call = f"{model}, optimizer = amp.initialize({model}, optimizer, opt_level=cfg.level)\n"
    inner = f'        if cfg.level != "O0":\n            {call}' if guarded else f"        {call}"
    return inner + (AFTERS[after].format(model=model) or "")


def _script(test: str, arms: int, guarded: bool, afters: tuple[str, ...], model: str, in_helper: bool) -> str:
    step = (f"        loss = torch.nn.functional.mse_loss({model}(x), y)\n"
            "        optimizer.zero_grad()\n"
            "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
            "            scaled_loss.backward()\n"
            "        optimizer.step()\n")
    text = "import argparse\n\nimport torch\nfrom apex import amp\n\n\n"
    if in_helper:
        text += f"def train({model}, optimizer, batches):\n    for x, y in batches:\n" + step + "\n\n"
    text += "def main(cfg):\n    torch.manual_seed(0)\n"
    text += f"    {model} = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to('cuda')\n"
    text += f"    optimizer = torch.optim.SGD({model}.parameters(), lr=0.05)\n"
    tests = [test, "cfg.world_size == 1 and cfg.elastic"][: arms - 1]
    for index, arm_test in enumerate(tests):
        text += f"    {'if' if index == 0 else 'elif'} {arm_test}:\n" + _arm(guarded, afters[index], model)
    text += "    else:\n" + _arm(guarded, afters[-1], model)
    text += "    batches = [(torch.randn(4, 8, device='cuda'), torch.randn(4, 1, device='cuda')) for _ in range(12)]\n"
    text += f"    train({model}, optimizer, batches)\n" if in_helper else "    for x, y in batches:\n" + step
    text += ("\n\nif __name__ == '__main__':\n"
             "    parser = argparse.ArgumentParser()\n"
             "    parser.add_argument('--level', default='O1')\n"
             "    parser.add_argument('--distributed', action='store_true')\n"
             "    parser.add_argument('--world-size', type=int, default=1)\n"
             "    parser.add_argument('--ddp', action='store_true')\n"
             "    parser.add_argument('--elastic', action='store_true')\n"
             "    main(parser.parse_args())\n")
    return text


def _apex_left(text: str) -> bool:
    import ast

    tree = ast.parse(text)
    return any(isinstance(node, (ast.Import, ast.ImportFrom)) and "apex" in ast.unparse(node) for node in ast.walk(tree)) or any(
        isinstance(node, ast.Name) and node.id == "amp" for node in ast.walk(tree))


def _fixed(source: str, unsafe: bool = False) -> str:
    result = run_rules(source, "train.py", RULES, unsafe_fixes=unsafe)
    assert result.error is None, result.error
    return result.source


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=[Phase.explicit, Phase.generate])
@given(test=st.sampled_from(TESTS), arms=st.sampled_from([2, 3]), guarded=st.booleans(),
       afters=st.lists(st.sampled_from(sorted(AFTERS)), min_size=3, max_size=3).map(tuple),
       model=st.sampled_from(["model", "net"]), in_helper=st.booleans())
def test_the_scaler_is_made_in_every_arm(test, arms, guarded, afters, model, in_helper):
    source = _script(test, arms, guarded, afters[:arms], model, in_helper)
    compile(source, "train.py", "exec")
    fixed = _fixed(source)
    assert not _apex_left(fixed) and "TODO(ampmigrate)" not in fixed, fixed
    assert fixed.count("scaler = torch.amp.GradScaler(") == arms, fixed
    assert "global scaler" not in fixed, fixed
    if in_helper:
        assert f"train({model}, optimizer, batches, scaler=scaler)" in fixed, fixed
    assert _fixed(fixed) == fixed, "a second run changed it again"


def test_an_if_without_else_keeps_the_file_on_apex():
    source = _script(TESTS[0], 2, True, ("ddp", "plain"), "model", True)
    source = source.replace("    else:\n", "    if cfg.elastic:\n", 1)
    assert _fixed(source) == source


def test_arms_initializing_differently_keep_the_file_on_apex():
    source = _script(TESTS[0], 2, True, ("ddp", "plain"), "model", True)
    last = source.rindex("opt_level=cfg.level)")
    source = source[:last] + "opt_level=cfg.level, loss_scale=128.0)" + source[last + len("opt_level=cfg.level)"):]
    assert _fixed(source) == source


def test_one_arm_guarded_and_the_other_not_keeps_the_file_on_apex():
    source = _script(TESTS[1], 2, True, ("ddp", "plain"), "model", True)
    last = source.rindex('        if cfg.level != "O0":\n            model, optimizer')
    source = source[:last] + "        model, optimizer" + source[last + len('        if cfg.level != "O0":\n            model, optimizer'):]
    compile(source, "train.py", "exec")
    assert _fixed(source) == source


@pytest.mark.slow
@pytest.mark.parametrize("args", [[], ["--distributed"]])
def test_the_rewrite_trains_the_same_through_either_arm(tmp_path, args):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    script = _script("cfg.distributed", 2, True, ("plain", "plain"), "model", True)
    (tmp_path / "original").mkdir()
    (tmp_path / "original" / "train.py").write_text(script)
    shutil.copytree(tmp_path / "original", tmp_path / "migrated")
    fixed = _fixed(script)
    assert not _apex_left(fixed), fixed
    (tmp_path / "migrated" / "train.py").write_text(fixed)
    result = compare(Target(str(tmp_path / "original" / "train.py")), Target(str(tmp_path / "migrated" / "train.py")), args,
                     device="cpu", steps=12, parallel=False, timeout=600)
    assert result.verdict == SAME, as_text(result)
