"""A step far from its ``amp.scale_loss`` whose backward pass may be skipped (``Features.skip_pass``).

A GAN trainer's discriminator takes its backward pass in a method, under a test that skips it
(``if loss_G <= G_threshold or loss_D >= D_threshold:``, vkinakh/Hubble-meets-Webb), and another
method steps the optimizer. apex stepped it whatever it held; ``GradScaler.step`` raises where
nothing was scaled for it ("No inf checks were recorded for this optimizer"). The step now asks
whether the optimizer holds gradients, and steps plainly where it does not. The scaler's update
still runs after an earlier step that always went through it: a second ``step`` before an
``update()`` raises ("step() has already been called since the last update()").
"""
import ast
import itertools

import pytest

from migrate.api import migrate_source

from generated.apex_scripts import Features, script
from generated.judge import judge

BASE = dict(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="none", clip_at="boundary",
            flag="none", import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"),
            holder="method", backward_in="helper")
VARIANTS = {"skip_pass": ["return", "arm"], "flag": ["none", "on", "off"], "optimizers": ["one", "two"],
            "accumulation": ["none", "plain"], "loop": ["range", "enumerate"]}
CASES = list(itertools.product(*VARIANTS.values()))


def _drawn(values) -> Features:
    return Features(**{**BASE, **dict(zip(VARIANTS, values))})


def _scaler_steps(source: str) -> list[tuple[ast.Call, list[ast.expr]]]:
    """Each ``<scaler>.step(<optimizer>)`` call, with the tests of the ``if`` bodies holding it."""
    tree = ast.parse(source)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step"
                and len(node.args) == 1 and "scaler" in ast.unparse(node.func.value)):
            tests, inner, above = [], node, parents.get(id(node))
            while above is not None:
                if isinstance(above, ast.If) and any(inner is statement for statement in above.body):
                    tests.append(above.test)
                inner, above = above, parents.get(id(above))
            found.append((node, tests))
    return found


@pytest.mark.parametrize("values", CASES, ids=["-".join(case) for case in CASES])
def test_the_step_asks_for_gradients(values):
    """Both rewrites step through the scaler only where the optimizer holds gradients; a list of
    optimizers stepped in a loop (``for o in self.optimizers: o.step()``) cannot be asked one by
    one there, and the file is left on apex with that reason."""
    source = script(_drawn(values))
    if dict(zip(VARIANTS, values))["optimizers"] == "two":
        for unsafe in (False, True):
            result = migrate_source(source, filename="train.py", unsafe_fixes=unsafe)
            assert result.new_source == source
            reasons = [finding.message for finding in result.diagnostics]
            assert any("stepped in a loop under a condition the scaler cannot test again" in r for r in reasons), reasons
        return
    for unsafe in (False, True):
        new = migrate_source(source, filename="train.py", unsafe_fixes=unsafe).new_source
        compile(new, "train.py", "exec")
        steps = _scaler_steps(new)
        if not unsafe and not steps:
            continue  # left on apex in a safe run, with its reason
        assert steps, new
        for call, tests in steps:
            assert any("p.grad is not None" in ast.unparse(test) for test in tests), (ast.unparse(call), new)


@pytest.mark.slow
@pytest.mark.parametrize("values", [("return", "none", "one", "none", "range"), ("arm", "on", "one", "plain", "enumerate"),
                                    ("return", "off", "one", "plain", "enumerate")],
                         ids=["return", "arm-flag-on-accumulating", "return-flag-off"])
def test_a_skipped_pass_trains_as_apex_did(values, tmp_path):
    outcome = judge(_drawn(values), tmp_path)
    assert outcome.safe != "unchanged", outcome.summary
    assert not (outcome.safe_wrong or outcome.unsafe_crash or outcome.unsafe_unmarked), (
        outcome.summary, "\n".join(outcome.reports.values()))
