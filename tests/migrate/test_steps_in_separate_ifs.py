"""The optimizer stepped in two ``if`` statements one after the other, one per pass: ``if
accumulating and boundary: optimizer.step()``, then ``if not accumulating: optimizer.step()``.

Both steps go through the scaler. Where the tests contradict each other (``n > 1`` and ``n <= 1``,
``f`` and ``not f``), only one runs after a backward pass and the rewrite is safe; otherwise both
might, and the second would unscale the gradients again: unsafe, said as such. The second step
was once left as it was, stepping gradients still multiplied by the scale, with no marker.
"""
from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migrate.engine import run_rules
from migrate.rules import all_rules

RULES = all_rules()

# (the accumulating arm's test, the other arm's test), contradicting each other
CONTRADICTING = [
    ("accumulation > 1 and (index + 1) % accumulation == 0", "accumulation <= 1"),
    ("(index + 1) % accumulation == 0 and accumulation > 1", "accumulation <= 1"),
    ("accumulation != 1 and (index + 1) % accumulation == 0", "accumulation == 1"),
    ("accumulating and (index + 1) % accumulation == 0", "not accumulating"),
]
OVERLAPPING = [
    ("(index + 1) % accumulation == 0", "accumulation <= 1"),
    ("accumulating", "log_steps"),
    ("accumulation > 1 and (index + 1) % accumulation == 0", "accumulation < 1"),
]


def _script(tests: tuple[str, str], plain_first: bool, accumulation: int, clip: bool) -> str:
    accumulating, plain = tests
    arms = [f"        if {accumulating}:\n            optimizer.step()\n            optimizer.zero_grad()\n",
            f"        if {plain}:\n            optimizer.step()\n"]
    if plain_first:
        arms.reverse()
    between = "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n" if clip else ""
    return (
        "import torch\nfrom apex import amp\n\n\n"
        f"def train(model, optimizer, batches, accumulation={accumulation}, log_steps=False):\n"
        "    accumulating = accumulation > 1\n"
        '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", loss_scale=128.0)\n'
        "    optimizer.zero_grad()\n"
        "    for index, (x, y) in enumerate(batches):\n"
        "        loss = torch.nn.functional.mse_loss(model(x), y) / accumulation\n"
        "        if accumulation <= 1:\n"
        "            optimizer.zero_grad()\n"
        "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "            scaled_loss.backward()\n"
        + between + "".join(arms) +
        "\n\nif __name__ == '__main__':\n"
        "    torch.manual_seed(0)\n"
        "    device = 'cuda'\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)\n"
        "    train(model, optimizer, [(torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)) for _ in range(12)])\n"
    )


def _fixed(source: str, unsafe: bool) -> str:
    result = run_rules(source, "train.py", RULES, unsafe_fixes=unsafe)
    assert result.error is None, result.error
    return result.source


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tests=st.sampled_from(CONTRADICTING), plain_first=st.booleans(), accumulation=st.sampled_from([1, 2]),
       clip=st.booleans())
def test_steps_in_contradicting_ifs_both_go_through_the_scaler(tests, plain_first, accumulation, clip):
    source = _script(tests, plain_first, accumulation, clip)
    fixed = _fixed(source, unsafe=False)  # a clip between: at the threshold times the scale, as apex clipped unscaled ones
    assert "optimizer.step()" not in fixed.replace("`optimizer.step()`", ""), fixed
    assert fixed.count("scaler.step(optimizer)") == 2 and fixed.count("scaler.update()") == 2, fixed
    assert "from apex" not in fixed and "TODO(ampmigrate)" not in fixed, fixed


@pytest.mark.parametrize("tests", OVERLAPPING)
def test_steps_in_ifs_that_may_both_run_are_unsafe(tests):
    source = _script(tests, False, 2, False)
    assert _fixed(source, unsafe=False) == source
    fixed = _fixed(source, unsafe=True)
    assert fixed.count("scaler.step(optimizer)") == 2 and "runs again at line" in fixed.replace("\n    #   ", " "), fixed


@pytest.mark.slow
@pytest.mark.parametrize("accumulation", [1, 2])
@pytest.mark.parametrize("plain_first", [False, True])
def test_the_rewrite_trains_the_same(tmp_path, accumulation, plain_first):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    script = _script(CONTRADICTING[0], plain_first, accumulation, False)
    (tmp_path / "original").mkdir()
    (tmp_path / "original" / "train.py").write_text(script)
    shutil.copytree(tmp_path / "original", tmp_path / "migrated")
    fixed = _fixed(script, unsafe=False)
    assert "from apex" not in fixed, fixed
    (tmp_path / "migrated" / "train.py").write_text(fixed)
    result = compare(Target(str(tmp_path / "original" / "train.py")), Target(str(tmp_path / "migrated" / "train.py")), [],
                     device="cpu", steps=12, parallel=False, timeout=600)
    assert result.verdict == SAME, as_text(result)
