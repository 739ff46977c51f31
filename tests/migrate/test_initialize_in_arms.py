"""``amp.initialize`` in arms that exclude each other (``if not gt: initialize([pre, G, D], ...);
pre.eval() else: initialize([G, D], ...)``): the rewrite makes one GradScaler, where the first one
was, so a run through the other arm would train without a scaler or autocast. Left alone in either
mode, saying why; initializes that run one after the other (a GAN's two models) still migrate.
(Where each arm holds only its ``initialize``, the chain is one ``initialize`` under the flag:
``test_initialize_chain_under_a_flag``.)"""
from __future__ import annotations

import textwrap

import pytest

from migrate.api import migrate_source

GAN = """\
import torch
from apex import amp


def train(args, pre, gen, dis, opt_g, opt_d, batches):
    if args.fp16:
{setup}
    for index, z in enumerate(batches):
        with amp.scale_loss(dis(gen(pre(z))).mean(), opt_g) as scaled:
            scaled.backward()
        opt_g.step()
        opt_g.zero_grad()
"""
APART = {
    "if_else": "if not args.gt:\n    [pre, gen, dis], [opt_g, opt_d] = amp.initialize([pre, gen, dis], [opt_g, opt_d], opt_level='O1')\n"
               "    pre.eval()\n"
               "else:\n    [gen, dis], [opt_g, opt_d] = amp.initialize([gen, dis], [opt_g, opt_d], opt_level='O1')",
    "elif": "if args.gt:\n    [gen, dis], [opt_g, opt_d] = amp.initialize([gen, dis], [opt_g, opt_d], opt_level='O1')\n"
            "elif args.pre:\n    [pre, gen, dis], [opt_g, opt_d] = amp.initialize([pre, gen, dis], [opt_g, opt_d], opt_level='O1')",
}
TOGETHER = "gen, opt_g = amp.initialize(gen, opt_g, opt_level='O1')\ndis, opt_d = amp.initialize(dis, opt_d, opt_level='O1')"


@pytest.mark.parametrize("shape", sorted(APART))
@pytest.mark.parametrize("unsafe_fixes", [False, True])
def test_initializes_in_exclusive_arms_are_left_alone(shape, unsafe_fixes):
    source = GAN.format(setup=textwrap.indent(APART[shape], " " * 8))
    result = migrate_source(source, filename="train.py", unsafe_fixes=unsafe_fixes)
    assert result.new_source == source
    assert any("in arms that exclude each other" in d.message for d in result.diagnostics), result.diagnostics


def test_initializes_one_after_the_other_still_migrate():
    source = GAN.format(setup=textwrap.indent(TOGETHER, " " * 8))
    result = migrate_source(source, filename="train.py", unsafe_fixes=True)
    assert "amp." not in result.new_source.replace("torch.amp.", ""), result.new_source


def test_an_inference_initialize_in_the_other_arm_needs_no_scaler():
    """``if do_train: initialize(model, optimizer) else: initialize(model)``: the other arm trains
    nothing, so no GradScaler is missing there; planned as before, the arm keeping a marker where
    the call stood (apex cast `gen` from there on)."""
    setup = ("if args.train:\n    [gen, dis], [opt_g, opt_d] = amp.initialize([gen, dis], [opt_g, opt_d], opt_level='O1')\n"
             "else:\n    gen = amp.initialize(gen, opt_level='O1')")
    result = migrate_source(GAN.format(setup=textwrap.indent(setup, " " * 8)), filename="train.py", unsafe_fixes=True)
    code = "\n".join(line for line in result.new_source.splitlines() if not line.lstrip().startswith("#"))
    assert "amp." not in code.replace("torch.amp.", ""), result.new_source
    lines = result.new_source.splitlines()
    arm = next(i for i, line in enumerate(lines) if line.strip() == "else:")
    marker = " ".join(line.strip(" #") for line in lines[arm + 1:arm + 4])
    assert "TODO(ampmigrate): run `gen` under torch.autocast" in marker and lines[arm + 3].strip() == "pass", result.new_source
