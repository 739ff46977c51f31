"""Two planning answers the generator's bench found wrong, held over the generator's spellings.

- A gradient read inside a loop of micro-batches (a clip after each scaled backward) is read
  where the step does not follow: the next micro-batch's backward comes first. However the scaled
  loss is backed (``scaled_loss.backward()``, handed to a method or a function), no ``unscale_``
  goes into that loop (a second one before the update raises).
- A step under a test of the gradients (``if math.isfinite(norm):``) whose arms call
  ``zero_grad()``, after a batch that may skip its scaled backward: the update after the test asks
  whether the optimizer holds gradients before the test clears them, else the update is skipped
  where the step was taken and the next ``unscale_`` raises."""
from __future__ import annotations

import ast
import itertools
from dataclasses import replace

import pytest

from generated.apex_scripts import Features, _coherent, script
from generated.judge import judge
from migrate.api import migrate_source

BASE = Features(loss="inline", loop="enumerate", accumulation="inner_loop", boundary="plus_one", clip="parameters",
                clip_at="micro_batch", flag="none", import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"),
                holder="method")
BACKWARDS = ("loop", "scaled_method", "helper", "function", "partial")


def _micro_batches(backward_in: str, clip_in: str, loop: str, optimizers: str) -> Features:
    return _coherent(replace(BASE, backward_in=backward_in, clip_in=clip_in, loop=loop, optimizers=optimizers))


def _unscaled_in_the_micro_batch_loop(source: str) -> bool:
    return any(isinstance(node, ast.For) and "chunk" in ast.unparse(node.iter) and "unscale_" in ast.unparse(node)
               for node in ast.walk(ast.parse(source)))


@pytest.mark.parametrize("backward_in, clip_in, loop, optimizers",
                         list(itertools.product(BACKWARDS, ("loop", "helper", "closure"), ("range", "enumerate"), ("one", "two"))))
def test_no_unscale_goes_into_a_loop_of_micro_batches(backward_in, clip_in, loop, optimizers):
    source = script(_micro_batches(backward_in, clip_in, loop, optimizers))
    for unsafe in (False, True):
        assert not _unscaled_in_the_micro_batch_loop(migrate_source(source, filename="t.py", unsafe_fixes=unsafe).new_source)


SKIPPED_BATCH = _coherent(replace(BASE, accumulation="none", clip="master_params", clip_at="boundary", holder="function",
                                  amp_via="parameter", finite_guard=True, nan_skip=True, warmup=True, backward_in="loop"))


@pytest.mark.parametrize("names", [("model", "optimizer", "loss"), ("net", "opt", "objective")])
def test_the_update_after_a_gradient_test_asks_before_the_test_clears_them(names):
    source = script(replace(SKIPPED_BATCH, names=names))
    new = migrate_source(source, filename="t.py", unsafe_fixes=True).new_source
    tree = ast.parse(new)
    asked = [node for node in ast.walk(tree) if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "scaled_this_step"]
    assert asked and "p.grad is not None" in ast.unparse(asked[0].value)
    updates = [node for node in ast.walk(tree) if isinstance(node, ast.If) and "update()" in ast.unparse(node.body[0])]
    assert updates and all(ast.unparse(node.test) == "scaled_this_step" for node in updates)


@pytest.mark.slow
@pytest.mark.parametrize("features", [_micro_batches("scaled_method", "helper", "enumerate", "two"),
                                      _micro_batches("scaled_method", "loop", "range", "one"), SKIPPED_BATCH])
def test_both_rewrites_hold_when_run(tmp_path, features):
    outcome = judge(features, tmp_path / "run")
    assert not (outcome.safe_wrong or outcome.unsafe_crash or outcome.unsafe_unmarked), outcome.summary
