"""A no-grad pass in the training loop (a teacher's, or the model's after the step) where the loop
calls a trainer's ``run_forward`` and ``backward_stored`` defined in a base class, or where the
scaler is the module's (``initialize`` in a ``setup_amp`` method: ``global scaler``). apex cast
the pass (O1 patched torch process-wide); the rewrite puts it under an autocast enabled as the
methods' regions are. It was left in float32 in a safe rewrite: "no-grad-precision", first drawn
by the bench at seed 4000."""
import ast

import pytest

from migrate.api import migrate_source

from generated.apex_scripts import Features, script
from generated.test_generated_scripts import assert_migrated_and_the_same

STORED = dict(loss="inline", loop="while", accumulation="none", boundary="plus_one", clip="parameters",
              clip_at="boundary", flag="none", import_guard=False, inner_fp32=False,
              names=("model", "optimizer", "loss"), holder="method", backward_in="stored")
CASES = [(methods_in, amp_setup, memory) for methods_in in ("class", "base") for amp_setup in ("init", "method")
         for memory in ("teacher", "after")]


def _no_grad_pass_under_autocast(source: str) -> bool:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and "autocast" in ast.unparse(node.items[0].context_expr):
            if any(isinstance(inner, ast.With) and "no_grad" in ast.unparse(inner.items[0].context_expr)
                   for inner in ast.walk(node)):
                return True
    return False


@pytest.mark.parametrize("methods_in, amp_setup, memory", CASES)
def test_the_no_grad_pass_goes_under_autocast(methods_in, amp_setup, memory):
    drawn = Features(**STORED, methods_in=methods_in, amp_setup=amp_setup, memory=memory)
    rewritten = migrate_source(script(drawn), filename="train.py").new_source
    assert rewritten is not None and _no_grad_pass_under_autocast(rewritten), rewritten


@pytest.mark.slow
@pytest.mark.parametrize("methods_in, amp_setup, memory", [("base", "method", "teacher"), ("base", "init", "after"),
                                                           ("class", "method", "teacher")])
def test_the_no_grad_pass_trains_as_apex_cast_it(methods_in, amp_setup, memory, tmp_path):
    drawn = Features(**STORED, methods_in=methods_in, amp_setup=amp_setup, memory=memory)
    assert_migrated_and_the_same(drawn, tmp_path)
