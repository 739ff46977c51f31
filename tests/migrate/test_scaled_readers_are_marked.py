"""Gradients read where the optimizer step may not follow (after each micro-batch of an
accumulation) cannot be unscaled there: ``unscale_`` may run once per step. apex had unscaled
them; natively they stay multiplied by the loss scale. The unsafe rewrite keeps them so and
leaves its ``TODO(ampmigrate)`` marker on the statement that reads them, not only where apex was
set up, so the line that trains differently says so. A clip, and a function of the file whose
result grows as the gradients do (a norm, ``migrate.grad_norms``), are exact on the scaled
gradients instead (the threshold times the scale; the norm divided by it): the safe rewrite
takes those.

Generated over: how the gradients are read (a clip in one arm and a norm in the other, a
module-level norm helper, a norm helper called through another, a count of large gradients),
which parameters are named (``amp.master_params(optimizer)``, the model's), and how the
accumulation boundary is spelled."""
from __future__ import annotations

import itertools
import re

import pytest

from generated.judge import marked_where_it_differs
from generated.small_scripts import compared, script_head
from migrate.api import migrate_source

READERS = ("arms", "helper", "nested_helper")  # norms: exact divided by the scale
COUNT = """

def large_gradients(parameters):
    return sum(float((p.grad.abs() > 1e-3).sum()) for p in parameters if p.grad is not None)
"""
PARAMETERS = {"master": "amp.master_params(optimizer)", "model": "model.parameters()"}
BOUNDARIES = {"plus_one": "(step + 1) % 2 == 0", "minus_one": "step % 2 == 1"}
HELPER = '''

def grad_norm(parameters):
    return torch.norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None]))
'''


def _reader(reader: str, parameters: str) -> list[str]:
    if reader == "arms":
        return ["if args.clip:", f"    norm = torch.nn.utils.clip_grad_norm_({parameters}, 0.5)",
                "else:", f"    norm = grad_norm({parameters})"]
    if reader == "helper":
        return [f"norm = grad_norm({parameters})"]
    if reader == "count":
        return [f"norm = large_gradients({parameters})"]
    return [f"norm = measure({parameters})"]


def _script(reader: str, parameters: str, boundary: str) -> str:
    head = script_head('parser.add_argument("--clip", type=int, default=1)\n')
    nested = "\n\ndef measure(parameters):\n    return grad_norm(parameters)\n" if reader == "nested_helper" else ""
    lines = ["model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)",
             "optimizer = torch.optim.SGD(model.parameters(), lr=0.05)",
             "model, optimizer = amp.initialize(model, optimizer, opt_level='O1')",
             "norms = []",
             "for step in range(args.steps):",
             "    x = torch.randn(16, 8, device=device)",
             "    loss = model(x).pow(2).mean() / 2",
             "    with amp.scale_loss(loss, optimizer) as scaled_loss:",
             "        scaled_loss.backward()",
             *("    " + line for line in _reader(reader, PARAMETERS[parameters])),
             "    norms.append(float(norm))",
             f"    if {BOUNDARIES[boundary]}:",
             "        optimizer.step()",
             "        optimizer.zero_grad()",
             "print(norms[-1])"]
    return head + HELPER + (COUNT if reader == "count" else "") + nested + "\n\n" + "\n".join(lines) + "\n"


VARIANTS = list(itertools.product(READERS, PARAMETERS, BOUNDARIES))


@pytest.mark.parametrize("reader, parameters, boundary", VARIANTS)
def test_a_norm_of_still_scaled_gradients_is_divided_by_the_scale(reader, parameters, boundary):
    source = _script(reader, parameters, boundary)
    new = migrate_source(source, filename="train.py").new_source
    assert "from apex" not in new and "TODO(ampmigrate)" not in new, new
    assert "/ scaler.get_scale()" in new, new
    compile(new, "train.py", "exec")
    assert migrate_source(new, filename="train.py").new_source == new  # idempotent


@pytest.mark.parametrize("parameters, boundary", list(itertools.product(PARAMETERS, BOUNDARIES)))
def test_a_read_of_still_scaled_gradients_is_marked_where_it_reads(parameters, boundary):
    source = _script("count", parameters, boundary)
    assert migrate_source(source, filename="train.py").new_source == source  # safe: left alone
    new = migrate_source(source, filename="train.py", unsafe_fixes=True).new_source
    assert "from apex" not in new and not re.search(r"(?<!torch\.)\bamp\.", new), new
    marked = re.search(r"# TODO\(ampmigrate\): this reads gradients still scaled.*\n(?:\s*#.*\n)*(.*)", new)
    assert marked is not None, new
    assert marked.group(1).strip().startswith(("if args.clip:", "norm = ")), new
    assert marked_where_it_differs(new, "differs: clip-scaled")
    compile(new, "train.py", "exec")
    assert migrate_source(new, filename="train.py", unsafe_fixes=True).new_source == new  # idempotent


@pytest.mark.slow
@pytest.mark.parametrize("parameters, boundary", [("master", "plus_one"), ("model", "minus_one")])
def test_the_marked_rewrite_runs(tmp_path, parameters, boundary):
    """It may train differently, as its marker says; it never crashes."""
    from ampshim.compare import COULD_NOT_RUN, DIFFERS
    from ampshim.compare.report import as_text

    source = _script("count", parameters, boundary)
    new = migrate_source(source, filename="train.py", unsafe_fixes=True).new_source
    result = compared(tmp_path, source, new, "unsafe", steps=12)
    assert result.verdict != COULD_NOT_RUN, as_text(result)
    assert not (result.verdict == DIFFERS and result.difference.cause == "crash"), as_text(result)


@pytest.mark.slow
@pytest.mark.parametrize("reader, parameters, boundary", [("arms", "master", "plus_one"), ("nested_helper", "model", "minus_one")])
def test_the_divided_norm_trains_the_same(tmp_path, reader, parameters, boundary):
    from ampshim.compare import SAME
    from ampshim.compare.report import as_text

    source = _script(reader, parameters, boundary)
    new = migrate_source(source, filename="train.py").new_source
    result = compared(tmp_path, source, new, "safe", steps=12)
    assert result.verdict == SAME, as_text(result)



@pytest.mark.parametrize("clip_in, grads_in", [("helper", "local"), ("loop", "local"), ("helper", "none")])
def test_a_read_an_autocast_region_takes_in_is_marked_inside_it(clip_in, grads_in):
    """A trainer's loss computed from the loop's forward in ``backward_from`` (its own backward),
    then a gradient tracker and a clip, then an auxiliary loss's forward and scaled backward: the
    autocast region made for the auxiliary loss takes the reads in, and their markers go with
    them, on the lines that read (bench seed 74, scripts 82-88). (A clip alone in the loop is made
    scale-aware instead: nothing to mark.)"""
    from generated.apex_scripts import Features, script

    drawn = Features(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="parameters",
                     clip_at="boundary", flag="none", import_guard=False, inner_fp32=False, names=("model", "optimizer", "loss"),
                     holder="method", between="aux_backward", backward_in="update", clip_in=clip_in, grads_in=grads_in)
    new = migrate_source(script(drawn), filename="train.py", unsafe_fixes=True).new_source
    assert marked_where_it_differs(new, "differs: clip-scaled"), new
    compile(new, "train.py", "exec")
