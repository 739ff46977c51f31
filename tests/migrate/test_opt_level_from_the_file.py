"""An opt level the file itself decides: a name only ever assigned one level (``opt_level = "O1"``
in the block that initializes, before it, or at module level) is that level, so
``amp.master_params`` there are the model's parameters, as natively; an argparse option whose
``choices`` hold O2 beside an O0 or O1 default keeps O0 and O1 and stops an O2 run with an error
(the run people make most is exact). Generated over where the level is set and how it is read."""
from __future__ import annotations

import itertools
import textwrap

import pytest

from migrate.api import migrate_source

SET_AT = ("block", "function", "module")


def _script(set_at: str, clip: bool, both: bool) -> str:
    assign = 'opt_level = "O1"'
    inits = ["model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level)"]
    if both:
        inits.append("critic, critic_optimizer = amp.initialize(critic, critic_optimizer, opt_level=opt_level)")
    block = ["if args.fp16:", *(f"    {line}" for line in ([assign] if set_at == "block" else []) + inits)]
    reads = ["    if args.fp16:", "        norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)",
             "    else:", "        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)"] if clip else []
    body = [*([assign] if set_at == "function" else []), *block,
            "for x in loader:",
            "    loss = model(x).mean()",
            "    if args.fp16:",
            "        with amp.scale_loss(loss, optimizer) as scaled_loss:",
            "            scaled_loss.backward()",
            "    else:",
            "        loss.backward()",
            *reads,
            "    optimizer.step()",
            "    optimizer.zero_grad()"]
    head = "import torch\nfrom apex import amp\n\n" + (assign + "\n\n" if set_at == "module" else "")
    return head + "\ndef train(args, model, optimizer, critic, critic_optimizer, loader):\n" + textwrap.indent("\n".join(body), "    ") + "\n"


@pytest.mark.parametrize("set_at, clip, both", list(itertools.product(SET_AT, (True, False), (True, False))))
def test_a_name_assigned_one_level_is_that_level(set_at, clip, both):
    source = _script(set_at, clip, both)
    result = migrate_source(source, filename="train.py")
    reasons = " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix and d.fix.why_unsafe)
    assert "amp.initialize" not in result.new_source, reasons
    assert "fp32 copies" not in reasons
    if clip:
        assert "scaler.unscale_(optimizer)" in result.new_source
    compile(result.new_source, "train.py", "exec")


ARGUMENT = 'parser.add_argument("--opt-level", default={default}, choices=["O0", "O1", "O2"])\n'
CANONICAL = """\
import argparse

import torch
from apex import amp

parser = argparse.ArgumentParser()
{argument}args = parser.parse_args()
model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
for x in loader:
    loss = model(x)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("default, safe", [('"O0"', True), ('"O1"', True), ('"O2"', False), ("None", False)])
def test_choices_that_hold_o2_beside_an_exact_default(default, safe):
    source = CANONICAL.format(argument=ARGUMENT.format(default=default))
    result = migrate_source(source, filename="train.py")
    if not safe:
        assert result.new_source == source
        return
    assert 'if args.opt_level not in ("O0", "O1"):' in result.new_source  # an O2 run stops, saying why
    assert "raise RuntimeError(" in result.new_source and "from apex import" not in result.new_source
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=args.opt_level != "O0")' in result.new_source
    compile(result.new_source, "train.py", "exec")


@pytest.mark.parametrize("test", ['args.opt_level != "O0"', "args.opt_level != 'O0'", '"O0" != args.opt_level'])
def test_the_check_that_stops_o2_does_not_repeat_the_test_around_initialize(test):
    source = CANONICAL.format(argument='parser.add_argument("--opt-level", default="O1")\nparser.add_argument("--amp")\n')
    source = source.replace("model, optimizer = amp.initialize(", f"if {test}:\n    model, optimizer = amp.initialize(")
    result = migrate_source(source, filename="train.py")
    assert "from apex import" not in result.new_source, result.new_source
    guard = next(line for line in result.new_source.splitlines() if "not in (" in line)
    assert guard == 'if args.opt_level not in ("O0", "O1"):', result.new_source


@pytest.mark.parametrize("test", ['args.opt_level != "O0"', "args.opt_level != 'O0'", "(args.opt_level != 'O0')",
                                  "args.opt_level  !=  'O0'"])
def test_the_scalers_flag_says_a_test_around_initialize_once_however_quoted(test):
    """``if args.opt_level != 'O0': initialize(..., opt_level=args.opt_level)``: the scaler's
    ``enabled=`` is that test once, not beside the rewrite's own ``args.opt_level != "O0"``."""
    source = CANONICAL.format(argument='parser.add_argument("--opt-level", default="O1")\n')
    source = source.replace("model, optimizer = amp.initialize(", f"if {test}:\n    model, optimizer = amp.initialize(")
    result = migrate_source(source, filename="train.py")
    made = next(line for line in result.new_source.splitlines() if "GradScaler(" in line)
    assert made.count("O0") == 1, result.new_source
