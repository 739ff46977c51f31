"""Generated apex scripts against their rewrites, judged by running them (``python -m ampshim
compare``): a safe rewrite trains the same; an unsafe one never crashes, and trains the same or
carries a ``TODO(ampmigrate)`` marker. CI runs this fixed sample of the generator's features;
``python bench/generated_scripts.py`` draws a thousand (Hypothesis) and prints the safe share
per feature."""
import pytest

from migrate.api import migrate_source

from generated.apex_scripts import Features, script
from generated.judge import judge

pytestmark = pytest.mark.slow  # an end-to-end run: `-m slow`, and in CI

SAMPLE = [
    Features(loss="arms", loop="while", accumulation="delay_unscale", boundary="minus_one",
             clip="none", clip_at="micro_batch", flag="on", import_guard=True, inner_fp32=True,
             names=("net", "opt", "objective")),
    # a trainer keeping `self.amp` (None when off), two optimizers stepped in a loop after a
    # clip of one's master params, a checkpoint through helpers taking `amp=`
    Features(loss="method", loop="enumerate", accumulation="plain", boundary="plus_one",
             clip="master_params", clip_at="boundary", flag="off", import_guard=False,
             inner_fp32=False, names=("network", "optim", "train_loss"), holder="method",
             amp_via="attribute", optimizers="two", checkpoint=True),
    # amp handed to the training function by position, a clip of two optimizers' parameters
    # (one unscale_ each), a registered einsum, an iteration skipped
    Features(loss="inline", loop="range", accumulation="none", boundary="plus_one",
             clip="parameters", clip_at="boundary", flag="on", import_guard=True,
             inner_fp32=False, names=("model", "optimizer", "loss"), amp_via="parameter",
             optimizers="two", early_continue=True, register_half=True),
]


def assert_rewrites_hold(outcome):
    problems = {"a safe rewrite trains differently": outcome.safe_wrong,
                "an unsafe rewrite crashes": outcome.unsafe_crash,
                "an unsafe rewrite trains differently without a marker": outcome.unsafe_unmarked}
    found = [name for name, happened in problems.items() if happened]
    assert not found, f"{found}: {outcome.summary}\n" + "\n".join(outcome.reports.values())


def assert_migrated_and_the_same(drawn, tmp_path):
    """The safe rewrite migrates the whole script and trains the same; the unsafe one holds too."""
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same" and outcome.safe_complete, outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("drawn", SAMPLE, ids=lambda f: f.label().replace(", ", "/"))
def test_generated_scripts_keep_training_the_same(drawn, tmp_path):
    outcome = judge(drawn, tmp_path)
    assert outcome.safe != "unchanged"  # the sample is migrated, not left alone
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("drawn", [
    # a floor at the start scale that an overflow reaches, and NaN batches skipped before the backward
    Features(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="parameters",
             clip_at="boundary", flag="none", import_guard=False, inner_fp32=False,
             names=("model", "optimizer", "loss"), overflow=True, scale_bounds="floor", nan_skip=True),
    # both bounds, a trainer's method, accumulation, the flag on
    Features(loss="helper", loop="while", accumulation="plain", boundary="minus_one", clip="master_params",
             clip_at="boundary", flag="on", import_guard=False, inner_fp32=False, names=("net", "opt", "objective"),
             holder="method", scale_bounds="both", nan_skip=True),
], ids=["floor-overflow-nan_skip", "both-method-accumulation"])
def test_apexs_scale_bounds_and_a_nan_skip_are_safe_and_train_the_same(drawn, tmp_path):
    assert_migrated_and_the_same(drawn, tmp_path)


