"""The GradScaler handed to the function that uses it (``train(..., scaler=scaler)``) instead of a
module global set through ``global scaler``, on generated variants that are then run: every
spelling of the receiving function's parameters and of its calls; a second caller that the
function making the scaler calls, which takes it too and hands it on; and every way it could be
reached that the file does not show (a callback, a decorator, a call before the scaler exists, a
call at module level), where the global stays."""
from __future__ import annotations

import re
import textwrap
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migrate.engine import run_rules
from migrate.rules import all_rules

RULES = all_rules()

SIGNATURES = {  # the parameters `train` takes besides the model, the optimizer and the batches
    "plain": ("", ""),
    "default": (", log_every=0", ", log_every=2"),
    "keyword_call": (", log_every=0", ""),
    "star_args": (", *extra", ", 1, 2"),
    "star_kwargs": (", **options", ", verbose=False"),
    "keyword_only": (", *, log_every", ", log_every=3"),
}
ESCAPES = ("none", "callback", "second_caller", "decorated", "before_initialize", "module_call")


@st.composite
def _scripts(draw):
    signature = draw(st.sampled_from(sorted(SIGNATURES)))
    one_a_line = draw(st.booleans())  # one parameter a line, with a trailing comma
    long_call = draw(st.booleans())  # a call that reaches the line length already
    escape = draw(st.sampled_from(ESCAPES))
    closure = draw(st.booleans()) and escape in ("none", "callback")
    extra, passed = SIGNATURES[signature]
    names = ["model", "optimizer", "batches"] + [p.strip() for p in extra.split(",") if p.strip()]
    if one_a_line and not closure:
        head = "def train(\n" + "".join(f"    {name},\n" for name in names) + "):"
    else:
        head = f"def train(model, optimizer, batches{extra}):"
    body = textwrap.dedent("""\
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return float(loss)
    """)
    train = head + "\n" + textwrap.indent(body, "    ")
    decorator = "@traced\n" if escape == "decorated" else ""
    batches = "batches"
    if long_call:  # the call ends a few columns short of 88: the scaler goes on a line of its own
        prefix = "    result = train(model, optimizer, "
        batches = "batches_" + "x" * (85 - len(prefix) - len(passed) - 1 - len("batches_"))
    call = f"{batches} = batches\nresult = train(model, optimizer, {batches}{passed})"
    make = textwrap.dedent("""\
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(3)]
    """)
    initialize = 'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
    main = make
    if escape == "before_initialize":
        main += "warm = train(model, optimizer, batches[:1]" + passed + ")\n"
    main += initialize
    if closure:
        main += train + "\n"
    main += call + "\n"
    if escape == "callback":
        main += "callbacks = [train]\n"
    if escape == "second_caller":
        main += "evaluate(model, optimizer, batches)\n"
    main += "return result\n"
    source = "import torch\nfrom apex import amp\n\n\n"
    if escape == "decorated":
        source += "def traced(function):\n    return function\n\n\n"
    if not closure:
        source += decorator + train + "\n\n"
    if escape == "second_caller":
        source += "def evaluate(model, optimizer, batches):\n    return train(model, optimizer, batches" + passed + ")\n\n\n"
    source += "def main():\n" + textwrap.indent(main, "    ")
    if escape == "module_call":
        source += "\n\nif __name__ == \"__main__\":\n    train(None, None, [])\n"
    return source, escape, closure, one_a_line and not closure


def _run(source: str) -> float:
    namespace: dict = {"__name__": "generated"}
    exec(compile(source, "generated.py", "exec"), namespace)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a CUDA GradScaler on the CPU disables itself, saying so
        return namespace["main"]()


@pytest.mark.slow
@settings(max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scripts())
def test_the_scaler_is_handed_to_the_function_using_it_where_the_file_shows_every_call(drawn):
    source, escape, closure, one_a_line = drawn
    result = run_rules(source, "generated.py", RULES)
    assert result.error is None, result.error
    fixed = result.source
    assert "apex" not in fixed.split("def main", 1)[1], fixed
    compile(fixed, "fixed.py", "exec")
    assert all(len(line) <= 88 for line in fixed.splitlines()), fixed
    if escape == "none" or (closure and escape == "callback"):
        assert "global scaler" not in fixed and "enabled=False" not in fixed, fixed
        if not closure:
            assert fixed.count("scaler=scaler") == 1 and "scaler: torch.amp.GradScaler" in fixed, fixed
    elif escape == "second_caller":  # a function main calls once the scaler exists takes it too, and hands it on
        assert "global scaler" not in fixed and fixed.count("scaler=scaler") == 3, fixed
        assert "scaler: torch.amp.GradScaler" in fixed.split("def evaluate(", 1)[1].split("):", 1)[0], fixed
    else:
        assert "global scaler" in fixed and "scaler=scaler" not in fixed, fixed
    if one_a_line:  # the new parameter follows the layout: one a line, each indented, a trailing comma
        header = fixed.split("def train(\n", 1)[1].split("\n):", 1)[0].splitlines()
        assert all(re.fullmatch(r"    \S.*,", line) for line in header), fixed
    assert run_rules(fixed, "generated.py", RULES).source == fixed, "a second run changed it again"
    assert isinstance(_run(fixed), float)  # every call passes what the function takes
