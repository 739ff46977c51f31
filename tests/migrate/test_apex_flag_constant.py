"""AMP018 on generated variants, run before and after: an always-true apex flag folded into the
tests that read it computes what the original computed, for every input; a parameter or local
of the same name is left alone; the flag goes once nothing reads it."""
from __future__ import annotations

import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from migrate.api import migrate_source
from migrate.engine import run_rules
from migrate.rules import all_rules

RULES = all_rules()

FLAGS = ("has_apex", "APEX_AVAILABLE", "HAS_AMP", "apex_available", "IS_AMP_AVAILABLE", "is_apex_available")


def _test(shape: str, flag: str) -> str:
    return {"flag": flag, "not": f"not {flag}", "and_left": f"{flag} and x", "and_right": f"x and {flag}",
            "and_three": f"x and {flag} and y", "not_and": f"not {flag} and x",
            # compared with a bool literal, parenthesized or not
            "is_false": f"({flag} is False)", "and_is_false": f"x and ({flag} is False)", "is_true": f"{flag} is True",
            "eq_false_and": f"{flag} == False and x", "is_not_false": f"x and {flag} is not False",
            "ne_true": f"{flag} != True"}[shape]


SHAPES = ("flag", "not", "and_left", "and_right", "and_three", "not_and",
          "is_false", "and_is_false", "is_true", "eq_false_and", "is_not_false", "ne_true")


@st.composite
def _scripts(draw):
    flag = draw(st.sampled_from(FLAGS))
    blocks = []
    for index in range(draw(st.integers(1, 3))):
        test = _test(draw(st.sampled_from(SHAPES)), flag)
        arms = draw(st.sampled_from(("if", "if_else", "elif", "elif_else", "nested", "ifexp", "ifexp_sum")))
        body = f"out.append({index})"
        if arms == "if":
            blocks.append(f"if {test}:\n    {body}\n")
        elif arms == "if_else":
            blocks.append(f"if {test}:\n    {body}\nelse:\n    out.append(-{index})\n")
        elif arms == "elif":
            blocks.append(f"if y and not x:\n    out.append(99)\nelif {test}:\n    {body}\n")
        elif arms == "elif_else":
            blocks.append(f"if y and not x:\n    out.append(99)\nelif {test}:\n    {body}\nelse:\n    out.append(-{index})\n")
        elif arms == "ifexp":
            blocks.append(f"out.append(({index} if {test} else -{index}) * 2)\n")
        elif arms == "ifexp_sum":  # a compound arm keeps the parentheses it needs
            blocks.append(f"out.append(({index} + 1 if {test} else {index} - 1) * 2)\n")
        else:
            blocks.append(f"if {test}:\n    if {flag}:\n        {body}\n    out.append(50)\n")
    read_as_value = draw(st.booleans())
    shadowed = draw(st.booleans())
    default_false = draw(st.booleans())
    source = (f"{flag} = False\n" if default_false else "") + f"{flag} = True\n\n\n"
    source += "def run(x, y):\n    out = []\n" + textwrap.indent("".join(blocks), "    ")
    if read_as_value:
        source += f"    out.append({flag})\n"
    source += "    return out\n"
    if shadowed:  # a parameter of the same name: another variable, never folded
        source += f"\n\ndef other({flag}):\n    if {flag}:\n        return 1\n    return 0\n"
    return source, flag, read_as_value, shadowed


def _outputs(source: str) -> list:
    namespace: dict = {}
    exec(compile(source, "generated.py", "exec"), namespace)
    found = [namespace["run"](x, y) for x in (False, True) for y in (False, True)]
    if "other" in namespace:
        found += [namespace["other"](False), namespace["other"](True)]
    return found


@pytest.mark.slow
@settings(max_examples=150, deadline=None, database=None)
@given(_scripts())
def test_folding_an_always_true_flag_computes_what_the_original_did(drawn):
    source, flag, read_as_value, shadowed = drawn
    result = run_rules(source, "generated.py", RULES)
    assert result.error is None, result.error
    fixed = result.source
    assert _outputs(fixed) == _outputs(source), f"{source}\n---\n{fixed}"
    assert run_rules(fixed, "generated.py", RULES).source == fixed, "a second run changed it again"
    run_body = fixed.split("def run", 1)[1].split("def other", 1)[0]
    assert (flag in run_body) == read_as_value, fixed  # every test folded; a value read stays
    assert (f"{flag} = True" in fixed) == read_as_value, fixed  # goes once nothing reads it
    if shadowed:
        assert f"def other({flag}):\n    if {flag}:" in fixed


# The `enabled=` of an autocast or GradScaler, True by default: an always-true flag there goes
# with the keyword, wherever the keyword sits and however the call is wrapped.
ENABLED_CALLS = {
    "autocast_last": ('torch.autocast("cuda", dtype=torch.float16, enabled={value})',
                      'torch.autocast("cuda", dtype=torch.float16)'),
    "autocast_middle": ('torch.autocast(device_type="cuda", enabled={value}, dtype=torch.float16)',
                        'torch.autocast(device_type="cuda", dtype=torch.float16)'),
    "cuda_autocast_only": ("torch.cuda.amp.autocast(enabled={value})", "torch.cuda.amp.autocast()"),
    "scaler": ('torch.amp.GradScaler("cuda", enabled={value})', 'torch.amp.GradScaler("cuda")'),
    "scaler_wrapped": ('torch.amp.GradScaler(\n        "cuda",\n        enabled={value},\n    )',
                       'torch.amp.GradScaler(\n        "cuda",\n    )'),
    "imported_scaler": ("GradScaler(init_scale=1024, enabled={value})", "GradScaler(init_scale=1024)"),
}


@pytest.mark.parametrize("flag", ("has_amp", "IS_AMP_AVAILABLE", "_is_apex_available"))
@pytest.mark.parametrize("value", ("{flag}", "bool({flag})", "x and {flag}"))
@pytest.mark.parametrize("shape", sorted(ENABLED_CALLS))
def test_an_always_true_flag_as_enabled_goes_with_the_keyword(flag, value, shape):
    original, expected = ENABLED_CALLS[shape]
    original = original.format(value=value.format(flag=flag))
    if value.startswith("x and"):  # the `and` folds first: `enabled=x` is the flag's, and stays
        expected = ENABLED_CALLS[shape][0].format(value="x")
    source = f"{flag} = True\n\n\ndef make(x):\n    made = {original}\n    return made\n"
    fixed = run_rules(source, "generated.py", RULES).source
    assert fixed == f"\n\ndef make(x):\n    made = {expected}\n    return made\n", fixed


@pytest.mark.parametrize("read", ("Logger(enabled={flag})", "torch.autocast('cuda', enabled=not {flag})",
                                  "torch.autocast('cuda', cache_enabled={flag})"))
def test_an_always_true_flag_read_elsewhere_stays(read):
    source = f"HAS_APEX = True\n\n\ndef make():\n    return {read.format(flag='HAS_APEX')}\n"
    assert run_rules(source, "generated.py", RULES).source == source


@pytest.mark.parametrize("argument, goes", [("HAS_APEX is True", True), ("not not HAS_APEX", True),
                                            ("bool(HAS_APEX)", True), ("not HAS_APEX", False)])
def test_an_enabled_argument_the_flag_makes_true_goes(argument, goes):
    source = ("import torch\n\nHAS_APEX = True\n\n\ndef make():\n"
              f"    return torch.amp.GradScaler(\"cuda\", enabled={argument})\n")
    new = migrate_source(source, "train.py").new_source or source
    assert ("enabled=" not in new) is goes, new
    assert "HAS_APEX" not in new or not goes, new
