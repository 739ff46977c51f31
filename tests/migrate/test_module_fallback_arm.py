"""``if args.fp16: <import apex's amp>; amp.initialize(...)`` with ``else: amp = None``: once the
rewrite has taken every reference to the module, the ``else`` only made a name nothing reads,
and the whole ``if`` goes (it once stayed as ``if args.fp16: pass`` / ``else: amp = None``).
Where the module is still read (``if amp is not None:``, handed on) or the arm does more, the
arm stays."""
from __future__ import annotations

import itertools
import textwrap
import types

import pytest
import torch

from migrate.api import migrate_source

IMPORTS = {  # the import, the name it binds
    "from": ("from apex import amp", "amp"),
    "module_as": ("import apex.amp as amp", "amp"),
    "renamed": ("from apex import amp as apex_amp", "apex_amp"),
}
GUARDS = {
    "try_raise": "try:\n    {imp}\nexcept ImportError:\n    raise ImportError('Please install apex to use fp16 training.')",
    "try_bare": "try:\n    {imp}\nexcept:\n    raise RuntimeError('apex is needed')",
    "plain": "{imp}",
}
ARMS = {"one": "{name} = None", "two_lines": "{name} = None\nlogger_amp = None", "chained": "{name} = other = None"}

SCRIPT = """\
import torch


def train(args, model, optimizer, loader):
    if args.fp16:
{guard}
        model, optimizer = {name}.initialize(model, optimizer, opt_level="O1")
    else:
{arm}
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if args.fp16:
            with {name}.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model
"""


def _script(imp: str, guard: str, arm: str) -> str:
    statement, name = IMPORTS[imp]
    source = SCRIPT.format(guard=textwrap.indent(GUARDS[guard].format(imp=statement), " " * 8), name=name,
                           arm=textwrap.indent(arm.format(name=name), " " * 8))
    compile(source, "train.py", "exec")
    return source


def _runs_without_mixed_precision(source: str) -> None:
    namespace: dict = {}
    exec(compile(source, "train.py", "exec"), namespace)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    namespace["train"](types.SimpleNamespace(fp16=False), model, optimizer, [(torch.randn(4, 3), torch.randn(4, 2))])
    assert not torch.equal(before, model.weight)


@pytest.mark.parametrize(("imp", "guard"), list(itertools.product(IMPORTS, GUARDS)))
def test_the_else_giving_the_module_none_goes_with_the_if(imp, guard):
    result = migrate_source(_script(imp, guard, ARMS["one"]), "train.py")
    new = result.new_source
    assert result.error is None and "apex" not in new, new
    assert "else:" not in new.split("for x, y")[0] and "pass" not in new and "= None" not in new, new
    assert "scaler = torch.amp.GradScaler(" in new, new
    _runs_without_mixed_precision(new)


def test_an_arm_of_a_non_module_name_stays():
    # `logger_amp` is not apex's module: the arm assigning it stays, and so does `amp = None` beside it
    result = migrate_source(_script("from", "try_raise", ARMS["two_lines"]), "train.py")
    assert "logger_amp = None" in result.new_source and "else:" in result.new_source, result.new_source
    _runs_without_mixed_precision(result.new_source)


@pytest.mark.parametrize("arm", ["chained", "doing_more"])
def test_an_arm_doing_more_stays(arm):
    text = ARMS["chained"] if arm == "chained" else "{name} = None\nmodel = model.float()"
    result = migrate_source(_script("from", "try_raise", text), "train.py")
    assert result.error is None and "else:" in result.new_source.split("for x, y")[0], result.new_source
    _runs_without_mixed_precision(result.new_source)


@pytest.mark.parametrize("read", ["if amp is not None:\n        print('mixed precision')", "log_setup(amp)"])
def test_the_arm_stays_where_the_module_is_still_read(read):
    source = _script("from", "try_raise", ARMS["one"]).replace("    for x, y in loader:", f"    {read}\n    for x, y in loader:")
    result = migrate_source(source, "train.py")
    assert result.error is None
    assert "amp = None" in (result.new_source or source), result.new_source
