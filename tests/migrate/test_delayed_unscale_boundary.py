"""A clip where the step may not follow it (a native path beside apex's steps through its own
scaler) becomes a scale-aware clip; after ``amp.scale_loss(..., delay_unscale=...)`` that is unsafe
where the clip may run on a delayed pass (apex clipped the still-scaled gradients there). Under the
boundary's own test (``if boundary:`` beside ``delay_unscale=not boundary``, in any spelling) it
runs only where apex unscaled: safe. Runs of these scripts: ``tests/generated``'s
``test_a_clip_at_the_boundary_of_delayed_passes_beside_a_native_path``."""
from __future__ import annotations

import itertools

import pytest

from generated.apex_scripts import Features, _boundary, _coherent, script
from migrate.api import migrate_source

MARKER = "TODO(ampmigrate)"


def _features(delay_spelling: str, clip: str, boundary: str, loop: str = "range") -> Features:
    return _coherent(Features(
        loss="inline", loop=loop, accumulation="delay_unscale", boundary=boundary, clip=clip, clip_at="boundary",
        flag="on", import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"), native_beside=True,
        delay_spelling=delay_spelling))


def _script(delay_spelling: str, clip: str, boundary: str, loop: str = "range") -> str:
    return script(_features(delay_spelling, clip, boundary, loop))


@pytest.mark.parametrize(("delay_spelling", "clip", "boundary", "loop"), list(itertools.product(
    ("not_flag", "accumulating", "comparison"), ("master_params", "parameters"), ("plus_one", "minus_one"),
    ("range", "while", "enumerate"))))
def test_a_clip_under_the_boundary_test_is_a_safe_scale_aware_clip(delay_spelling, clip, boundary, loop):
    source = _script(delay_spelling, clip, boundary, loop)
    fixed = migrate_source(source, filename="train.py").new_source
    assert fixed != source and MARKER not in fixed and "from apex" not in fixed, fixed
    assert "scaler.get_scale()" in fixed  # the scale-aware clip: the step may not follow it


def _leaving_first(source: str, features: Features) -> str:
    """The boundary's block turned around: ``if not <boundary>: ...; continue``, then its lines."""
    test = _boundary(features)[2]
    lines = source.splitlines(keepends=True)
    start = lines.index(f"        if {test}:\n")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" " * 12))
    body = [line[4:] for line in lines[start + 1:end]]
    leave = [f"        if not ({test}):\n", "            losses.append(float(loss))\n", "            continue\n"]
    return "".join(lines[:start] + leave + body + lines[end:])


@pytest.mark.parametrize(("delay_spelling", "clip", "loop"), list(itertools.product(
    ("not_flag", "accumulating", "comparison"), ("master_params", "parameters"), ("range", "enumerate"))))
def test_a_clip_after_leaving_on_delayed_passes_is_a_safe_scale_aware_clip(delay_spelling, clip, loop):
    features = _features(delay_spelling, clip, "plus_one", loop)
    source = _leaving_first(script(features), features)
    assert "continue" in source
    fixed = migrate_source(source, filename="train.py").new_source
    assert fixed != source and MARKER not in fixed and "from apex" not in fixed, fixed
    assert "scaler.get_scale()" in fixed


NOT_THE_BOUNDARY = {
    # the flag bound again between the backward and the test: it may say something else there
    "rebound between": [("        if boundary:\n", "        boundary = step > 3\n        if boundary:\n")],
    "another test": [("        if boundary:\n", "        if boundary or step == 3:\n")],
    "in the other arm": [("        if boundary:\n", "        if not boundary:\n            pass\n        else:\n")],
    "a test that calls": [("boundary = (step + 1) % ACCUMULATION == 0", "boundary = lambda: (step + 1) % ACCUMULATION == 0"),
                          ("delay_unscale=not boundary", "delay_unscale=not boundary()"),
                          ("        if boundary:\n", "        if boundary():\n")],
}


@pytest.mark.parametrize("case", sorted(NOT_THE_BOUNDARY))
def test_a_clip_that_may_run_on_a_delayed_pass_stays_unsafe(case):
    source = _script("not_flag", "parameters", "plus_one")
    for old, new in NOT_THE_BOUNDARY[case]:
        assert old in source, old
        source = source.replace(old, new, 1)
    assert migrate_source(source, filename="train.py").new_source == source
    fixed = migrate_source(source, filename="train.py", unsafe_fixes=True).new_source
    assert "on delay_unscale passes apex clipped the scaled" in fixed, fixed


@pytest.mark.slow
@pytest.mark.parametrize(("delay_spelling", "clip", "loop"), [("accumulating", "master_params", "range"),
                                                              ("comparison", "parameters", "enumerate")])
def test_the_rewrite_of_a_clip_after_leaving_trains_as_apex_did(delay_spelling, clip, loop, tmp_path):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    features = _features(delay_spelling, clip, "plus_one", loop)
    source = _leaving_first(script(features), features)
    (tmp_path / "original.py").write_text(source)
    (tmp_path / "rewritten.py").write_text(migrate_source(source, filename="train.py").new_source)
    for args in ([], ["--no-fp16"]):
        comparison = compare(Target(str(tmp_path / "original.py")), Target(str(tmp_path / "rewritten.py")), args,
                             device="cpu", steps=30, parallel=True, timeout=240)
        assert comparison.verdict == SAME, " ".join(args) + "\n" + as_text(comparison)
