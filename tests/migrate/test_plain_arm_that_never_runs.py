"""A plain backward pass in the arm where a parameter fails (``if not mixed:``, or ``else:`` of
``if mixed:``) that every call of the file leaves at its ``True`` default, and the function never
binds: that arm never runs, so it does not make the rewrite unsafe. Where a call hands the
parameter, the function binds it, or its default is not ``True``, the
arm may run and the rewrite stays unsafe."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source

ARMS = {
    "not": ("    if not mixed:\n        loss.backward()\n        return\n"
            "    with amp.scale_loss(loss, handed) as scaled:\n        scaled.backward()\n"),
    "else": ("    if mixed:\n        with amp.scale_loss(loss, handed) as scaled:\n            scaled.backward()\n"
             "    else:\n        loss.backward()\n"),
}


def _script(arm: str, default: str = "True", call: str = "scaled_backward(loss, opt)", rebinds: bool = False) -> str:
    return ("import torch\nfrom apex import amp\n\n\n"
            f"def scaled_backward(loss, handed, mixed={default}):\n"
            + ("    mixed = mixed and loss.requires_grad\n" if rebinds else "")
            + ARMS[arm] + "\n\n"
            "def train(model, opt, loader):\n"
            "    model, opt = amp.initialize(model, opt, opt_level=\"O1\")\n"
            "    for x in loader:\n"
            "        loss = model(x).sum()\n"
            f"        {call}\n"
            "        opt.step()\n"
            "        opt.zero_grad()\n")


def _safe(source: str) -> bool:
    result = migrate_source(source, "train.py")
    assert result.error is None, result.error
    return result.new_source is not None and "from apex" not in result.new_source


@pytest.mark.parametrize("arm", list(ARMS))
@pytest.mark.parametrize("call", ["scaled_backward(loss, opt)", "scaled_backward(loss, handed=opt)"])
def test_an_arm_no_call_reaches_is_no_reason(arm, call):
    source = _script(arm, call=call)
    assert _safe(source)
    assert "        loss.backward()" in migrate_source(source, "train.py").new_source


@pytest.mark.parametrize("arm", list(ARMS))
@pytest.mark.parametrize("variant", [{"call": "scaled_backward(loss, opt, mixed=False)"}, {"call": "scaled_backward(loss, opt, x is None)"},
                                     {"default": "False"}, {"default": "None"}, {"rebinds": True}])
def test_an_arm_that_may_run_keeps_the_rewrite_unsafe(arm, variant):
    assert not _safe(_script(arm, **variant))

