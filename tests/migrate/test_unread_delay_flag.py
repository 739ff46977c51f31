"""A local computed only for ``amp.scale_loss(..., delay_unscale=<local>)`` is read by nothing once
the keyword goes (GradScaler keeps the gradients scaled until the step): it goes too, with the
comments above it that speak of apex or of the flag. A flag read again, one whose value calls
something, or one under an unrelated comment stays. Spellings: the flag's name and value, keyword
or position, its place in the loop, and the comments above it; one runs through ``compare``."""
from __future__ import annotations

import itertools

import pytest

from generated.apex_scripts import Features, script
from generated.test_generated_scripts import assert_migrated_and_the_same
from migrate.api import migrate_source

VALUES = ("(step + 1) % accumulation != 0", "step % accumulation != accumulation - 1", "not (step + 1) % accumulation == 0")
COMMENTS = {"none": "", "apex": "# see https://nvidia.github.io/apex/advanced.html\n",
            "flag": "# delay the unscale until the boundary\n"}


def _script(name: str, value: str, comment: str, place: str, passing: str, read_again: bool = False) -> str:
    flag = f"{COMMENTS[comment]}{name} = {value}\n"
    passed = f"delay_unscale={name}" if passing == "keyword" else f"0, None, {name}"
    loss = "loss = torch.nn.functional.mse_loss(model(x), y) / accumulation\n"
    scaled = (f"with amp.scale_loss(loss, optimizer, {passed}) as scaled_loss:\n"
              "    scaled_loss.backward()\n")
    if place == "after_loss":
        step = loss + flag + scaled
    elif place == "first":  # before the forward pass
        step = flag + loss + scaled
    else:  # the first line of the block of an `if` around the scaled pass
        step = loss + "if True:\n" + _indent(flag + scaled)
    boundary = f"if not {name}:\n" if read_again else "if (step + 1) % accumulation == 0:\n"
    return ("import torch\nfrom apex import amp\n\n\n"
            "def train(model, optimizer, batches, accumulation):\n"
            '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
            "    for step, (x, y) in enumerate(batches):\n"
            + _indent(step + boundary + "    optimizer.step()\n    optimizer.zero_grad()\n", 2))


def _indent(text: str, depth: int = 1) -> str:
    return "".join("    " * depth + line if line.strip() else line for line in text.splitlines(keepends=True))


@pytest.mark.parametrize("name, value, comment, place, passing", [
    (name, value, comment, place, passing) for (name, value), comment, place, passing in itertools.product(
        zip(("delay_unscale", "delay", "accumulating"), VALUES), COMMENTS, ("after_loss", "first", "in_if"),
        ("keyword", "position"))])
def test_the_flag_goes_with_the_keyword(name, value, comment, place, passing):
    result = migrate_source(_script(name, value, comment, place, passing), "train.py")
    new = result.new_source
    assert new is not None and "amp.scale_loss" not in new, new
    assert f"{name} =" not in new and value not in new, new
    assert "apex.html" not in new and "delay the unscale" not in new, new
    if place == "in_if":  # the block opens on the scaled backward, with no blank line before it
        assert "if True:\n            scaler.scale(loss).backward()\n" in new, new


@pytest.mark.parametrize("shape", ["read_again", "calls", "unrelated_comment", "global", "in_the_region"])
def test_a_flag_that_does_more_stays(shape):
    value = "not at_boundary(step)" if shape == "calls" else "(step + 1) % accumulation != 0"
    source = _script("delay", value, "none", "after_loss", "keyword", read_again=shape == "read_again")
    if shape == "unrelated_comment":
        source = source.replace("        delay = ", "        # the backward pass\n        delay = ")
    if shape == "global":  # a module-level flag another module may read
        source = source.replace("        delay = (step + 1) % accumulation != 0\n", "").replace(
            "def train(", "delay = False\n\n\ndef train(")
    if shape == "in_the_region":  # between two forward passes: it moves under autocast with them
        source = source.replace("        loss = torch", "        hidden = model(x)\n        loss = torch").replace(
            "        delay = (step + 1) % accumulation != 0\n", "").replace(
            "        hidden = model(x)\n", "        hidden = model(x)\n        delay = (step + 1) % accumulation != 0\n")
    result = migrate_source(source, "train.py")
    new = result.new_source
    assert new is not None and "amp.scale_loss" not in new, new
    assert "delay = " in new, new
    if shape == "unrelated_comment":
        assert "# the backward pass\n" in new, new


@pytest.mark.slow
@pytest.mark.parametrize("boundary, flag", [("plus_one", "none"), ("minus_one", "on")])
def test_a_generated_script_without_the_flag_trains_the_same(boundary, flag, tmp_path):
    drawn = Features(loss="inline", loop="range", accumulation="delay_unscale", boundary=boundary, clip="parameters",
                     clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False,
                     names=("model", "optimizer", "loss"), delay_spelling="local")
    code = migrate_source(script(drawn), "train.py").new_source.split('"""', 2)[2]  # after the docstring naming the features
    assert "delay_unscale" not in code and "apex:" not in code, code
    assert_migrated_and_the_same(drawn, tmp_path)
