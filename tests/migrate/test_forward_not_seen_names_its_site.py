"""Where one ``amp.scale_loss`` of a file has its forward pass and another's loss is computed
from no forward call (a regulariser's penalty, a weight decay term), the reason "the model's
forward call is not seen" is about the second: the marker says which scaled backward, by its
line and its loss, and only that fix gives it as its own reason; the first's fix says it goes
with it. It once read as if said of the first, whose forward is plainly there."""
from __future__ import annotations

import itertools
import re
import textwrap

import pytest

from migrate.api import migrate_source

EXTRA_LOSSES = {
    "penalty": "{extra} = 0.1 * self.regularizer.penalty()",
    "weights": "{extra} = sum(p.pow(2).sum() for p in model.parameters())",
    "helper": "{extra} = weight_decay_term(optim.param_groups)",
}

HELPER = """\
def weight_decay_term(groups):
    return sum(p.norm() for group in groups for p in group["params"])


"""

LOOP = """\
for x, y in loader:
    optim.zero_grad()
    out = model(x)
    {loss} = torch.nn.functional.mse_loss(out, y)
    with amp.scale_loss({loss}, optim) as scaled_loss:
        scaled_loss.backward()
{extra_block}
    optim.step()
"""

METHOD = """\
import torch
from apex import amp


{helper}class Trainer:
    def __init__(self, model, optimizer, regularizer):
        self.model, self.regularizer = model, regularizer
        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

    def train(self, loader):
        model, optim = self.model, self.optimizer
{loop}"""

FUNCTION = """\
import torch
from apex import amp


{helper}def train(model, optim, loader, regularizer):
    model, optim = amp.initialize(model, optim, opt_level="O1")
{loop}"""

EXTRA_BLOCK = """\
if {guard}:
    {compute}
    with amp.scale_loss({extra}, optim) as scaled_loss:
        scaled_loss.backward()
"""

GUARDS = ["self.regularizer is not None", "True"]


def _script(holder: str, extra_loss: str, guarded: bool, names: tuple[str, str]) -> str:
    loss, extra = names
    compute = EXTRA_LOSSES[extra_loss].format(extra=extra)
    if extra_loss == "penalty" and holder == "function":
        compute = compute.replace("self.regularizer", "regularizer")
    block = EXTRA_BLOCK.format(guard="regularizer is not None" if holder == "function" else GUARDS[0],
                               compute=compute, extra=extra)
    if not guarded:
        block = textwrap.dedent("\n".join(block.splitlines()[1:])) + "\n"
    loop = LOOP.format(loss=loss, extra_block=textwrap.indent(block.rstrip("\n"), " " * 4))
    template = METHOD if holder == "method" else FUNCTION
    return template.format(helper=HELPER if extra_loss == "helper" else "",
                           loop=textwrap.indent(loop, " " * (8 if holder == "method" else 4)))


VARIANTS = list(itertools.product(["method", "function"], sorted(EXTRA_LOSSES), [True, False],
                                  [("loss", "l_reg"), ("task_loss", "reg")]))


@pytest.mark.parametrize(("holder", "extra_loss", "guarded", "names"), VARIANTS)
def test_the_reason_names_the_scaled_backward_it_is_about(holder, extra_loss, guarded, names):
    source = _script(holder, extra_loss, guarded, names)
    compile(source, "trainer.py", "exec")
    loss, extra = names
    lines = source.splitlines()
    first = next(i for i, line in enumerate(lines, 1) if f"amp.scale_loss({loss}," in line)
    second = next(i for i, line in enumerate(lines, 1) if f"amp.scale_loss({extra}," in line)

    result = migrate_source(source, "trainer.py", unsafe_fixes=True)
    assert result.error is None and "from apex" not in result.new_source, result.new_source
    marker = " ".join(re.sub(r"^\s*#\s*", "", line) for line in result.new_source.splitlines() if line.strip().startswith("#"))
    said = f"the model's forward call is not seen next to `amp.scale_loss` at line {second}: autocast covers what `{extra}` is computed from"
    assert said in marker, marker
    assert f"line {first}:" not in marker, marker

    fixes = {d.location.row: d.fix.why_unsafe for d in result.diagnostics if d.fix and d.code == "AMP003"}
    assert "forward call is not seen" in fixes[second], fixes
    assert "forward call is not seen" not in fixes[first] and f"unsafe fix at line {second}" in fixes[first], fixes


@pytest.mark.parametrize("holder", ["method", "function"])
def test_a_loss_with_its_forward_alone_gives_no_such_reason(holder):
    source = _script(holder, "penalty", True, ("loss", "l_reg"))
    source = re.sub(r"\n +if .*is not None:\n(.*\n){3}", "\n", source)  # the second scaled backward gone
    assert source.count("amp.scale_loss") == 1, source
    result = migrate_source(source, "trainer.py")
    assert result.changed and "from apex" not in result.new_source, result.new_source
    assert "TODO(ampmigrate)" not in result.new_source and "forward call is not seen" not in str(result.diagnostics)
