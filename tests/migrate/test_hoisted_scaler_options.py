"""A GradScaler made before ``if use_amp:`` reads an option known at run time only where the flag
holds, as apex read it: ``loss_scale=params['amp']['loss_scale']`` under ``if 'amp' in params:``
ran only with that section there, and a config without it trained in float32. Read before the
``if``, it raised a KeyError (or an AttributeError on ``cfg.amp.loss_scale`` with ``cfg.amp`` None)
on every run without it. Generated over how the config holds the section and how the flag asks
for it; each rewrite runs with the section and without it. An option of the parsed arguments
(``args.loss_scale``) is always there, and read as before.
"""
from __future__ import annotations

import types

import pytest

from migrate.api import migrate_source

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

SCRIPT = """import torch
from apex import amp


def train(cfg, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    use_amp = {flag}
    if use_amp:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1", loss_scale={scale})
    for _ in range(steps):
        loss = model(torch.randn(2, 4)).sum()
        optimizer.zero_grad()
        if use_amp:
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
        else:
            loss.backward()
        optimizer.step()
    return model
"""
# how the config holds the amp section: the flag's test, the option, and the config with and without it
CONFIGS = {
    "dict": ('"amp" in cfg', 'cfg["amp"]["loss_scale"]', lambda scale: {"amp": {"loss_scale": scale}}, lambda: {}),
    "two conditions": ('not cfg.get("kernel") and "amp" in cfg', 'cfg["amp"]["loss_scale"]', lambda scale: {"amp": {"loss_scale": scale}},
                       lambda: {}),
    "namespace": ("cfg.amp is not None", "cfg.amp.loss_scale",
                  lambda scale: types.SimpleNamespace(amp=types.SimpleNamespace(loss_scale=scale)),
                  lambda: types.SimpleNamespace(amp=None)),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("scale", ["dynamic", 128.0])
def test_the_option_is_read_where_the_flag_holds(config, scale):
    flag, option, with_amp, without = CONFIGS[config]
    result = migrate_source(SCRIPT.format(flag=flag, scale=option), filename="train.py")
    assert "amp.initialize" not in result.new_source and "GradScaler(" in result.new_source, result.new_source
    flat = " ".join(result.new_source.split())
    assert ") if use_amp else 2.0**16," in flat or ") if bool(use_amp) else 2.0**16," in flat, result.new_source
    namespace: dict = {}
    exec(compile(result.new_source, "train.py", "exec"), namespace)
    namespace["train"](without())  # no amp section: it trains in float32, as it did
    namespace["train"](with_amp(scale))  # with it (on the CPU the GradScaler("cuda") is off)


@pytest.mark.parametrize("scale", ["128.0", "cfg.loss_scale"])
def test_a_constant_or_an_option_always_there_stays_as_it_was(scale):
    """A number, or an option of the parsed arguments (``args.loss_scale``), is there whatever the flag."""
    result = migrate_source(SCRIPT.format(flag="cfg.use_amp", scale=scale), filename="train.py")
    assert "GradScaler(" in result.new_source and "else 2.0**16" not in result.new_source, result.new_source
