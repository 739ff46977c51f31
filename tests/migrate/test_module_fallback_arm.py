"""``if args.fp16: <import apex's amp>; amp.initialize(...)`` with ``else: amp = None``: once the
rewrite has taken every reference to the module, the ``else`` only made a name nothing reads,
and the whole ``if`` goes (it once stayed as ``if args.fp16: pass`` / ``else: amp = None``).
The same for an ``if`` holding only the guarded import, ``amp.initialize`` in a later one: the
``try`` left guarding nothing goes with the ``if`` and its ``else`` where nothing reads the names
the ``else`` gives ``None``. Where the module is still read (``if amp is not None:``, handed on),
a name is read later, or the arm does more, the arm stays."""
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
ARMS = {"one": "{name} = None", "chained": "{name} = other = None"}

LOOP = """\
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

SCRIPT = """\
import torch


def train(args, model, optimizer, loader):
    if args.fp16:
{guard}
        model, optimizer = {name}.initialize(model, optimizer, opt_level="O1")
    else:
{arm}
""" + LOOP


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


def test_an_arm_giving_none_to_a_name_read_later_stays():
    # `fallback` is read after the `if`: the arm assigning it is no dead store, and stays
    source = _script("from", "try_raise", "{name} = None\nfallback = None").replace(
        "    for x, y in loader:", "    print(fallback)\n    for x, y in loader:")
    result = migrate_source(source, "train.py")
    assert "fallback = None" in result.new_source and "else:" in result.new_source, result.new_source
    namespace: dict = {}
    exec(compile(result.new_source, "train.py", "exec"), namespace)  # it still defines `train`
    assert callable(namespace["train"])


IMPORT_ONLY = """\
import torch


def train(args, model, optimizer, loader):
    if args.fp16:
{guard}
    else:
{arm}
    if args.fp16:
        model, optimizer = {name}.initialize(model, optimizer, opt_level="O1")
""" + LOOP


@pytest.mark.parametrize(("imp", "guard", "arm"), list(itertools.product(IMPORTS, GUARDS, ARMS)))
def test_an_import_only_if_with_its_fallback_arm_goes(imp, guard, arm):
    # the import in an `if` of its own, `amp.initialize` in a later one (JinJackson/Eng_Paraphrase's
    # shape); a plain import goes in the engine's import removal, a `try` around it by AMP001
    statement, name = IMPORTS[imp]
    source = IMPORT_ONLY.format(guard=textwrap.indent(GUARDS[guard].format(imp=statement), " " * 8), name=name,
                                arm=textwrap.indent(ARMS[arm].format(name=name), " " * 8))
    result = migrate_source(source, "train.py")
    new = result.new_source
    assert result.error is None and "apex" not in new, new
    assert "else:" not in new.split("for x, y")[0] and "pass" not in new and "= None" not in new, new
    _runs_without_mixed_precision(new)


@pytest.mark.parametrize("guard", list(GUARDS))
def test_an_arm_with_a_comment_stays(guard):
    result = migrate_source(_script("from", guard, "{name} = None  # apex is optional"), "train.py")
    assert result.error is None and "amp = None  # apex is optional" in result.new_source, result.new_source
    _runs_without_mixed_precision(result.new_source)


def test_an_arm_doing_more_stays():
    result = migrate_source(_script("from", "try_raise", "{name} = None\nmodel = model.float()"), "train.py")
    assert result.error is None and "else:" in result.new_source.split("for x, y")[0], result.new_source
    _runs_without_mixed_precision(result.new_source)


@pytest.mark.parametrize("read", ["if amp is not None:\n        print('mixed precision')", "log_setup(amp)"])
def test_the_arm_stays_where_the_module_is_still_read(read):
    source = _script("from", "try_raise", ARMS["one"]).replace("    for x, y in loader:", f"    {read}\n    for x, y in loader:")
    result = migrate_source(source, "train.py")
    assert result.error is None
    assert "amp = None" in (result.new_source or source), result.new_source


@pytest.mark.parametrize("guard", list(GUARDS))
@pytest.mark.parametrize("kept", ["comment", "read later", "module level"])
def test_an_import_only_fallback_arm_stays_where_it_may_matter(guard, kept):
    source = IMPORT_ONLY.format(guard=textwrap.indent(GUARDS[guard].format(imp="from apex import amp"), " " * 8),
                                name="amp", arm="        amp = None")
    if kept == "comment":
        source = source.replace("        amp = None\n", "        amp = None  # apex is optional\n")
    elif kept == "read later":
        source = source.replace("    for x, y in loader:", "    print(amp is None)\n    for x, y in loader:", 1)
    else:  # the `if` at the module's top level: another file may import the name
        head, rest = source.split("def train(args, model, optimizer, loader):\n", 1)
        first, second = rest.split("    if args.fp16:\n        model, optimizer", 1)
        source = head + textwrap.dedent(first).replace("args.fp16", "FP16", 1) + (
            "\n\ndef train(args, model, optimizer, loader):\n    if args.fp16:\n        model, optimizer" + second)
        source = source.replace("import torch\n", "import torch\n\nFP16 = False\n", 1)
    result = migrate_source(source, "train.py")
    assert result.error is None
    new = result.new_source or source
    assert "amp = None" in new and "else:" in new.split("def train")[int(kept != "module level")], new
    compile(new, "train.py", "exec")


def test_a_global_fallback_stays():
    # `global amp`: the `else` sets the module's name, which another module may read
    source = IMPORT_ONLY.format(guard=textwrap.indent(GUARDS["try_raise"].format(imp="from apex import amp"), " " * 8),
                                name="amp", arm="        amp = None")
    source = source.replace("def train(args, model, optimizer, loader):\n", "def train(args, model, optimizer, loader):\n    global amp\n")
    result = migrate_source(source, "train.py")
    assert result.error is None
    assert "amp = None" in (result.new_source or source), result.new_source