@pytest.mark.parametrize("accumulation", ["none", "plain"])
@pytest.mark.parametrize("between", ["aux_backward", "parameter_loop"])
def test_what_runs_between_the_clip_and_the_step(accumulation, between, tmp_path):
    """A second scaled backward after the clip (an auxiliary loss) adds scaled gradients to
    what an ``unscale_`` before the clip would have unscaled: the clip works on the scaled
    ones instead. A loop over the parameters with its own ``continue`` ends no iteration."""
    drawn = Features(loss="inline", loop="range", accumulation=accumulation, boundary="plus_one",
                     clip="parameters", clip_at="boundary", flag="on" if between == "aux_backward" else "none",
                     import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"), between=between)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe != "unchanged"
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("flag", ["on", "off"])
@pytest.mark.parametrize("backward_in", ["helper", "loop"])
def test_the_flag_under_another_name(flag, backward_in, tmp_path):
    """A trainer's ``initialize`` tests its ``use_amp`` parameter and training tests the copy
    ``self.use_amp``; in a ``backward(loss)`` method, fp32 runs call ``loss.backward()`` and return
    early. The plain backward runs only where the scaler is off: the safe rewrite migrates it."""
    drawn = Features(loss="inline", loop="range", accumulation="none", boundary="plus_one",
                     clip="parameters", clip_at="boundary", flag=flag, import_guard=False,
                     inner_fp32=False, names=("model", "optimizer", "loss"), holder="method",
                     backward_in=backward_in, flag_copy=True)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("accumulation, between, finite_guard", [
    ("none", "aux_backward", False), ("plain", "aux_backward", False), ("plain", "none", True)])
def test_the_scaled_backward_in_a_method_and_what_follows_it(accumulation, between, finite_guard, tmp_path):
    """``self.backward(loss)`` holds ``amp.scale_loss``; the loop clips, then runs a second
    scaled backward (the clip saw the first one's gradients, unscaled by apex), or steps only
    ``if math.isfinite(norm)`` after an overflow (apex lowered the scale whichever way)."""
    drawn = Features(loss="dict", loop="enumerate", accumulation=accumulation, boundary="minus_one",
                     clip="parameters", clip_at="boundary", flag="none", import_guard=False,
                     inner_fp32=False, names=("model", "optimizer", "loss"), holder="method",
                     backward_in="helper", between=between, finite_guard=finite_guard, overflow=finite_guard)
    outcome = judge(drawn, tmp_path)
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("accumulation", ["none", "plain"])
def test_a_plain_warmup_step_that_ends_the_iteration(accumulation, tmp_path):
    """``if step < 2: loss.backward(); opt.step(); continue`` before the scaled path: the plain
    backward never runs in a pass with the scaled one, so the safe rewrite migrates the file."""
    drawn = Features(loss="inline", loop="while", accumulation=accumulation, boundary="plus_one",
                     clip="parameters", clip_at="boundary", flag="none", import_guard=False,
                     inner_fp32=False, names=("model", "optimizer", "loss"), warmup=True)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("clip", ["parameters", "master_params"])
def test_a_clip_after_a_delayed_pass(clip, tmp_path):
    """apex clipped the still-scaled gradients of a ``delay_unscale=True`` pass at the bare
    threshold: the safe rewrite leaves it, the unsafe one clips the true gradients and says so."""
    drawn = Features(loss="inline", loop="range", accumulation="delay_unscale",
                     boundary="plus_one", clip=clip, clip_at="micro_batch", flag="none",
                     import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"))
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "unchanged" and outcome.unsafe.startswith("differs: clip")
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize(("delay_spelling", "clip", "boundary"), [
    ("not_flag", "master_params", "minus_one"), ("accumulating", "parameters", "plus_one"),
    ("comparison", "master_params", "plus_one")])
def test_a_clip_at_the_boundary_of_delayed_passes_beside_a_native_path(delay_spelling, clip, boundary, tmp_path):
    """A clip under the boundary's test (``if boundary:`` beside ``delay_unscale=not boundary``, in
    each spelling) runs only where apex unscaled: the scale-aware clip a native path beside the
    step calls for is then exact, a safe rewrite."""
    drawn = Features(loss="inline", loop="range", accumulation="delay_unscale", boundary=boundary,
                     clip=clip, clip_at="boundary", flag="on", import_guard=False, inner_fp32=False,
                     names=("model", "optimizer", "loss"), native_beside=True, delay_spelling=delay_spelling)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert_rewrites_hold(outcome)


def test_a_clip_of_scaled_gradients_through_an_attribute_that_is_none_when_off(tmp_path):
    """Found by the bench (1,000 scripts, seed 0, #762): `self.amp` is None when fp16 is off, and a
    clip on every micro-batch (the step may not follow, so it clips the scaled gradients at the
    threshold times the scale) must then clip at the bare threshold, not call `None.get_scale()`."""
    drawn = Features(loss="arms", loop="enumerate", accumulation="plain", boundary="minus_one",
                     clip="master_params", clip_at="micro_batch", flag="on", import_guard=True,
                     inner_fp32=False, names=("model", "optimizer", "loss"), holder="method",
                     amp_via="attribute", early_continue=True)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary  # both runs: fp16 on, and --no-fp16
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("loop_in", ["function", "defaults", "closure"])
def test_the_scaler_goes_to_the_training_function_as_a_parameter(loop_in, tmp_path):
    """The loop in a function of its own reading the global `amp`: main makes the GradScaler and
    hands it over (`train(..., scaler=scaler)`; a function inside main sees it already), no
    `global scaler`, and it trains the same, the flag on and off."""
    drawn = Features(loss="helper", loop="range", accumulation="none", boundary="plus_one",
                     clip="master_params", clip_at="boundary", flag="off", import_guard=False,
                     inner_fp32=False, names=("model", "optimizer", "loss"), checkpoint=True,
                     loop_in=loop_in)
    rewritten = migrate_source(script(drawn), filename="train.py").new_source
    assert "global scaler" not in rewritten and "enabled=False" not in rewritten, rewritten
    assert ("scaler=scaler" in rewritten) == (loop_in != "closure"), rewritten
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("flag, initialize_always", [("none", False), ("off", False), ("on", True), ("off", True)])
@pytest.mark.parametrize("clip_at", ["boundary", "micro_batch"])
def test_micro_batches_in_a_loop_of_their_own(flag, initialize_always, clip_at, tmp_path):
    """The scaled backward in an inner loop over micro-batches, the step after it (seen in a GAN
    trainer's generator step): the step keeps the test the backward ran under, as where the step
    is beside it (stepping through an enabled scaler where nothing was scaled raised), and a
    clip inside the inner loop, between two backward passes, is scale-aware, by the scale only
    where the backward was scaled (``initialize`` either way, the flag picking the backward)."""
    drawn = Features(loss="inline", loop="range", accumulation="inner_loop", boundary="plus_one",
                     clip="parameters", clip_at=clip_at, flag=flag, import_guard=False, inner_fp32=False,
                     names=("model", "optimizer", "loss"), initialize_always=initialize_always)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("flag", ["none", "off"])
@pytest.mark.parametrize("clip", ["none", "parameters"])
def test_a_scaled_backward_in_each_arm_one_in_a_loop_of_micro_batches(flag, clip, tmp_path):
    """Even steps scale the micro-batches' losses in a loop of their own, odd steps the whole
    batch's in the other arm: the step after both goes through the scaler either way (it took
    the first arm's test, and the other arm's steps went plain, without the update: the next
    ``unscale_`` raised)."""
    drawn = Features(loss="inline", loop="range", accumulation="inner_loop", boundary="plus_one",
                     clip=clip, clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False,
                     names=("model", "optimizer", "loss"), alternate=True)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("drawn", [
    # `self.amp` None when off, two optimizers stepped in a loop: the step's test is what both
    # arms share (`self.amp is not None`), not an `or` of the two the lint then misread
    Features(loss="dict", loop="enumerate", accumulation="inner_loop", boundary="plus_one", clip="parameters",
             clip_at="boundary", flag="off", import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"),
             holder="method", amp_via="attribute", optimizers="two", checkpoint=True, flag_copy=True, alternate=True),
    # the update after a test of the clipped norm takes either arm's test, not the last one's
    Features(loss="inline", loop="range", accumulation="inner_loop", boundary="minus_one", clip="parameters",
             clip_at="boundary", flag="on", import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"),
             holder="method", checkpoint=True, finite_guard=True, flag_copy=True, alternate=True),
], ids=["attribute-two-optimizers", "finite-guard"])
def test_both_arms_scaled_with_what_follows_the_step(drawn, tmp_path):
    assert_rewrites_hold(judge(drawn, tmp_path))


@pytest.mark.parametrize("holder, loop_in", [("function", "main"), ("function", "closure"), ("method", "main")])
def test_a_float16_evaluation_after_training_is_left_to_a_person(holder, loop_in, tmp_path):
    """After training, an evaluation casts the model to float16 and feeds it float32 batches,
    which apex's casts made work (seen in a fresh repository's ``validate``): a rewrite without
    autocast there crashes, so the file is left as it is, and says why."""
    drawn = Features(loss="inline", loop="enumerate", accumulation="none", boundary="plus_one", clip="parameters",
                     clip_at="boundary", flag="none", import_guard=False, inner_fp32=False,
                     names=("net", "opt", "loss"), holder=holder, loop_in=loop_in, half_evaluation=True)
    outcome = judge(drawn, tmp_path)
    assert (outcome.safe, outcome.unsafe) == ("unchanged", "unchanged"), outcome.summary
    reasons = [d.message for d in migrate_source(script(drawn), "train.py").diagnostics if d.code == "AMP002"]
    assert reasons and all("casts a model to float16" in reason for reason in reasons)


@pytest.mark.parametrize("flag", ["none", "on", "off"])
@pytest.mark.parametrize("optimizers", ["one", "two"])
@pytest.mark.parametrize("trainer_init", ["own", "base", "none"])
def test_a_trainer_handed_the_model_keeps_the_scaler_on_itself(flag, optimizers, trainer_init, tmp_path):
    """A trainer whose ``setup`` initializes the model and optimizer it is handed (and hands them
    back) and whose ``train`` is handed them again: the scaler is the trainer's attribute, a
    disabled one made in ``__init__`` until ``setup`` runs (a class attribute where ``__init__``
    only calls its base's, or is inherited), as a person writes it, not a module global set
    through ``global scaler``; trained, the rewrite is the original."""
    drawn = Features(loss="inline", loop="enumerate", accumulation="none", boundary="plus_one",
                     clip="master_params", clip_at="boundary", flag=flag, import_guard=False,
                     inner_fp32=False, names=("model", "optimizer", "loss"), holder="handed",
                     optimizers=optimizers, trainer_init=trainer_init)
    fixed = migrate_source(script(drawn), filename="train.py").new_source
    assert "global " not in fixed and "self.scaler = torch.amp.GradScaler(" in fixed, fixed
    stand_in = 'scaler = torch.amp.GradScaler("cuda", enabled=False)  # until `setup()` runs'
    assert ("self." + stand_in in fixed) == (trainer_init == "own") and stand_in in fixed, fixed
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("flag", ["on", "none"])
@pytest.mark.parametrize("accumulation", ["none", "plain"])
def test_a_loss_from_the_callers_forward_pass_puts_that_pass_under_autocast(flag, accumulation, tmp_path):
    """The trainer's ``backward_from(output, x, y)`` computes the loss from the output the loop's
    forward pass made (and runs the model once more itself): apex cast that forward pass, so the
    caller's forward goes under an autocast of its own, enabled as the method's (a real GAN
    trainer's shape, its forward in one method, its update in another)."""
    drawn = Features(loss="inline", loop="range", accumulation=accumulation, boundary="plus_one",
                     clip="parameters", clip_at="boundary", flag=flag, import_guard=False,
                     inner_fp32=False, names=("model", "optimizer", "loss"), holder="method",
                     backward_in="update")
    fixed = migrate_source(script(drawn), filename="train.py").new_source
    caller = fixed[fixed.index("    def train("):]
    assert caller.index("torch.autocast(") < caller.index("output = self.model(x)") < caller.index(
        "loss = self.backward_from(output, x, y)"), fixed
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same" and outcome.safe_complete, outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("flag, accumulation, memory, between", [
    ("on", "none", "none", "none"), ("none", "plain", "none", "none"), ("none", "none", "teacher", "none"),
    ("on", "none", "after", "none"), ("on", "plain", "none", "aux_backward"), ("none", "none", "teacher", "aux_backward")])
