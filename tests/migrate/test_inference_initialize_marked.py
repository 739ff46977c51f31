"""A model readied for inference by a call of its own (``model = amp.initialize(model,
opt_level="O2")``, no optimizer) in a file whose training ``amp.initialize`` the rewrite migrates:
apex cast (O1) or halved (O2, O3) that model from there on, natively nothing does. The unsafe
rewrite removes the call and leaves its marker where it stood, saying what to do with which model;
the marker used to join the training call's, in another function, and the removed line kept none
(salesforce/ALPRO's ``run_video_qa.py``: inference went from float16 to float32 unmarked)."""
from __future__ import annotations

import itertools
import textwrap

import pytest

from migrate.api import migrate_source

torch = pytest.importorskip("torch")

TRAIN = """\
import torch
from apex import amp


def train(cfg, model, optimizer, loader):
    model, optimizer = amp.initialize(model, optimizer, enabled=cfg.fp16, opt_level="O1")
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
{after_loop}

def infer(cfg, {model}, loader):
    {model}.eval()
{in_infer}    with torch.no_grad():
        return [{model}(x) for x, _ in loader]
"""
CALLS = {  # the inference call, for a model named `{model}` at opt level `{level}`
    "plain": "{model} = amp.initialize({model}, opt_level=\"{level}\")",
    "enabled": "{model} = amp.initialize({model}, enabled=cfg.fp16, opt_level=\"{level}\")",
    "positional": "{model} = amp.initialize({model}, None, True, \"{level}\")",
}
GUARDS = {"none": "{call}", "flag": "if cfg.fp16:\n    {call}"}
PLACES = ["another function", "after the training loop"]


def _source(call: str, guard: str, place: str, level: str, model: str) -> str:
    line = GUARDS[guard].format(call=CALLS[call].format(model=model, level=level))
    if place == "another function":
        return TRAIN.format(after_loop="", in_infer=textwrap.indent(line, "    ") + "\n", model=model)
    return TRAIN.format(after_loop=textwrap.indent(line.replace(model, "model"), "    ") + "\n", in_infer="", model=model)


@pytest.mark.parametrize("call, guard, place, level, model",
                         list(itertools.product(CALLS, GUARDS, PLACES, ["O1", "O2", "O3"], ["model", "net"])))
def test_the_removed_inference_call_keeps_a_marker_where_it_stood(call, guard, place, level, model):
    source = _source(call, guard, place, level, model)
    assert migrate_source(source, filename="train.py").new_source == source  # not a safe rewrite
    new = migrate_source(source, filename="train.py", unsafe_fixes=True).new_source
    assert "apex" not in new.replace("apex cast", "").replace("apex O", ""), new
    lines = new.splitlines()
    named = model if place == "another function" else "model"
    loop_end = next(i for i, line in enumerate(lines) if "optimizer.zero_grad()" in line)
    below = "\n".join(lines[loop_end + 1:])
    where = " where `cfg.fp16`" if call == "enabled" else ""  # the flag apex cast under, in the step and its autocast
    step = f"in float16{where}, weights and inputs" if level in ("O2", "O3") else "where it computes: apex cast it"
    assert "TODO(ampmigrate)" in below and f"`{named}`" in below and step in " ".join(below.replace("#", "").split()), new
    assert ("enabled=cfg.fp16)" in below) == (call == "enabled"), new
    assert "without optimizers" not in "\n".join(lines[:loop_end]), new
    namespace = {}
    exec(compile(new, "train.py", "exec"), namespace)
    assert len(namespace["infer"](type("Cfg", (), {"fp16": True}), torch.nn.Linear(4, 1), [(torch.randn(2, 4), None)])) == 1
