"""``convert_syncbn_model`` where the optimizer was made before the conversion and handed in: a
parameter of the converting function (``def wrap(model, optimizer)``), or, where that function
converts the model it is handed, a parameter of its caller or an optimizer the caller made before
the call (``set_up(self, model, optimizer)`` running ``self.to_sync(model)``, zengyan-97/X2-VLM's
accelerator, fresh80). Under apex the optimizer held the old BatchNorm parameters and never updated
the converted layers' new ones; torch's conversion keeps the old ones, which it updates: the
rewrite trains differently, so it is unsafe there, with its marker. It was called safe."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn

from migrate.api import migrate_source

pytestmark = pytest.mark.filterwarnings("ignore::ampshim.deprecation.DeprecatedFeatureWarning")

HEADER = "import torch\nimport apex\nfrom apex import parallel\nfrom apex.parallel import convert_syncbn_model\n\n\n"
CONVERSIONS = ["convert_syncbn_model(model)", "apex.parallel.convert_syncbn_model(model)",
               "parallel.convert_syncbn_model(model, process_group=None)"]
OWN_PARAMETERS = {  # the converting function's signature, with an optimizer handed in
    "positional": "model, optimizer, args",
    "annotated": "model: torch.nn.Module, optimizer: torch.optim.Optimizer",
    "keyword_only": "model, *, g_optim=None",
    "plural": "model, optimizers",
}
NOT_OPTIMIZERS = {  # parameters naming an optimizer's settings, not one
    "name": "model, optimizer_name: str = 'sgd'",
    "config": "model, optim_cfg",
    "string": "model, optimizer: str = 'adam'",
    "none": "model, args",
}


def _own(signature: str, conversion: str) -> str:
    return HEADER + f"def wrap({signature}):\n    model = {conversion}\n    return model\n"


CALLERS = {  # how a function converting the model it is handed is reached, with an optimizer before it
    "method_parameter": ("class Runner:\n    def set_up(self, model, optimizer, rank):\n        model = self.to_sync(model)\n"
                         "        return model, optimizer\n\n    def to_sync(self, model):\n        model = {conversion}\n"
                         "        return model\n"),
    "function_parameter": ("def to_sync(model):\n    return {conversion}\n\n\ndef set_up(model, optimizer):\n"
                           "    return to_sync(model), optimizer\n"),
    "made_before": ("def to_sync(net):\n    net = {conversion_net}\n    return net\n\n\ndef main(model):\n"
                    "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    model = to_sync(model)\n"
                    "    return model, optimizer\n"),
}
CALLERS_SAFE = {
    "made_after": ("def to_sync(model):\n    return {conversion}\n\n\ndef main(model):\n    model = to_sync(model)\n"
                   "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    return model, optimizer\n"),
    "own_model": ("def build():\n    model = torch.nn.BatchNorm1d(3)\n    model = {conversion}\n    return model\n\n\n"
                  "def set_up(optimizer):\n    return build(), optimizer\n"),
}


def _amp011(source: str):
    result = migrate_source(source, filename="train.py")
    return next(d for d in result.diagnostics if d.code == "AMP011"), result


@pytest.mark.parametrize(("signature", "conversion"), list(itertools.product(OWN_PARAMETERS, CONVERSIONS)))
def test_an_optimizer_handed_to_the_converting_function(signature, conversion):
    found, result = _amp011(_own(OWN_PARAMETERS[signature], conversion))
    assert not found.applied and "convert_syncbn_model" in result.new_source
    assert "handed to `wrap` was made before the conversion" in found.fix.why_unsafe


@pytest.mark.parametrize(("signature", "conversion"), list(itertools.product(NOT_OPTIMIZERS, CONVERSIONS)))
def test_settings_of_an_optimizer_are_no_optimizer(signature, conversion):
    found, result = _amp011(_own(NOT_OPTIMIZERS[signature], conversion))
    assert found.applied and "torch.nn.SyncBatchNorm.convert_sync_batchnorm(" in result.new_source


def _caller_script(shape: str, conversion: str) -> str:
    template = {**CALLERS, **CALLERS_SAFE}[shape]
    return HEADER + template.format(conversion=conversion, conversion_net=conversion.replace("(model", "(net"))


@pytest.mark.parametrize(("shape", "conversion"), list(itertools.product(CALLERS, CONVERSIONS)))
def test_an_optimizer_before_the_call_of_the_converting_function(shape, conversion):
    found, result = _amp011(_caller_script(shape, conversion))
    assert not found.applied and "convert_syncbn_model" in result.new_source
    assert "converts the model through `to_sync`" in found.fix.why_unsafe


@pytest.mark.parametrize(("shape", "conversion"), list(itertools.product(CALLERS_SAFE, CONVERSIONS)))
def test_no_optimizer_before_the_call_keeps_it_safe(shape, conversion):
    found, result = _amp011(_caller_script(shape, conversion))
    assert found.applied and "torch.nn.SyncBatchNorm.convert_sync_batchnorm(" in result.new_source


def _trained_weight(source: str, shape: str) -> torch.Tensor:
    """Run the script's own functions: convert through them, then one step of the optimizer made first."""
    namespace: dict = {}
    exec(compile(source, "train.py", "exec"), namespace)  # noqa: S102 - the test's own script
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    if shape == "method_parameter":
        model, optimizer = namespace["Runner"]().set_up(model, optimizer, 0)
    else:
        model, optimizer = namespace["set_up"](model, optimizer)
    model.eval()  # one process: no statistics to synchronise
    model(torch.randn(8, 4)).pow(2).sum().backward()
    optimizer.step()
    return model[1].weight.detach().clone()


@pytest.mark.parametrize("shape", ["method_parameter", "function_parameter"])
def test_the_rewrite_trains_differently_there(shape):
    """Run with ampshim serving apex: apex's new parameters stay untrained, torch's kept ones train."""
    source = _caller_script(shape, CONVERSIONS[0])
    rewritten = migrate_source(source, filename="train.py", unsafe_fixes=True).new_source
    assert "TODO(ampmigrate)" in rewritten
    untouched, trained = _trained_weight(source, shape), _trained_weight(rewritten, shape)
    assert torch.equal(untouched, torch.ones(3)) and not torch.equal(trained, torch.ones(3))