def test_a_loss_from_an_attribute_another_method_set_puts_that_method_under_autocast(flag, accumulation, memory, between, tmp_path):
    """The loop calls ``self.run_forward(x)``, which sets ``self.output``; ``backward_stored(x, y)``
    computes the loss from it and scales it (a GAN model's ``forward()`` and ``backward_G()``). apex
    cast that forward pass, so ``run_forward`` gets an autocast of its own, enabled as the region at
    the scaled backward; a no-grad pass in the loop (a teacher's) follows the same region. The loop
    scaling a loss of its own (``aux_backward``) does not put ``run_forward`` in its region."""
    drawn = Features(loss="inline", loop="range", accumulation=accumulation, boundary="plus_one",
                     clip="parameters", clip_at="boundary", flag=flag, import_guard=False,
                     inner_fp32=False, names=("model", "optimizer", "loss"), holder="method",
                     backward_in="stored", memory=memory, between=between)
    fixed = migrate_source(script(drawn), filename="train.py").new_source
    # under an autocast of its own, or of the caller's region (`y` handed in, made from a forward pass)
    in_method = "    def run_forward(self, x):\n        with torch.autocast(" in fixed
    caller = fixed[fixed.index("    def train("):].splitlines()
    call = next(i for i, line in enumerate(caller) if line.strip() == "self.run_forward(x)")
    indent = len(caller[call]) - len(caller[call].lstrip())
    opening = next(line for line in reversed(caller[:call]) if len(line) - len(line.lstrip()) < indent)
    in_caller = opening.strip().startswith("with torch.autocast(")
    assert in_method or (in_caller and memory == "after"), fixed
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same" and outcome.safe_complete, outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("flag", ["none", "on"])
@pytest.mark.parametrize("clip", ["none", "master_params"])
def test_a_scaling_method_and_a_loop_stepping_each_optimizer_in_its_caller(flag, clip, tmp_path):
    """The trainer's ``backward(loss)`` scales; ``train`` steps ``for optimizer in
    self.optimizers: optimizer.step()``: the steps are found in the file as a loop over the list
    scaled, as next to the backward."""
    drawn = Features(loss="inline", loop="range", accumulation="plain", boundary="plus_one", clip=clip,
                     clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False,
                     names=("model", "optimizer", "loss"), holder="method", optimizers="two", backward_in="helper")
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("clip_in, clip, accumulation, clip_at", [
    ("helper", "master_params", "none", "boundary"), ("closure", "parameters", "none", "boundary"),
    ("helper", "parameters", "plain", "micro_batch"), ("closure", "master_params", "plain", "micro_batch")])
