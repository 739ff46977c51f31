"""A function that only builds (``build(args)`` initializes and ends ``return model, optimizer``,
its one caller unpacking them) returns the GradScaler with them, and the caller hands it on as a
person would write it (``model, optimizer, scaler = build(args)``, ``train(..., scaler=scaler)``),
instead of a module global assigned through ``global scaler`` with a disabled one standing in.
Over the ways the return, the unpacking, the builder's guard and the scaler's users are written;
and the shapes where something else could reach the scaler keep the global."""
from __future__ import annotations

import itertools
import re

import pytest

from migrate.api import migrate_source

APEX_IMPORT = re.compile(r"^\s*(from|import) apex\b", re.M)
RETURNS = {"bare": "return model, optimizer", "parenthesized": "return (model, optimizer)",
           "trailing_comma": "return model, optimizer,"}
TARGETS = {"bare": "model, optimizer", "parenthesized": "(model, optimizer)", "list": "[model, optimizer]"}
GUARDS = {  # the builder's initialize, and how its guard is spelled
    "none": "    model, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n",
    "flag": "    if args.fp16:\n        model, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n",
    "level": "    if args.opt_level != 'O0':\n        model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)\n",
}
STEP = ("        loss = model(x).sum()\n        optimizer.zero_grad()\n"
        "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n            scaled_loss.backward()\n"
        "        optimizer.step()\n")
USERS = {  # where the scaled step is: a function main calls, main's own loop, a function defined in main
    "function": ("def train(model, optimizer, loader):\n    for x in loader:\n" + STEP + "\n\n", "    train(model, optimizer, loader)\n"),
    "loop": ("", "    for x in loader:\n" + STEP.replace("        ", "        ")),
    "closure": ("", "    def train():\n        for x in loader:\n" + STEP.replace("        ", "            ") + "    train()\n"),
}


def _source(returned: str, target: str, guard: str, user: str) -> str:
    defined, called = USERS[user]
    return ("import torch\nfrom apex import amp\n\n\ndef build(args):\n    model = Net()\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n" + GUARDS[guard] + f"    {RETURNS[returned]}\n\n\n"
            + defined + f"def main(args, loader):\n    {TARGETS[target]} = build(args)\n" + called
            + "\n\nif __name__ == '__main__':\n    main(parse(), loader())\n")


@pytest.mark.parametrize("returned, target, guard, user", list(itertools.product(RETURNS, TARGETS, GUARDS, USERS)))
def test_the_builder_returns_the_scaler_and_its_caller_hands_it_on(returned, target, guard, user):
    new = migrate_source(_source(returned, target, guard, user), "train.py").new_source
    assert new is not None and not APEX_IMPORT.search(new), new
    compile(new, "train.py", "exec")
    assert "global scaler" not in new and "until `build()` runs" not in new, new
    assert "    return model, optimizer, scaler\n" in new or "    return (model, optimizer, scaler)\n" in new, new
    assert TARGETS[target].replace("optimizer", "optimizer, scaler") + " = build(args)" in new, new
    if user == "function":
        assert "def train(model, optimizer, loader, scaler: torch.amp.GradScaler):" in new, new
        assert "train(model, optimizer, loader, scaler=scaler)" in new, new


KEEPS_THE_GLOBAL = {
    # the builder called twice: each call would make a scaler of its own
    "called_twice": ("    model, optimizer = build(args)\n", "    model, optimizer = build(args)\n    train(model, optimizer, loader)\n"),
    # what it returns kept whole: nothing to add the scaler to
    "not_unpacked": ("    built = build(args)\n    model, optimizer = built\n", "    train(model, optimizer, loader)\n"),
    # called at module level: no function to hand it on
    "module_level": ("    pass\n", "model, optimizer = build(parse())\ntrain(model, optimizer, loader())\n"),
    # an early return: the scaler would not exist on that path
    "early_return": ("    model, optimizer = build(args)\n", "    train(model, optimizer, loader)\n"),
    # the scaled step reached before the builder ran
    "used_before": ("    train(model, optimizer, loader)\n    model, optimizer = build(args)\n", ""),
}


@pytest.mark.parametrize("case", sorted(KEEPS_THE_GLOBAL))
def test_where_something_else_could_reach_the_scaler_the_global_stays(case):
    head, tail = KEEPS_THE_GLOBAL[case]
    body = GUARDS["flag"] + ("    if args.dry_run:\n        return model, optimizer\n" if case == "early_return" else "")
    source = ("import torch\nfrom apex import amp\n\n\ndef build(args):\n    model = Net()\n"
              "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n" + body + "    return model, optimizer\n\n\n"
              "def train(model, optimizer, loader):\n    for x in loader:\n" + STEP + "\n\n"
              + ("def main(args, loader):\n" + head + tail if case != "module_level" else tail))
    new = migrate_source(source, "train.py").new_source
    assert new is not None and not APEX_IMPORT.search(new), new
    compile(new, "train.py", "exec")
    assert "global scaler" in new and ", scaler = build(" not in new, new
