"""Generator features for shapes first seen in real repositories the project was not tuned on:
scaled passes each under a test of their own before one clip (``Features.own_tests``), a helper
the loss calls defined in the loop body (``Features.local_helper``) and a discriminator's plain
pass after the scaled step (``Features.after_step``: ``critic``, ``critic_shared``) and the
native path's own autocast around the step (``Features.own_autocast``), and a function that
initializes and returns the model and its optimizer (``Features.setup_in``). Each is
judged by running the script against both rewrites (``python -m ampshim compare``)."""
import ast

import pytest

from migrate.api import migrate_source

from generated.apex_scripts import Features, script
from generated.test_generated_scripts import assert_migrated_and_the_same

PLAIN = dict(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="parameters",
             clip_at="boundary", flag="none", import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"))


@pytest.mark.slow
@pytest.mark.parametrize("own_tests, accumulation, flag", [
    ("flags", "none", "none"), ("weights", "plain", "on"), ("weights", "delay_unscale", "none"),
    ("one_always", "none", "off")])
def test_scaled_passes_under_their_own_tests_then_one_clip(own_tests, accumulation, flag, tmp_path):
    """Both tests hold: both passes run, and the clip's ``unscale_`` runs once (a second raised)."""
    drawn = Features(**{**PLAIN, "accumulation": accumulation, "flag": flag}, own_tests=own_tests)
    assert_migrated_and_the_same(drawn, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("local_helper, loss, holder", [
    ("after", "inline", "function"), ("before", "arms", "method"), ("after", "arms", "handed")])
def test_a_helper_defined_in_the_loop_between_the_forward_pass_and_the_loss(local_helper, loss, holder, tmp_path):
    """The region covers the forward pass above the definition, as apex's casts did."""
    drawn = Features(**{**PLAIN, "loss": loss, "flag": "on"}, holder=holder, local_helper=local_helper)
    assert_migrated_and_the_same(drawn, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("after_step, accumulation, flag", [
    ("critic_shared", "none", "none"), ("critic_shared", "none", "off"), ("critic", "none", "on"),
    ("critic", "plain", "none")])
def test_a_discriminator_pass_after_the_scaled_step(after_step, accumulation, flag, tmp_path):
    """The discriminator's forward pass goes under autocast (apex O1 cast it), its backward stays
    plain; on the model's detached output its gradients never reach the scaled step."""
    drawn = Features(**{**PLAIN, "accumulation": accumulation, "flag": flag}, after_step=after_step)
    rewritten = migrate_source(script(drawn), filename="train.py").new_source
    assert "critic_loss.backward()" in rewritten, rewritten
    assert_migrated_and_the_same(drawn, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("own_autocast, loss, accumulation, holder", [
    ("forward", "inline", "none", "function"), ("forward", "arms", "plain", "method"),
    ("step", "inline", "none", "function"), ("step", "helper", "delay_unscale", "function"),
    ("step", "arms", "plain", "method"), ("step", "dict", "inner_loop", "method")])
def test_the_native_paths_own_autocast_holds_the_step(own_autocast, loss, accumulation, holder, tmp_path):
    """The file's own region, on where the native path runs, is widened to apex's path; a region
    nested in it, off where the scaler is, switched the native forward pass to float32."""
    drawn = Features(**{**PLAIN, "loss": loss, "accumulation": accumulation, "flag": "off"}, holder=holder,
                     native_beside=True, own_autocast=own_autocast)
    rewritten = migrate_source(script(drawn), filename="train.py").new_source
    assert rewritten.count("torch.autocast(") == 1, rewritten
    assert_migrated_and_the_same(drawn, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("flag, loop_in, import_guard, optimizers", [
    ("none", "function", False, "one"), ("on", "main", False, "two"), ("off", "closure", True, "one"),
    ("on", "defaults", True, "two")])
def test_a_builder_returns_the_scaler_with_the_model_and_optimizer(flag, loop_in, import_guard, optimizers, tmp_path):
    """``model, optimizer = build(...)`` takes the scaler back too, and hands it on: no global."""
    drawn = Features(**{**PLAIN, "flag": flag, "import_guard": import_guard}, holder="function", loop_in=loop_in,
                     optimizers=optimizers, setup_in="builder")
    rewritten = migrate_source(script(drawn), filename="train.py").new_source
    assert "global scaler" not in rewritten and ", scaler = build(" in rewritten, rewritten
    assert_migrated_and_the_same(drawn, tmp_path)


def test_the_generated_features_spell_what_they_name():
    """The features draw the shapes they name (a guard against a feature the coherence rules drop)."""
    drawn = Features(**PLAIN, own_tests="flags", local_helper="after", after_step="critic")
    tree = ast.parse(script(drawn))
    tests = [ast.unparse(node.test) for node in ast.walk(tree) if isinstance(node, ast.If)]
    assert "TRAIN_MAIN" in tests and "TRAIN_AUX" in tests
    loop = next(node for node in ast.walk(tree) if isinstance(node, ast.For))
    assert any(isinstance(node, ast.FunctionDef) and node.name == "shaped" for node in loop.body)
    assert "critic_loss.backward()" in ast.unparse(loop)
    native = Features(**{**PLAIN, "flag": "off"}, native_beside=True, own_autocast="step")
    withs = [node for node in ast.walk(ast.parse(script(native))) if isinstance(node, ast.With)]
    assert any("enabled=not use_amp" in ast.unparse(node.items[0].context_expr) for node in withs)
    built = ast.parse(script(Features(**PLAIN, holder="function", setup_in="builder")))
    assert any(isinstance(node, ast.FunctionDef) and node.name == "build" for node in built.body)


@pytest.mark.slow
@pytest.mark.parametrize("flag, setup_in, optimizers, loop", [
    ("none", "main", "one", "range"), ("on", "builder", "two", "while"), ("off", "builder_in_with", "one", "enumerate"),
    ("off", "main", "two", "range")])
def test_the_scaler_goes_down_a_chain_of_callers(flag, setup_in, optimizers, loop, tmp_path):
    """``main`` -> ``run`` -> ``train``: each function on the way takes the scaler and hands it on
    (``scaler=scaler`` twice), made in main or returned by a builder (its call in a ``with`` too)."""
    drawn = Features(**{**PLAIN, "flag": flag, "loop": loop}, holder="function", loop_in="relay",
                     optimizers=optimizers, setup_in=setup_in)
    rewritten = migrate_source(script(drawn), filename="train.py").new_source
    assert "global scaler" not in rewritten and rewritten.count("scaler=scaler") == 2, rewritten
    assert_migrated_and_the_same(drawn, tmp_path)
