"""``from apex import amp`` inside the function that initializes, with ``global amp`` declaring it
the module's (before or after the import: Python holds the declaration for the whole function),
and the module's other functions reading that ``amp``. The name resolves to apex's module in all
of them, and the migration leaves no ``global amp`` behind."""
from __future__ import annotations

import itertools
import re
import textwrap

import pytest

from migrate.api import migrate_source

SCRIPT = """\
import torch


def setup(model, optimizer, fp16):
    if fp16:
{import_lines}
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    return model, optimizer


def train(model, optimizer, batches, fp16):
    for inputs, targets in batches:
        optimizer.zero_grad()
        output = model(inputs)
        loss = torch.nn.functional.mse_loss(output, targets)
        if not fp16:
            loss.backward()
        else:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        optimizer.step()
"""
IMPORTS = {
    "import, then global": "from apex import amp\nglobal amp",
    "global, then import": "global amp\nfrom apex import amp",
    "import as, then global": "import apex.amp as amp\nglobal amp",
    "in a try, then global": 'try:\n    from apex import amp\n    global amp\nexcept ImportError:\n    raise ImportError("needs apex")',
}
FORMS = list(itertools.product(sorted(IMPORTS), [False, True]))


def _script(form: str) -> str:
    return SCRIPT.format(import_lines=textwrap.indent(IMPORTS[form], " " * 8))


@pytest.mark.parametrize(("form", "unsafe_fixes"), FORMS)
def test_a_global_amp_imported_in_a_function_resolves_and_goes(form, unsafe_fixes):
    result = migrate_source(_script(form), filename="train.py", unsafe_fixes=unsafe_fixes)
    codes = {d.code for d in result.diagnostics}
    assert "AMP016" not in codes and {"AMP002", "AMP003"} <= codes, codes
    assert all(d.applied for d in result.diagnostics if d.code.startswith("AMP00")), result.diagnostics
    assert not re.search(r"(?<![\w.])amp\b", result.new_source), result.new_source
    assert "global amp" not in result.new_source and "apex" not in result.new_source
    compile(result.new_source, "train.py", "exec")


def test_a_global_declaration_keeps_the_names_still_used():
    source = SCRIPT.format(import_lines=textwrap.indent("global counter, amp\nfrom apex import amp\ncounter = 1", " " * 8))
    result = migrate_source(source, filename="train.py")
    assert "        global counter\n        counter = 1\n" in result.new_source, result.new_source


@pytest.mark.parametrize("form", sorted(IMPORTS))
def test_the_global_goes_where_another_function_has_a_parameter_of_that_name(form):
    """A parameter ``amp`` elsewhere keeps the name read, so the import goes through libcst's
    scope analysis: the ``global amp`` left in a function that binds ``amp`` no more goes too."""
    source = _script(form) + "\n\ndef describe(amp=None):\n    return repr(amp)\n"
    result = migrate_source(source, filename="train.py")
    assert "global amp" not in result.new_source and "apex" not in result.new_source, result.new_source
    assert "def describe(amp=None):\n    return repr(amp)\n" in result.new_source
    compile(result.new_source, "train.py", "exec")


def test_a_global_the_function_still_binds_stays():
    source = SCRIPT.format(import_lines=textwrap.indent("global amp\nfrom apex import amp", " " * 8)) + (
        "\n\ndef reset():\n    global amp\n    amp = None\n\n\ndef describe(amp=None):\n    return repr(amp)\n")
    result = migrate_source(source, filename="train.py")
    assert "def reset():\n    global amp\n    amp = None\n" in result.new_source, result.new_source
