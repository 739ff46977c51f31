"""The marker left where ``amp.initialize`` goes from a file that scales no loss names the model
that computes: ``model`` for ``model, optimizer = amp.initialize(model.cuda(), optimizer)``, not
the call that moved it."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

ARGUMENTS = ["model.cuda()", "model.to(device)", "model.cuda(local_rank)"]
TARGETS = ["model, optimizer", "(model, optimizer)", "model"]


def _source(argument: str, target: str) -> str:
    optimizers = ", optimizer" if "optimizer" in target else ""
    return ("import torch\nfrom apex import amp\n\n\n"
            "def build(model, optimizer, device, local_rank, use_fp16):\n"
            "    if use_fp16:\n"
            f"        {target} = amp.initialize({argument}{optimizers}, opt_level=\"O1\")\n"
            "    return model, optimizer\n")


@pytest.mark.parametrize(("argument", "target"), list(itertools.product(ARGUMENTS, TARGETS)))
def test_the_marker_names_the_model_that_computes(argument, target):
    new = migrate_source(_source(argument, target), "build.py", unsafe_fixes=True).new_source
    assert "# TODO(ampmigrate): run `model` under torch.autocast(" in new, new
    assert f"run `{argument}`" not in new, new
