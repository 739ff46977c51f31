"""``assert amp is not None, "amp not installed!"`` (the Swin-family entry point, under ``if
level != "O0":``) stopped mixed-precision runs where apex was not installed. Once the file is
migrated nothing needs apex: the assert goes with it (and the ``if`` around nothing else), said
as a behaviour change. It used to stay, keeping ``from apex import amp`` and apex itself required.
"""
from __future__ import annotations

import ast

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migrate.api import migrate_source

ASSERTS = ('assert amp is not None, "amp not installed!"', "assert amp is not None", 'assert amp, "install apex"')
IMPORTS = {"try": "try:\n    from apex import amp\nexcept ImportError:\n    amp = None\n", "plain": "from apex import amp\n"}
# where the assert is: alone under the level's `if` (which goes too), beside another line there, or bare
PLACES = ("alone_in_if", "beside", "bare")


def _script(check: str, imports: str, place: str, level: str = "O1") -> str:
    if place == "alone_in_if":
        guard = f'    if args.level != "O0":\n        {check}\n'
    elif place == "beside":
        guard = f'    if args.level != "O0":\n        {check}\n        print("mixed precision", args.level)\n'
    else:
        guard = f"    {check}\n"
    return (
        "import argparse\n\nimport torch\n" + IMPORTS[imports] + "\n\n"
        "def train(args):\n"
        "    model = torch.nn.Linear(4, 1).cuda()\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        f'    model, optimizer = amp.initialize(model, optimizer, opt_level="{level}")\n'
        "    for _ in range(3):\n"
        "        loss = model(torch.randn(2, 4, device='cuda')).sum()\n"
        "        optimizer.zero_grad()\n"
        "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "            scaled_loss.backward()\n"
        "        optimizer.step()\n\n\n"
        "if __name__ == '__main__':\n"
        "    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--level', default='O1')\n"
        "    args = parser.parse_args()\n" + guard + "    train(args)\n"
    )


def _apex_left(text: str) -> bool:
    tree = ast.parse(text)
    return any(isinstance(node, (ast.Import, ast.ImportFrom)) and "apex" in ast.unparse(node) for node in ast.walk(tree)) or any(
        isinstance(node, ast.Name) and node.id == "amp" for node in ast.walk(tree))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(check=st.sampled_from(ASSERTS), imports=st.sampled_from(sorted(IMPORTS)), place=st.sampled_from(PLACES))
def test_the_availability_assert_goes_with_apex(check, imports, place):
    source = _script(check, imports, place)
    result = migrate_source(source, filename="train.py")
    fixed = result.new_source
    assert not _apex_left(fixed) and "assert" not in fixed and "TODO(ampmigrate)" not in fixed, fixed
    assert ('if args.level != "O0":' in fixed) == (place == "beside"), fixed
    notes = " ".join(d.fix.message for d in result.diagnostics if d.fix is not None)
    assert "`assert amp is not None` stopped runs where apex was not installed" in notes, notes
    compile(fixed, "train.py", "exec")
    assert migrate_source(fixed, filename="train.py").new_source == fixed


@pytest.mark.parametrize("place", PLACES)
def test_a_file_left_on_apex_keeps_its_assert(place):
    source = _script(ASSERTS[0], "try", place, level="O2")
    assert migrate_source(source, filename="train.py").new_source == source


FLAGS = ("APEX_AVAILABLE", "has_apex")
FLAG_ASSERTS = ("assert not fp16 or fp16 and {flag}, 'Apex is not available for you to use mixed precision training'",
                "assert not fp16 or {flag}, 'install apex'", "assert {flag} or not fp16", "assert (not fp16) or (fp16 and {flag})")
HANDLERS = ("except:", "except ImportError:")
TRAINER = """\
import torch

try:
    from apex import amp
    {flag} = True
{handler}
    {flag} = False


class Trainer:
    def __init__(self, model, optimizer, fp16=False):
        {check}
        self.fp16 = fp16
        self.model, self.optimizer = model, optimizer
        if fp16:
            self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

    def step(self, x):
        loss = self.model(x).sum()
        if self.fp16:
            with amp.scale_loss(loss, self.optimizer) as scaled:
                scaled.backward()
        else:
            loss.backward()
        self.optimizer.step()
"""


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("check", FLAG_ASSERTS)
@pytest.mark.parametrize("handler", HANDLERS)
def test_an_assert_on_the_apex_flag_goes_and_the_note_says_it_stopped_runs(flag, check, handler):
    source = TRAINER.format(flag=flag, handler=handler, check=check.format(flag=flag))
    result = migrate_source(source, filename="trainer.py")
    fixed = result.new_source
    assert "assert" not in fixed and flag not in fixed and "apex" not in fixed, fixed
    notes = " ".join(f"{d.message} {d.fix.message}" for d in result.diagnostics if d.fix is not None)
    assert f"where apex was not installed, an `assert` on `{flag}` stopped runs asking for mixed precision" in notes, notes
    assert "turned mixed precision off" not in notes, notes
    assert migrate_source(fixed, filename="trainer.py").new_source == fixed


