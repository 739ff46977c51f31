"""A model readied for inference by ``amp.initialize`` under a test of whether apex is installed
(``try: from apex import amp / except ImportError: amp = None``, then ``if amp is not None:
model = amp.initialize(model, opt_level='O1')``, a toxicity classifier's submission path). The
unsafe rewrite removes the call and leaves a ``TODO(ampmigrate)`` saying to run the model under
autocast (apex cast it from there on); folding the availability test afterwards took the arm's
``pass`` and the marker with it, so inference changed precision with no word.
"""
from __future__ import annotations

import itertools
import textwrap

import pytest

from migrate.api import migrate_source

HEAD = """import torch
try:
    from apex import amp
except ImportError:
    amp = None

"""
# the availability test around the call ({call}: the initialize line, indented once)
GUARDS = {
    "is_not_none": "if amp is not None:\n{call}\n",
    "truth": "if amp:\n{call}\n",
    "else_of_is_none": "if amp is None:\n    print('no apex')\nelse:\n{call}\n",
    "else_of_not": "if not amp:\n    print('no apex')\nelse:\n{call}\n",
}
LEVELS = {"O1": "torch.autocast", "O2": "float16"}
# where it stands: in a function with a statement after it, as the function's last statement, at the top
HOLDERS = ["function_then_more", "function_last", "module"]


def _script(guard: str, level: str, holder: str) -> str:
    call = f"    model = amp.initialize(model, opt_level={level!r}, verbosity=0)"
    block = GUARDS[guard].format(call=call)
    if holder == "module":
        return HEAD + "model = torch.nn.Linear(4, 2)\n" + block + "print(model(torch.randn(2, 4)))\n"
    after = "    return model(torch.randn(2, 4))\n" if holder == "function_then_more" else ""
    return HEAD + "\ndef predict(model):\n    model.eval()\n" + textwrap.indent(block, "    ") + after


@pytest.mark.parametrize(("guard", "level", "holder"), list(itertools.product(GUARDS, LEVELS, HOLDERS)))
def test_the_unsafe_rewrite_keeps_the_marker_where_the_test_is_folded(guard, level, holder):
    new = migrate_source(_script(guard, level, holder), "predict.py", unsafe_fixes=True).new_source
    compile(new, "predict.py", "exec")
    if "with torch.autocast(" in new:  # at the top, O1: what runs after it goes under autocast, enabled by the test
        assert holder == "module" and level == "O1" and "    print(model(" in new, new
        return
    assert "from apex" not in new and "amp is" not in new and "if amp" not in new and "not amp" not in new, new
    marker = " ".join(line.strip(" #") for line in new.splitlines() if line.lstrip().startswith("#"))
    assert "TODO(ampmigrate)" in marker and "`model`" in marker and LEVELS[level] in marker, new
