"""Every catalogue rule's VALID/INVALID examples, run through the engine: the examples are the tests.

A VALID example runs with its rule alone (it may well hold what another rule reports, such as a
homonym test written with ``torch.cuda.amp``). An INVALID example runs with the whole catalogue, as
``ampmigrate`` does by default: some rewrites are made by several rules together (an apex script
loses ``amp.initialize`` and ``amp.scale_loss`` at once).
"""
from __future__ import annotations

import pytest

from migrate.engine import run_rules
from migrate.rule import Rule
from migrate.rules import all_rules
from migrate.types import FixSafety, Safety

_RULES = all_rules()


def _cases(kind: str):
    return [
        pytest.param(rule, case, id=f"{rule.CODE}-{rule.name()}-{kind}{index}")
        for rule in _RULES
        for index, case in enumerate(getattr(rule, kind))
    ]


def _compiles(source: str) -> None:
    compile(source, "<example>", "exec", dont_inherit=True)


@pytest.mark.parametrize(("rule", "case"), _cases("VALID"))
def test_valid_example_is_left_alone(rule, case):
    for unsafe_fixes in (False, True):
        result = run_rules(case.code, "example.py", [rule], unsafe_fixes=unsafe_fixes)
        assert result.diagnostics == (), f"{rule.CODE} reported on its VALID code:\n{case.code}"
        assert result.source == case.code


@pytest.mark.parametrize(("rule", "case"), _cases("INVALID"))
def test_invalid_example_is_reported_and_fixed_as_documented(rule, case):
    result = run_rules(case.code, "example.py", _RULES, unsafe_fixes=case.unsafe_fixes)
    assert result.error is None, result.error
    assert any(d.code == rule.CODE for d in result.diagnostics), f"{rule.CODE} missed INVALID code:\n{case.code}"
    expected = case.code if case.expected_replacement is None else case.expected_replacement
    assert result.source == expected
    _compiles(result.source)
    again = run_rules(result.source, "example.py", _RULES, unsafe_fixes=case.unsafe_fixes)
    assert again.source == result.source, "a second run changed the output again"
    if case.unsafe_fixes and case.expected_replacement is not None:
        assert run_rules(case.code, "example.py", _RULES).source != expected, "an unsafe fix applied by default"


def test_catalogue_holds_every_rule_module_with_unique_codes_and_documentation():
    assert _RULES, "the catalogue is empty"
    codes = [rule.CODE for rule in _RULES]
    assert len(codes) == len(set(codes))
    for rule in _RULES:
        assert issubclass(rule, Rule) and rule.MESSAGE and rule.INVALID, rule
        assert not rule.__name__.endswith("Rule"), f"{rule.__name__}: name the pattern, without a Rule suffix"
        for heading in ("What it does", "Why is this bad?", "Fix safety"):
            assert heading in (rule.__doc__ or ""), f"{rule.__name__} docstring lacks {heading!r}"


def test_catalogue_finds_the_deprecated_spelling_rules_by_import():
    codes = {rule.CODE for rule in _RULES}
    assert {"AMP020", "AMP021", "AMP022"} <= codes


_DEPRECATED_SPELLINGS = [rule for rule in _RULES if rule.__module__.rsplit(".", 1)[-1].startswith("deprecated_")]


@pytest.mark.parametrize(
    ("rule", "case"),
    [
        pytest.param(rule, case, id=f"{rule.CODE}-INVALID{index}")
        for rule in _DEPRECATED_SPELLINGS
        for index, case in enumerate(rule.INVALID)
        if case.expected_replacement is not None
    ],
)
def test_deprecated_spelling_rewrites_run_on_torch_without_deprecation_warnings(rule, case):
    torch = pytest.importorskip("torch")
    import warnings

    names = dict(model=lambda x: x, x=torch.ones(2), forward=lambda ctx, x: x, use_amp=False, options={})
    names["args"] = type("Args", (), {"fp16": False, "amp": True})
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)  # e.g. "CUDA is not available" on a CPU machine
        exec(compile(case.expected_replacement, f"{rule.CODE}-example", "exec"), names)
        with pytest.raises((FutureWarning, DeprecationWarning), match="is deprecated"):
            exec(compile(rule.INVALID[0].code, f"{rule.CODE}-original", "exec"), dict(names))


_SEEN_FOR = {
    FixSafety.ALWAYS: {Safety.SAFE},
    FixSafety.SOMETIMES: {Safety.SAFE, Safety.UNSAFE},
    FixSafety.NEVER: {Safety.UNSAFE},
    FixSafety.NO_FIX: set(),
}


@pytest.mark.parametrize("rule", _RULES, ids=lambda rule: rule.CODE)
def test_declared_fix_safety_is_what_the_invalid_examples_show(rule):
    """--list-rules prints FIX_SAFETY: the fixes the rule reports on its INVALID examples must match it,
    and every unsafe fix says why it may change behaviour."""
    seen = set()
    for case in rule.INVALID:
        for d in run_rules(case.code, "example.py", _RULES, unsafe_fixes=True, fix=False).diagnostics:
            if d.code == rule.CODE and d.fix is not None:
                seen.add(d.fix.applicability)
                assert d.fix.message, f"{rule.CODE} offers a fix without a message"
                if d.fix.applicability is Safety.UNSAFE:
                    assert d.fix.why_unsafe, f"{rule.CODE}: an unsafe fix ({d.fix.message!r}) does not say why"
    assert seen == _SEEN_FOR[rule.FIX_SAFETY], (
        f"{rule.CODE} declares FIX_SAFETY={rule.FIX_SAFETY.value!r}, its INVALID examples show {sorted(seen)}"
    )


_STEP_RULES = [rule for rule in _RULES if rule.CODE.startswith("AMP10")]


@pytest.mark.parametrize("rule", _STEP_RULES, ids=lambda rule: rule.CODE)
def test_training_step_rule_says_and_shows_how_it_applies_in_each_framework(rule):
    from migrate.rules._framework_loops import CORRECT, FRAMEWORKS

    assert tuple(rule.FRAMEWORKS) == FRAMEWORKS, f"{rule.CODE}: say how the rule applies in each framework"
    for framework, how in rule.FRAMEWORKS.items():
        reported = [case for case in rule.INVALID if case.framework == framework]
        assert how.startswith(("Reported", "Not reported")), f"{rule.CODE} {framework}: say first whether it reports"
        if how.startswith("Reported"):
            assert reported, f"{rule.CODE} says it reports in {framework} and shows no INVALID example of it"
        else:
            assert not reported, f"{rule.CODE} says it does not report in {framework} but has an INVALID example of it"
        assert any(case.framework == framework and case.code == CORRECT[framework] for case in rule.VALID), \
            f"{rule.CODE}: the correct {framework} loop is not among its VALID examples"


def test_explain_and_the_rule_page_show_each_framework_with_its_examples():
    from migrate.explain import explain
    from migrate.rule_pages import render_page
    from migrate.rules import rule_by_code

    text, page = explain("AMP109"), render_page("AMP109")
    assert "Accelerate: Reported: `loss.backward()`" in text and "### Accelerate" in page
    assert "accelerator.prepare(model, optimizer, loader)" in text and "accelerator.prepare(model, optimizer, loader)" in page
    shown = len([case for case in rule_by_code("AMP109").VALID if case.framework])
    assert shown >= 7 and text.count("Left alone:") == shown and page.count("Left alone:") == shown
