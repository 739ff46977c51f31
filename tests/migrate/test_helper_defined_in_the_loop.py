"""A helper defined in the training loop between the forward pass and the loss (``def debatch(fea):
...`` then ``q_t = debatch(q)``): it computes nothing where it is defined, so the autocast region
goes above it to the forward pass apex cast, as a person would wrap it. The region used to stop at
the definition: the safe fix was refused, and the unsafe one left the forward pass in float32
with no marker. A decorated helper runs its decorator there and still ends the region. An import
there (``import ipdb; ipdb.set_trace()``, ``from utils import split``) binds the same local name
inside a ``with``: the region goes above it too, in a function; not at a script's top level."""
from __future__ import annotations

import ast
import itertools
import textwrap

import pytest

from migrate.api import migrate_source

SCRIPT = '''\
import torch
import torch.nn.functional as F
from apex import amp


def train(model, optimizer, batches):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
{loop}
{before}
        out = model(x)
{after}
        first, second = {call}
        loss = F.mse_loss(first, y) + F.mse_loss(second, y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
'''
HELPERS = {
    "plain": ("def halves(t):\n    a, b = t.split(t.size(1) // 2, dim=1)\n    return a.contiguous(), b.contiguous()\n",
              "halves(out)"),
    "closure": ("def halves(t):\n    width = x.size(1)\n    return t[:, :width // 8], t[:, width // 8:width // 4]\n",
                "halves(out)"),
    "default": ("def halves(t, parts=2):\n    return t.chunk(parts, dim=1)\n", "halves(out)"),
    "two": ("def first_of(t):\n    return t[:, :1]\n\ndef second_of(t):\n    return t[:, 1:2]\n",
            "first_of(out), second_of(out)"),
}
LOOPS = {"for": "    for x, y in batches:", "enumerate": "    for step, (x, y) in enumerate(batches):",
         "while": "    while batches:\n        x, y = batches.pop()"}


def _script(helper: str, loop: str, place: str, decorator: str = "") -> str:
    definition, call = HELPERS[helper]
    lines = textwrap.indent(decorator + definition, " " * 8)
    return SCRIPT.format(loop=LOOPS[loop], before=lines if place == "before" else "",
                         after=lines if place == "after" else "", call=call)


def _forward_in_a_region(source: str) -> bool:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.With) and any("autocast" in ast.unparse(item.context_expr) for item in node.items):
            if any(isinstance(inner, ast.Assign) and ast.unparse(inner) == "out = model(x)" for inner in ast.walk(node)):
                return True
    return False


@pytest.mark.parametrize("helper, loop, place", list(itertools.product(HELPERS, LOOPS, ["after", "before"])))
def test_a_helper_defined_in_the_loop_is_inside_the_region_from_the_forward_pass(helper, loop, place):
    result = migrate_source(_script(helper, loop, place), filename="train.py")
    assert result.changed and "apex" not in result.new_source, [d.message for d in result.diagnostics]
    assert _forward_in_a_region(result.new_source), result.new_source


@pytest.mark.parametrize("loop", LOOPS)
def test_a_decorated_helper_ends_the_region(loop):
    """``@torch.jit.script`` compiles where the helper is defined: not under autocast. The safe fix
    is refused, as before; the unsafe one never leaves the forward pass out unmarked."""
    source = _script("plain", loop, "after", decorator="@torch.jit.script\n")
    assert not migrate_source(source, filename="train.py").changed
    unsafe = migrate_source(source, filename="train.py", unsafe_fixes=True)
    assert not unsafe.changed or _forward_in_a_region(unsafe.new_source) or "TODO(ampmigrate)" in unsafe.new_source


MAIN = '''

if __name__ == "__main__":
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).cuda()
    sgd = torch.optim.SGD(net.parameters(), lr=0.05)
    data = [(torch.randn(16, 8, device="cuda"), torch.randn(16, 1, device="cuda")) for _ in range(4)] * 5
    train(net, sgd, data)
'''


@pytest.mark.slow
@pytest.mark.parametrize("helper", ["plain", "two"])
def test_the_region_over_a_helper_trains_as_apex_did(helper, tmp_path):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    source = _script(helper, "for", "after") + MAIN
    (tmp_path / "original.py").write_text(source)
    (tmp_path / "rewritten.py").write_text(migrate_source(source, filename="train.py").new_source)
    comparison = compare(Target(str(tmp_path / "original.py")), Target(str(tmp_path / "rewritten.py")), [],
                         device="cpu", steps=15, parallel=True, timeout=240)
    assert comparison.verdict == SAME, as_text(comparison)


# an import between the forward pass and the loss: `halves` then comes from it
IMPORTS = {
    "import": "import math\nhalves = lambda t: t.chunk(2, dim=1)\n",
    "import then a call": "import math; math.sqrt(4.0)\nhalves = lambda t: t.chunk(2, dim=1)\n",
    "from import": "from functools import partial\nhalves = partial(torch.chunk, chunks=2, dim=1)\n",
    "from import as": "from torch import chunk as split\nhalves = lambda t: split(t, 2, dim=1)\n",
}


@pytest.mark.parametrize("imported, loop", list(itertools.product(IMPORTS, LOOPS)))
def test_an_import_in_the_loop_is_inside_the_region_from_the_forward_pass(imported, loop):
    source = SCRIPT.format(loop=LOOPS[loop], before="", after=textwrap.indent(IMPORTS[imported], " " * 8), call="halves(out)")
    result = migrate_source(source, filename="train.py")
    assert result.changed and "apex" not in result.new_source, [d.message for d in result.diagnostics]
    assert _forward_in_a_region(result.new_source), result.new_source
    namespace: dict = {}
    exec(compile(result.new_source.replace('"cuda"', '"cpu"').replace("torch.float16", "torch.bfloat16"), "train.py", "exec"), namespace)
    net = namespace["torch"].nn.Linear(4, 2)
    namespace["train"](net, namespace["torch"].optim.SGD(net.parameters(), lr=0.1),
                       [(namespace["torch"].randn(2, 4), namespace["torch"].randn(2, 1))])


def test_a_global_declaration_ends_the_region():
    """``global`` must come before the name's uses in the function: it stays out of the region."""
    source = SCRIPT.format(loop=LOOPS["for"], before="", after="        global counted\n        halves = lambda t: t.chunk(2, dim=1)\n",
                           call="halves(out)")
    for unsafe_fixes in (False, True):
        result = migrate_source(source, filename="train.py", unsafe_fixes=unsafe_fixes)
        if result.changed:
            regions = [node for node in ast.walk(ast.parse(result.new_source)) if isinstance(node, ast.With)
                       and any("autocast" in ast.unparse(item.context_expr) for item in node.items)]
            assert regions and not any(isinstance(inner, ast.Global) for region in regions for inner in ast.walk(region))
