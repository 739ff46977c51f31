"""The behaviour-change note of a removed apex import guard, for every spelling of what shows it wrong.

``try: from apex import amp`` / ``except ImportError: APEX_AVAILABLE = False`` is removed with a
note that runs without apex now use mixed precision. Two things make that note wrong:

- the file imports apex outside any guard as well (``import apex`` above the ``try``, a
  segmentation search's trainer; ``from apex import pyprof``, a detector's): without apex it never
  ran, so no run took the ``except`` branch and nothing changes;
- the fallback binds ``amp = None`` and only ``if amp is None: raise`` tests it, while the file's
  own option is called ``amp`` too (``args.amp``, ``f(amp=...)``): those are other names, not
  reads of the fallback, and they made the note say "turned mixed precision off".

And the ``try``'s own finding comes from a later round, after a fix removed what showed the
``except`` branch's effect: it is asked of the file as it was before any fix.
"""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

SCRIPT = """import argparse
import torch
{before}try:
    from apex import amp
    {set_flag}
except {error}:
    {fallback}
{after}
parser = argparse.ArgumentParser()
parser.add_argument("--{option}", action="store_true")
args = parser.parse_args()
use_amp = {use}
model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if use_amp:
{check}    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for step in range(3):
    loss = model(torch.randn(2, 4).cuda()).pow(2).mean()
    optimizer.zero_grad()
    if use_amp:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
    else:
        loss.backward()
    optimizer.step()
"""
# the flag the `except` branch sets, and how the file reads it
FALLBACKS = {
    "flag": ("APEX_AVAILABLE = True", "APEX_AVAILABLE = False", "APEX_AVAILABLE and args.{option}", ""),
    "amp_none": ("pass", "amp = None", "args.{option}", ""),
    "amp_none_checked": ("pass", "amp = None", "args.{option}",
                         "    if amp is None:\n        raise RuntimeError('install apex')\n"),
}
ERRORS = ("ImportError", "ModuleNotFoundError")
# the file's other apex import, outside any guard
ANYWAY = {"import_apex": "import apex", "pyprof": "from apex import pyprof",
          "submodule": "import apex.parallel"}
WHERE = ("before", "after")


def _script(fallback: str, error: str, option: str = "use_amp", anyway: str | None = None, where: str = "before") -> str:
    set_flag, fallback_line, use, check = FALLBACKS[fallback]
    other = f"{ANYWAY[anyway]}\n" if anyway else ""
    return SCRIPT.format(before=other if where == "before" else "", after=other if where == "after" else "",
                         set_flag=set_flag, error=error, fallback=fallback_line, option=option,
                         use=use.format(option=option), check=check)


def _notes(source: str, unsafe: bool = False) -> list[str]:
    compile(source, "train.py", "exec")
    result = migrate_source(source, "train.py", unsafe_fixes=unsafe)
    return [text for diagnostic in result.diagnostics for text in (diagnostic.message, diagnostic.fix.message if diagnostic.fix else "")
            if "where apex was not installed" in text]


@pytest.mark.parametrize(("fallback", "error", "anyway", "where"),
                         list(itertools.product(sorted(FALLBACKS), ERRORS, sorted(ANYWAY), WHERE)))
def test_no_change_is_noted_where_the_file_imports_apex_anyway(fallback, error, anyway, where):
    assert _notes(_script(fallback, error, anyway=anyway, where=where)) == []


@pytest.mark.parametrize(("fallback", "error"), list(itertools.product(sorted(FALLBACKS), ERRORS)))
def test_the_change_is_noted_where_apex_is_imported_only_under_the_guard(fallback, error):
    """The control: with no other import, runs without apex did take the ``except`` branch."""
    notes = _notes(_script(fallback, error))
    assert notes and all("behaviour change" in note for note in notes), notes


def test_an_import_in_a_function_is_not_an_import_anyway():
    """``import apex`` inside a function runs only where it is called: the note stays."""
    source = _script("flag", "ImportError").replace("import torch\n", "import torch\n\n\ndef profile():\n    import apex\n\n\n", 1)
    assert _notes(source)


# the file's own option spelled `amp`: an attribute or a keyword, never a read of the fallback
OPTIONS = ("amp", "use_amp")


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
@pytest.mark.parametrize(("error", "option"), list(itertools.product(ERRORS, OPTIONS)))
def test_a_raising_check_of_amp_is_noted_as_stopping_runs(error, option, unsafe):
    """Every note, the ``try``'s own from a later round among them, says the check raised."""
    notes = _notes(_script("amp_none_checked", error, option=option), unsafe=unsafe)
    assert notes and all("raised and stopped" in note and "turned mixed precision off" not in note for note in notes), notes


def test_the_folded_check_is_named_for_its_own_test():
    """``if args.amp:`` around ``if amp is None: raise`` goes with it; the finding names ``amp is None``."""
    result = migrate_source(_script("amp_none_checked", "ImportError", option="amp"), "train.py")
    asked = [d.message for d in result.diagnostics if "only asks whether apex is installed" in d.message]
    assert asked and all(message.startswith("`amp is None`") for message in asked), asked