def test_a_clip_written_in_a_helper_or_a_closure(clip_in, clip, accumulation, clip_at, tmp_path):
    """The clip a helper does: ``unscale_`` once, before the call, where the step follows it
    (before, a second one in the helper raised, or a closure clipped the scaled gradients); after
    every micro-batch, none (it would raise at the second), and the rewrite is unsafe."""
    drawn = Features(loss="inline", loop="range", accumulation=accumulation, boundary="plus_one", clip=clip,
                     clip_at=clip_at, flag="none", import_guard=False, inner_fp32=False,
                     names=("model", "optimizer", "loss"), clip_in=clip_in)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == ("same" if clip_at == "boundary" else "unchanged"), outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("holder, feature", [
    ("function", {"grads_in": "local"}), ("method", {"grads_in": "attribute"}), ("handed", {"grads_in": "local"}),
    ("function", {"import_in": "function", "flag": "on"}), ("method", {"import_in": "global_first", "flag": "on"}),
    ("handed", {"import_in": "guarded", "flag": "on"})])
def test_shapes_safe_fixes_now_migrate_as_they_train(holder, feature, tmp_path):
    """``grads_in``: an object of the file made with the model and its optimizer sets the learning
    rate from the gradients' norm before the step (an EWC regulariser's Fisher update has this
    shape): it must see unscaled gradients, as under apex. ``import_in``: ``from apex import amp``
    with ``global amp`` in the initializing function, read by the training function (before,
    left alone)."""
    drawn = Features(**{"loss": "inline", "loop": "enumerate", "accumulation": "none", "boundary": "plus_one",
                        "clip": "none", "clip_at": "boundary", "flag": "none", "import_guard": False, "inner_fp32": False,
                        "names": ("net", "opt", "loss"), "holder": holder, **feature})
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("clip_in", ["helper", "closure"])
def test_a_warm_up_backward_beside_a_scaled_one_in_a_helper(clip_in, tmp_path):
    """The first iterations take a plain backward and step; later ones scale in the trainer's
    ``backward(loss)`` and clip in a helper (whose ``amp.master_params`` makes the GradScaler a
    module global). Every step goes through the scaler, so the unsafe rewrite scales the plain
    backward too: left plain, ``scaler.step`` raised at the first iteration (nothing scaled)."""
    drawn = Features(loss="helper", loop="enumerate", accumulation="plain", boundary="plus_one", clip="master_params",
                     clip_at="boundary", flag="none", import_guard=False, inner_fp32=True, names=("model", "optimizer", "loss"),
                     holder="method", overflow=True, between="parameter_loop", warmup=True, backward_in="helper",
                     trainer_init="none", clip_in=clip_in, grads_in="attribute", import_in="function")
    assert_rewrites_hold(judge(drawn, tmp_path))


