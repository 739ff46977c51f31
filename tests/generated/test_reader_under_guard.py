"""A gradient tracker (``tracker = GradNormLR(model, optimizer)``, whose ``update()`` sets the
learning rate from the gradients' norm) made beside a loop that runs at module level, under
``if __name__ == "__main__":`` (``entry=guard``). Drawn by the bench (seed 4600, scripts 212-218):
its object's class was looked up among the training function's names only, so ``update()``
between the scaled backward and the step was not seen to read gradients, and read them scaled
(the loss differed from step 9). The variants turn the features the drawn scripts differed in;
``tests/migrate/test_reader_bound_outside.py`` writes the binding every way."""
import itertools

import pytest

from migrate.api import migrate_source

from generated.apex_scripts import Features, script
from generated.judge import judge

DRAWN = dict(  # script 216 of seed 4600
    loss="inline", loop="range", accumulation="none", boundary="minus_one", clip="master_params", clip_at="boundary",
    flag="on", import_guard=False, inner_fp32=False, holder="function", amp_via="module", optimizers="one",
    checkpoint=False, early_continue=False, register_half=False, finite_guard=False, overflow=False, between="none",
    warmup=False, backward_in="loop", flag_copy=False, flag_via="value", loop_in="main", initialize_always=False,
    alternate=False, half_evaluation=False, trainer_init="base", clip_in="loop", grads_in="local",
    import_in="module", level_in_block=False, delay_spelling="comparison", forward_via="model", scale_bounds="none",
    nan_skip=False, clip_or_norm=True, entry="guard", memory="none", native_beside=False, after_step="critic_shared",
    methods_in="class", amp_setup="init", penalty="positional", own_tests="weights", local_helper="after",
    own_autocast="none", setup_in="builder_in_with", names=("net", "optim", "objective"))
VARIANTS = {"entry": ["main", "guard"], "own_tests": ["none", "weights"], "penalty": ["none", "positional"],
            "clip": ["master_params", "parameters", "none"], "checkpoint": [False, True]}


@pytest.mark.parametrize("values", list(itertools.product(*VARIANTS.values())))
def test_the_tracker_is_unscaled_for(values):
    drawn = Features(**{**DRAWN, **dict(zip(VARIANTS, values))})
    new = migrate_source(script(drawn), filename="train.py").new_source
    lines = new.splitlines()
    update = next(i for i, line in enumerate(lines) if "tracker.update()" in line)
    assert any(".unscale_(" in line for line in lines[:update]), new


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["off", "on"])
def test_the_drawn_script_trains_as_apex_did(flag, tmp_path):
    outcome = judge(Features(**{**DRAWN, "flag": flag}), tmp_path)
    assert not outcome.unsafe_crash and not outcome.unsafe_unmarked and not outcome.safe_wrong, outcome.reports