def test_a_flag_read_beside_its_assert_still_turned_mixed_precision_off():
    source = TRAINER.format(flag="has_apex", handler="except ImportError:", check="assert not fp16 or has_apex, 'install apex'")
    source = source.replace("        if fp16:\n", "        if fp16 and has_apex:\n")
    notes = " ".join(d.fix.message for d in migrate_source(source, filename="trainer.py").diagnostics if d.fix is not None)
    assert "`has_apex = False` turned mixed precision off" in notes, notes


# a check that raises where apex is missing: on the flag itself, or through a function returning it
RAISING = {
    "flag": ("", "if fp16 and not {flag}:\n            raise ImportError('install apex')"),
    "flag_first": ("", "if not {flag} and fp16:\n            raise RuntimeError('Apex is not available')"),
    "function": ("\n\ndef is_apex_available():\n    return {flag}\n",
                 "if fp16:\n            if not is_apex_available():\n                raise ImportError('install apex')"),
}


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("raising", sorted(RAISING))
@pytest.mark.parametrize("handler", HANDLERS)
def test_a_raising_check_of_the_apex_flag_is_said_to_have_stopped_runs(flag, raising, handler):
    """``if fp16 and not has_apex: raise ImportError(...)`` (or ``if not is_apex_available():
    raise`` through a function returning the flag, a transformers-style trainer): runs without
    apex raised, they did not fall back to float32; the note says so, and the migrated file runs."""
    helper, check = RAISING[raising]
    source = TRAINER.format(flag=flag, handler=handler, check=check.format(flag=flag))
    source = source.replace("\n\nclass Trainer:", helper.format(flag=flag) + "\n\nclass Trainer:")
    compile(source, "trainer.py", "exec")
    result = migrate_source(source, filename="trainer.py")
    fixed = result.new_source
    assert "apex import" not in fixed and "from apex" not in fixed and "TODO(ampmigrate)" not in fixed, fixed
    notes = " ".join(f"{d.message} {d.fix.message}" for d in result.diagnostics if d.fix is not None)
    assert f"where apex was not installed, a test of `{flag}` raised and stopped runs asking for mixed precision" in notes, notes
    assert "turned mixed precision off" not in notes, notes
    namespace = {}
    exec(compile(fixed, "trainer.py", "exec"), namespace)  # the check, where it stays, passes: the flag reads True
    namespace["Trainer"](torch.nn.Linear(2, 1), None, fp16=False)


def test_a_flag_returned_by_a_function_read_elsewhere_still_turned_mixed_precision_off():
    helper, check = RAISING["function"]
    source = TRAINER.format(flag="has_apex", handler="except ImportError:", check=check.format(flag="has_apex"))
    source = source.replace("\n\nclass Trainer:", helper.format(flag="has_apex") + "\n\nclass Trainer:")
    source = source.replace("        self.fp16 = fp16\n", "        self.fp16 = fp16 and is_apex_available()\n")
    notes = " ".join(d.fix.message for d in migrate_source(source, filename="trainer.py").diagnostics if d.fix is not None)
    assert "`has_apex = False` turned mixed precision off" in notes, notes


@pytest.mark.parametrize("check", ["if amp is None:", "if use_amp and amp is None:", "if not amp:"])
def test_a_fallback_binding_amp_itself_to_none_tested_to_raise_is_said_to_have_stopped_runs(check):
    """``except ImportError: amp = None`` and ``if amp is None: raise RuntimeError(...)`` before
    training (an SSD trainer's ``--apex``): ``amp.initialize``/``amp.scale_loss`` use the module
    and test nothing, so the only test of the name raised; the fixes' note says so."""
    source = (
        "import torch\n\ntry:\n    from apex import amp\nexcept ImportError:\n    amp = None\n\n\n"
        "def train(use_amp=True):\n"
        "    if use_amp:\n"
        f"        {check}\n"
        "            raise RuntimeError('Failed to import apex')\n"
        "    model = torch.nn.Linear(4, 1).cuda()\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    model, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n"
        "    for _ in range(3):\n"
        "        loss = model(torch.randn(2, 4, device='cuda')).sum()\n"
        "        optimizer.zero_grad()\n"
        "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "            scaled_loss.backward()\n"
        "        optimizer.step()\n"
    )
    compile(source, "train.py", "exec")
    result = migrate_source(source, filename="train.py")
    assert "from apex" not in result.new_source, result.new_source
    notes = " ".join(d.fix.message for d in result.diagnostics if d.fix is not None)
    assert "a test of `amp` raised and stopped runs asking for mixed precision" in notes, notes
    assert "turned mixed precision off" not in notes, notes