@pytest.mark.parametrize("backward_in, flag, accumulation", [("loop", "on", "plain"), ("helper", "off", "none")])
def test_a_native_scaler_path_beside_the_apex_one(backward_in, flag, accumulation, tmp_path):
    """Where the flag is off, a native GradScaler of the module scales the backward pass and steps
    the optimizer (trainers offering both paths): both runs train the same after either rewrite."""
    drawn = Features(loss="inline", loop="range", accumulation=accumulation, boundary="plus_one", clip="parameters",
                     clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"),
                     holder="method", backward_in=backward_in, native_beside=True)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("accumulation, flag, holder", [("plain", "none", "function"), ("none", "on", "method")])
def test_the_loss_and_its_backward_in_each_arm_after_the_forward(accumulation, flag, holder, tmp_path):
    """``output = model(x)``, then each arm of an ``if`` computes the loss (the target cast to the
    output's dtype) and scales its backward: the loss goes under autocast in each arm (before, it
    computed in float16 outside the forward's region: the safe rewrite trained differently)."""
    drawn = Features(loss="arms_backward", loop="range", accumulation=accumulation, boundary="plus_one", clip="none",
                     clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"),
                     holder=holder)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("holder, backward_in, flag", [("function", "loop", "on"), ("function", "loop", "off"),
                                                       ("method", "helper", "on")])
def test_the_flags_block_sets_the_level_initialize_reads(holder, backward_in, flag, tmp_path):
    """``if use_amp: opt_level = "O1"; amp.initialize(..., opt_level=opt_level)``: the scaler is
    made in the block, a disabled one before it. In a function that runs the block first, with
    every scaled backward under the flag, the safe rewrite migrates it; in the trainer's
    ``backward`` (the plain backward returning early where the flag is off) the unsafe rewrite
    no longer scales that plain backward with a scaler that may not exist (AttributeError before)."""
    drawn = Features(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="none",
                     clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"),
                     holder=holder, backward_in=backward_in, level_in_block=True)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == ("same" if holder == "function" else "unchanged"), outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("native_beside, flag_copy", [(False, False), (True, True)])
def test_warmup_backwards_beside_a_scaler_made_in_the_flags_block(native_beside, flag_copy, tmp_path):
    """Warm-up steps (``if step < 2: loss.backward(); opt.step()``) beside the trainer's scaling
    ``backward``, the scaler made in the flag's block (which sets the level): every plain backward
    before a step through the scaler is scaled where the scaler exists, asked as its steps ask
    (bench seed 52: the unsafe rewrite crashed, `scaler.step` with nothing scaled, or
    AttributeError where a later pass scaled one without asking)."""
    drawn = Features(loss="helper", loop="range", accumulation="none", boundary="minus_one", clip="none",
                     clip_at="boundary", flag="on", import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"),
                     holder="method", backward_in="helper", level_in_block=True, warmup=True,
                     native_beside=native_beside, flag_copy=flag_copy)
    outcome = judge(drawn, tmp_path)
    assert_rewrites_hold(outcome)
    unsafe = (tmp_path / "unsafe.py").read_text()
    assert unsafe.count('if getattr(self, "scaler", None) is not None else loss).backward()') >= 1


