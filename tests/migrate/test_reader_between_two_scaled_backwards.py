"""A gradient reader between two ``amp.scale_loss`` backward passes of one step (an EWC-style
regulariser accumulating squared gradients, then a penalty's own scaled backward, then the step).
apex had unscaled the first pass's gradients when its ``scale_loss`` exited; natively they are
still multiplied by the scale there, and an ``unscale_`` before the read would have the second
pass add scaled gradients to unscaled ones. The marker says to read them divided by
``scaler.get_scale()``, not to "unscale where they are final" (fcdl94/MiB's ``train.py``: no
such place exists before the read), nor that the step "may not follow"."""
from __future__ import annotations

import itertools
import textwrap

import pytest

from migrate.api import migrate_source

READERS = {  # a statement reading the first pass's gradients
    "helper": "accumulate(model, fisher)",
    "inline_loop": "for name, p in model.named_parameters():\n    fisher[name] = fisher.get(name, 0) + p.grad.detach() ** 2",
    "norm": "norms.append(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]).norm())",
}
SECOND = {  # the second scaled backward pass
    "always": "with amp.scale_loss(penalty, optimizer) as scaled_loss:\n    scaled_loss.backward()",
    "under_test": "if penalty_weight > 0:\n    with amp.scale_loss(penalty, optimizer) as scaled_penalty:\n        scaled_penalty.backward()",
}
NAMES = [("model", "optimizer"), ("net", "opt")]
SCRIPT = """\
import torch
from apex import amp


def accumulate(model, fisher):
    for name, p in model.named_parameters():
        if p.grad is not None:
            fisher[name] = fisher.get(name, 0) + p.grad.detach() ** 2


def train(model, optimizer, loader, fisher, norms, penalty_weight):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
{reader}
        penalty = penalty_weight * sum((p ** 2).sum() for p in model.parameters())
{second}
        optimizer.step()
"""


def _script(reader: str, second: str, names: tuple[str, str]) -> str:
    source = SCRIPT.format(reader=textwrap.indent(READERS[reader], " " * 8), second=textwrap.indent(SECOND[second], " " * 8))
    model, optimizer = names
    source = source.replace("model", model).replace("optimizer", optimizer)
    compile(source, "train.py", "exec")
    return source


@pytest.mark.parametrize("reader, second, names", list(itertools.product(READERS, SECOND, NAMES)))
def test_the_marker_says_to_divide_the_scale_out(reader, second, names):
    result = migrate_source(_script(reader, second, names), "train.py", unsafe_fixes=True)
    assert result.error is None, result.error
    new = result.new_source
    compile(new, "train.py", "exec")
    marker = " ".join(line.strip(" #") for line in new.splitlines() if line.strip().startswith("#"))
    assert "another scaled backward adds to them" in marker and "divided by `scaler.get_scale()`" in marker, new
    assert "where they are final" not in marker and "may not follow" not in marker, new


@pytest.mark.parametrize("reader, names", list(itertools.product(READERS, NAMES)))
def test_a_reader_in_the_block_of_the_second_pass_is_told_the_same(reader, names):
    # `if use_reg: <read>; penalty = ...; if penalty != 0: <scaled backward>`: one statement holds both
    block = ("if penalty_weight > 0:\n" + textwrap.indent(READERS[reader], "    ")
             + "\n    penalty = penalty_weight * sum((p ** 2).sum() for p in model.parameters())"
             + "\n    if penalty != 0:\n        with amp.scale_loss(penalty, optimizer) as scaled_penalty:\n"
             + "            scaled_penalty.backward()")
    source = SCRIPT.replace("{reader}\n        penalty = penalty_weight * sum((p ** 2).sum() for p in model.parameters())\n{second}",
                            textwrap.indent(block, " " * 8))
    model, optimizer = names
    source = source.replace("model", model).replace("optimizer", optimizer)
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py", unsafe_fixes=True).new_source
    marker = " ".join(line.strip(" #") for line in new.splitlines() if line.strip().startswith("#"))
    assert "another scaled backward adds to them" in marker and "where they are final" not in marker, new


def test_a_reader_where_the_step_may_not_follow_keeps_its_advice():
    # one backward pass, the step at an accumulation boundary: after that step the gradients are final
    source = _script("helper", "always", NAMES[0]).replace(
        "        with amp.scale_loss(penalty, optimizer) as scaled_loss:\n            scaled_loss.backward()\n", "").replace(
        "        optimizer.step()\n", "        if len(norms) % 4 == 0:\n            optimizer.step()\n")
    new = migrate_source(source, "train.py", unsafe_fixes=True).new_source
    assert "where they are final" in " ".join(line.strip(" #") for line in new.splitlines()), new
