"""The plain step the rewrite writes where no scaled backward pass ran (``if <any pass was scaled>:
scaler.step(optimizer) else: optimizer.step()``), drawn by the bench (seed 4500, scripts 234 and
235): two optimizers stepped in a loop, two passes each under a test of its own, alternating
iterations, and the scaler held as ``self.amp``, None where mixed precision is off. The test joins
the passes' tests; AMP102, reading the arms, took the plain arm for a step after a scaled backward
and stepped it through ``self.amp``: None on the default run, which crashed. The plain arm carries
its reason and ``# noqa: AMP102``; and the joined test keeps the parentheses of an ``or`` inside an
``and`` (``even and (a or b)``, once written ``even and (a) or (b)``)."""
import ast
import itertools

import pytest

from migrate.api import migrate_source

from generated.apex_scripts import Features, script
from generated.judge import judge

DRAWN = dict(  # script 234 of seed 4500
    loss="helper", loop="enumerate", accumulation="inner_loop", boundary="minus_one", clip="parameters", clip_at="boundary",
    flag="off", import_guard=False, inner_fp32=False, holder="method", amp_via="attribute", optimizers="two", checkpoint=False,
    early_continue=False, register_half=False, finite_guard=False, overflow=False, between="none", warmup=False,
    backward_in="loop", flag_copy=True, flag_via="options", loop_in="main", initialize_always=False, alternate=True,
    half_evaluation=False, trainer_init="base", clip_in="closure", grads_in="local", import_in="function",
    level_in_block=False, delay_spelling="comparison", forward_via="model", scale_bounds="none", nan_skip=False,
    clip_or_norm=False, entry="main", memory="after", native_beside=False, after_step="none", methods_in="class",
    amp_setup="method", penalty="none", own_tests="flags", local_helper="none", own_autocast="none", setup_in="main",
    names=("net", "optimizer", "objective"))
VARIANTS = {"own_tests": ["flags", "weights"], "amp_via": ["attribute", "module"], "optimizers": ["one", "two"],
            "flag": ["off", "on"]}


def _plain_arms(source: str) -> list[tuple[str, str]]:
    """For each ``if`` whose body steps an optimizer through a scaler (``<scaler>.step(<optimizer>)``)
    and which has an ``else``: that optimizer, and the ``else`` arm's first statement."""
    arms = []
    for node in ast.walk(ast.parse(source)):
        first = node.body[0] if isinstance(node, ast.If) and node.orelse else None
        call = first.value if isinstance(first, ast.Expr) and isinstance(first.value, ast.Call) else None
        if call is not None and isinstance(call.func, ast.Attribute) and call.func.attr == "step" and len(call.args) == 1:
            arms.append((ast.unparse(call.args[0]), ast.unparse(node.orelse[0])))
    return arms


@pytest.mark.parametrize("values", list(itertools.product(*VARIANTS.values())))
def test_the_plain_arm_steps_the_optimizer_itself(values):
    drawn = Features(**{**DRAWN, **dict(zip(VARIANTS, values))})
    new = migrate_source(script(drawn), filename="train.py", unsafe_fixes=True).new_source
    compile(new, "train.py", "exec")
    arms = _plain_arms(new)
    assert all(arm == f"{optimizer}.step()" for optimizer, arm in arms), (arms, new)
    for line in new.splitlines():
        if line.strip().startswith("if ") and ".step(" not in line and " or " in line:
            compile(line.strip() + "\n    pass\n", "condition", "exec")


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["off", "on"])
def test_the_drawn_script_trains_as_apex_did(flag, tmp_path):
    outcome = judge(Features(**{**DRAWN, "flag": flag}), tmp_path)
    assert not outcome.unsafe_crash and not outcome.unsafe_unmarked and not outcome.safe_wrong, outcome.reports