@pytest.mark.parametrize("alternate", [False, True])
def test_a_closure_clipping_after_each_micro_batch_of_a_scaling_method(alternate, tmp_path):
    """The micro-batches in a loop of their own, each scaled by the trainer's ``backward(loss)``
    and clipped by a closure reading ``amp.master_params``, the step after the loop (seed 49 of the
    bench, 4 scripts): the closure is a read after a backward pass, so no ``unscale_`` goes into it
    (it raised at the second micro-batch, in the safe rewrite)."""
    drawn = Features(loss="helper", loop="enumerate", accumulation="inner_loop", boundary="minus_one", clip="master_params",
                     clip_at="micro_batch", flag="none", import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"),
                     holder="method", backward_in="helper", clip_in="closure", alternate=alternate)
    assert_rewrites_hold(judge(drawn, tmp_path))


@pytest.mark.parametrize("flag", ["on", "off"])
def test_each_arms_loss_goes_under_autocast_where_a_helper_scales_it(flag, tmp_path):
    """Micro-batches, each arm computing the loss and handing it to the trainer's ``backward``
    (``self.backward(objective)``): the arm's loss is sliced by the name the caller hands in,
    not the helper's parameter (bench seed 52: the safe rewrite left it in float32, 3 scripts)."""
    drawn = Features(loss="arms_backward", loop="range", accumulation="inner_loop", boundary="minus_one", clip="parameters",
                     clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False, names=("net", "optimizer", "objective"),
                     holder="method", backward_in="helper", checkpoint=True, clip_in="closure", trainer_init="base")
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert_rewrites_hold(outcome)


def test_nested_arms_of_one_test_step_each_optimizer_plainly_where_nothing_was_scaled(tmp_path):
    """Arms of ``step % 2 == 0`` nested in arms of the same test, each scaling its backward under
    the run's flag, two optimizers stepped in a loop: the step's test is the flag alone (it was
    ``flag and ((a and a) or (not a and not a))``, whose ``else`` a later pass sent through the
    scaler too: ``scaler.step`` with nothing scaled raised, bench seed 52, 4 scripts)."""
    drawn = Features(loss="arms_backward", loop="while", accumulation="inner_loop", boundary="minus_one", clip="none",
                     clip_at="micro_batch", flag="off", import_guard=False, inner_fp32=False, names=("network", "optim", "objective"),
                     holder="method", optimizers="two", checkpoint=True, initialize_always=True, alternate=True)
    outcome = judge(drawn, tmp_path)
    assert_rewrites_hold(outcome)


def test_a_step_in_an_arm_on_what_received_the_scaler(tmp_path):
    """A trainer whose scaler is made in a block (``if use_amp: opt_level = "O1"``) and handed to
    ``self.amp`` (None when off), its step under ``if self.amp is not None:``: the rewritten step
    asks nothing twice (not whether ``self.scaler`` exists, where ``self.amp`` holds it) and trains
    as before."""
    drawn = Features(loss="helper", loop="range", accumulation="delay_unscale", boundary="plus_one",
                     clip="parameters", clip_at="boundary", flag="on", import_guard=False, inner_fp32=True,
                     names=("net", "optimizer", "train_loss"), holder="method", amp_via="attribute",
                     native_beside=True, level_in_block=True)
    outcome = judge(drawn, tmp_path)
    assert_rewrites_hold(outcome)
    assert 'getattr(self, "scaler", None) is not None) and (self.amp' not in migrate_source(
        script(drawn), "train.py", unsafe_fixes=True).new_source


@pytest.mark.parametrize("holder", ["function", "method", "handed"])
@pytest.mark.parametrize("flag", ["on", "off"])
def test_a_backward_function_handed_the_optimizer(holder, flag, tmp_path):
    """``scaled_backward(loss, optimizer, use_amp)``, a module-level function taking the optimizer
    under another name and the flag: the caller's step goes through the scaler, its forward pass
    under autocast, and the function's plain arm stays plain; run with the flag either way. Where
    the flag is a parameter of the trainer's methods (``handed``), whether the function's flag is
    the one the scaler was made with is not known: the rewrite is unsafe, and holds."""
    drawn = Features(loss="inline", loop="range" if flag == "on" else "enumerate", accumulation="none",
                     boundary="plus_one", clip="parameters", clip_at="boundary", flag=flag, import_guard=False,
                     inner_fp32=False, names=("model", "optimizer", "loss"), holder=holder, backward_in="function")
    outcome = judge(drawn, tmp_path)
    assert outcome.safe_complete == (holder != "handed"), outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize(("holder", "flag", "loop"), [("function", "on", "range"), ("method", "on", "range"),
                                                      ("method", "off", "enumerate"), ("function", "none", "range")])
