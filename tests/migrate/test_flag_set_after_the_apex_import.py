"""``has_apex = False`` before a ``try`` whose body sets ``has_apex = True`` after the apex import,
the ``except`` only printing: where apex was not installed the failed import skipped that
assignment and mixed precision stayed off; with the import gone the flag is always set, so those
runs now use it. The fixes say so, as they do for ``except ImportError: has_apex = False``
(yuyangw/MolCLR's shape: a safe rewrite said nothing)."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

SCRIPT = """\
import sys
import torch
{default}try:
    sys.path.append("./apex")
    {imported}
{between}    {flag} = True
except{caught}:
    {handler}


def train(model, optimizer, loader, config):
    if {flag} and config["fp16"]:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x in loader:
        loss = model(x).sum()
        if {flag} and config["fp16"]:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
"""
FLAGS = ["apex_support", "use_apex"]
DEFAULTS = {"before": "{flag} = False\n", "none": ""}
IMPORTS = ["from apex import amp", "import apex.amp as amp"]
BETWEEN = {"adjacent": "", "blank and a log": "\n    print('apex found')\n"}
CAUGHT = {"bare": "", "ImportError": " ImportError", "Exception as error": " Exception as error"}
HANDLERS = ["print('Please install apex for mixed precision training')", "pass"]


@pytest.mark.parametrize("flag, default, imported, between, caught, handler",
                         list(itertools.product(FLAGS, DEFAULTS, IMPORTS, BETWEEN, CAUGHT, HANDLERS)))
def test_the_fixes_say_the_flag_is_now_always_set(flag, default, imported, between, caught, handler):
    source = SCRIPT.format(default=DEFAULTS[default].format(flag=flag), imported=imported, between=BETWEEN[between],
                           flag=flag, caught=CAUGHT[caught], handler=handler)
    compile(source, "train.py", "exec")
    for unsafe in (False, True):
        result = migrate_source(source, "train.py", unsafe_fixes=unsafe)
        assert result.error is None, result.error
        if result.new_source in (None, source):
            continue  # not rewritten in this mode: nothing changed for anyone
        notes = " ".join(" ".join(f"{d.message} {d.fix.message}".split()) for d in result.diagnostics if d.fix is not None)
        assert (f"where apex was not installed, skipping `{flag} = True` after the import turned mixed precision off"
                in notes), notes
        break
    else:
        pytest.fail("rewritten in neither mode")


def test_an_assignment_before_the_import_is_not_skipped():
    source = SCRIPT.format(default="", imported="from apex import amp", between="", flag="use_apex", caught="",
                           handler="print('no apex')").replace("    use_apex = True\n", "", 1)
    source = source.replace('    sys.path.append("./apex")\n', '    sys.path.append("./apex")\n    use_apex = True\n')
    result = migrate_source(source, "train.py", unsafe_fixes=True)
    notes = " ".join(d.fix.message for d in result.diagnostics if d.fix is not None)
    assert "skipping" not in notes, notes


@pytest.mark.parametrize("other", ["import apex_tools", "from pyapex import utils", "import apexlike.io as aio"])
def test_only_what_follows_the_apex_import_is_named(other):
    # an import whose name only contains "apex" runs before apex's: what follows it ran without apex too
    source = SCRIPT.format(default="has_apex = False\n", imported=f"{other}\n    ready = True\n    from apex import amp",
                           between="", flag="has_apex", caught=" ImportError", handler="print('no apex')")
    compile(source, "train.py", "exec")
    result = migrate_source(source, "train.py", unsafe_fixes=True)
    notes = " ".join(" ".join(d.fix.message.split()) for d in result.diagnostics if d.fix is not None)
    assert "skipping `has_apex = True` after the import" in notes, notes
    assert "ready = True" not in notes, notes