def test_a_backward_function_called_through_a_partial(holder, flag, loop, tmp_path):
    """``backwards = functools.partial(flagged_backward, use_amp)`` (by position in a ``range``
    loop), ``partial(scaled_backward, mixed=use_amp)`` (by keyword), or, with no flag, the
    optimizer bound: the partial's calls are the function's, its steps go through the scaler."""
    drawn = Features(loss="inline", loop=loop, accumulation="none", boundary="plus_one", clip="none",
                     clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False,
                     names=("model", "optimizer", "loss"), holder=holder, backward_in="partial")
    outcome = judge(drawn, tmp_path)
    assert outcome.safe_complete, outcome.summary  # with no flag, the function's plain arm never runs
    assert outcome.unsafe == "same", outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("drawn", [
    Features(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="none", clip_at="boundary",
             flag="on", import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"),
             loop_in="function", entry="guard"),
    Features(loss="helper", loop="enumerate", accumulation="plain", boundary="plus_one", clip="parameters",
             clip_at="boundary", flag="off", import_guard=False, inner_fp32=False, names=("net", "opt", "objective"),
             holder="method", checkpoint=True, entry="guard"),
], ids=["function-flag_on", "method-checkpoint"])
def test_initialize_directly_under_the_main_guard_is_safe_and_trains_the_same(drawn, tmp_path):
    """``if __name__ == "__main__":`` holding main's body: the scaler is made there, a module
    global that a disabled one stands in for until then (a script runs that block whenever it runs)."""
    assert_migrated_and_the_same(drawn, tmp_path)


@pytest.mark.parametrize("clip", ["master_params", "none"])
@pytest.mark.parametrize("delay_spelling", ["accumulating", "not_flag"])
def test_a_nan_batch_skipped_at_the_boundary_after_a_delayed_pass_stays_unsafe(clip, delay_spelling, tmp_path):
    """The last micro-batch's loss is NaN (a batch of infinities) and skipped before its scaled
    backward: apex then stepped with the gradients the ``delay_unscale`` pass before it left
    scaled, where the scaler unscales them (bench seed 73, scripts 258 and 259). The safe
    rewrite leaves it; the unsafe one says why."""
    drawn = Features(loss="helper", loop="while", accumulation="delay_unscale", boundary="minus_one", clip=clip,
                     clip_at="boundary", flag="none", import_guard=False, inner_fp32=True, names=("net", "optimizer", "train_loss"),
                     loop_in="function", overflow=True, grads_in="local", delay_spelling=delay_spelling,
                     scale_bounds="both", nan_skip=True)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "unchanged", outcome.summary
    said = " ".join(line.strip().lstrip("#").strip() for line in (tmp_path / "unsafe.py").read_text().splitlines())
    assert "`delay_unscale` keeps gradients scaled" in said
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("clip", ["master_params", "parameters"])
def test_two_optimizers_in_a_list_under_a_nan_skip_keep_the_unsafe_rewrite_running(clip, tmp_path):
    """Two optimizers in a list, stepped in a loop, the scaled backward under a test that calls
    something (a NaN skip), a clip at the boundary: the scale-aware clip asked whether the list
    itself held gradients (``self.optims.param_groups``) and the unsafe rewrite raised (bench seed
    75, scripts 936-940). It asks each optimizer of the list now."""
    drawn = Features(loss="arms", loop="while", accumulation="none", boundary="minus_one", clip=clip, clip_at="boundary",
                     flag="off", import_guard=False, inner_fp32=False, names=("network", "optims", "loss"), holder="method",
                     amp_via="attribute", optimizers="two", between="aux_backward", trainer_init="base", import_in="function",
                     forward_via="wrapper", nan_skip=True)
    outcome = judge(drawn, tmp_path)
    assert not outcome.unsafe_crash, outcome.summary
    assert_rewrites_hold(outcome)


MEMORIES = [
    # after the step, in a `for` loop, the flag off by default (the `--fp16` run turns it on)
    Features(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="none",
             clip_at="boundary", flag="off", import_guard=False, inner_fp32=False,
             names=("model", "optimizer", "loss"), memory="after"),
    # the model put in eval() around the block, the mean taken after it, a trainer's method
    Features(loss="method", loop="while", accumulation="plain", boundary="minus_one", clip="parameters",
             clip_at="boundary", flag="none", import_guard=False, inner_fp32=False,
             names=("net", "opt", "objective"), holder="method", memory="eval_after"),
    # micro-batches in a loop of their own, the pass after it in the outer one
    Features(loss="helper", loop="enumerate", accumulation="inner_loop", boundary="plus_one", clip="none",
             clip_at="boundary", flag="on", import_guard=False, inner_fp32=False,
             names=("network", "optim", "train_loss"), memory="after"),
    # another network (a teacher copied from the model), a trainer's method, the flag on
    Features(loss="dict", loop="while", accumulation="none", boundary="plus_one", clip="none",
             clip_at="boundary", flag="on", import_guard=False, inner_fp32=False,
             names=("net", "opt", "loss"), holder="method", memory="teacher"),
]


@pytest.mark.parametrize("drawn", MEMORIES, ids=["after-flag", "eval_after-method", "after-inner_loop", "teacher-method"])
def test_a_forward_pass_without_gradients_after_the_step(drawn, tmp_path, monkeypatch):
    """A memory filled under ``torch.no_grad()`` after the step feeds the next targets: apex cast
    that pass too. The safe rewrite trains the same; without its own region it did not."""
    assert_migrated_and_the_same(drawn, tmp_path / "fixed")
    from migrate.apex_plan.detached_forwards import DetachedForwardPlanning
    monkeypatch.setattr(DetachedForwardPlanning, "plan_detached_forwards", lambda self: None)
    assert judge(drawn, tmp_path / "unfixed").safe == "differs: no-grad-precision"


@pytest.mark.parametrize("flag, penalty, grads_in", [("off", "keywords", "none"), ("on", "positional", "none"),
                                                     ("none", "none", "none"), ("off", "none", "attribute")])
def test_a_subclass_loop_a_base_trainers_set_up_method_and_a_gradient_penalty(flag, penalty, grads_in, tmp_path):
    """The loop in ``Trainer(BaseTrainer)`` hands its loss to the base's ``backward(loss)``; the
    base's ``__init__`` calls ``self.setup_amp()`` under the flag, and that method initializes; the
    loss adds a penalty on gradients taken afresh with ``autograd.grad`` (no read of the scaled
    ones). Each was a shape of real code the rewrite got wrong or refused: the safe rewrite
    migrates the whole script and trains the same, with the flag either way. With
    ``grads_in=attribute`` the base's ``__init__`` makes ``self.tracker``, which reads the
    gradients in the subclass's loop (found by the bench, seed 33: they were read still scaled)."""
    drawn = Features(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="parameters",
                     clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False,
                     names=("model", "optimizer", "loss"), holder="method", backward_in="helper",
                     methods_in="base", amp_setup="method", penalty=penalty, grads_in=grads_in)
    assert_migrated_and_the_same(drawn, tmp_path)


def test_a_warm_up_backward_in_a_subclass_of_the_scaling_trainer(tmp_path):
    """Drawn by the bench (seed 5000): ``BaseTrainer.backward`` scales the loss, ``Trainer(BaseTrainer)``
    runs a plain warm-up ``loss.backward()`` whose step goes through the scaler with every other:
    ``self.scaler`` is the same object in the subclass, so that backward is scaled by it too (it
    stayed plain, and the first ``scaler.step`` raised: "Attempted step but _scale is None")."""
    drawn = Features(loss="inline", loop="while", accumulation="plain", boundary="plus_one", clip="parameters",
                     clip_at="boundary", flag="on", import_guard=False, inner_fp32=False, names=("model", "optim", "loss"),
                     holder="method", amp_via="module", optimizers="one", checkpoint=False, early_continue=True,
                     between="parameter_loop", warmup=True, backward_in="helper", flag_copy=True, flag_via="options",
                     level_in_block=True, delay_spelling="comparison", forward_via="wrapper", clip_in="closure",
                     memory="after", native_beside=True, methods_in="base", amp_setup="method", penalty="keywords",
                     import_in="function")
    outcome = judge(drawn, tmp_path)
    assert not outcome.unsafe_crash, outcome.summary
    assert_rewrites_hold(outcome)


@pytest.mark.parametrize("flag, loop", [("none", "range"), ("on", "while"), ("off", "enumerate")])
def test_a_detached_pass_outside_the_micro_batch_loop_goes_under_autocast(flag, loop, tmp_path):
    """``bank = model(x).detach().mean()`` before the micro-batches' own loop, whose region reads
    the targets it shifts: apex ran that pass in float16 too, and the rewrite runs it under an
    autocast of its own (``detached_forwards``); it trains the same. (The shift is too small for
    the compare to part without it: tests/migrate/test_region_fed_from_outside.py shows one that does.)"""
    drawn = Features(loss="inline", loop=loop, accumulation="inner_loop", boundary="plus_one", clip="none",
                     clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False,
                     names=("model", "optimizer", "loss"), memory="reference")
    assert_migrated_and_the_same(drawn, tmp_path)
    lines = (tmp_path / "safe.py").read_text().splitlines()
    at = next(index for index, line in enumerate(lines) if line.strip() == "bank = model(x).detach().mean()")
    assert lines[at - 1].strip().startswith("with torch.autocast("), "\n".join(lines)
