"""AMP107 where the checkpoint is written by a helper that is handed the scaler's state: the
entry it saves is a parameter, and a call of the file gives it the scaler (or its state), however
the call and the parameter are spelled. Where no call does, the save is still reported."""
from __future__ import annotations

import itertools

import pytest

from migrate.engine import run_rules
from migrate.rules import all_rules

_AMP107 = [rule for rule in all_rules() if rule.CODE == "AMP107"]

# how the helper is written, and how the training code calls it (`{given}`: the argument)
HELPERS = {
    "function": ("def save_checkpoint(model, optimizer, amp_state, path='last.pt'):\n"
                 "    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'amp': amp_state}, path)\n",
                 "save_checkpoint(model, optimizer, {given})", "save_checkpoint(model, optimizer, amp_state={given})"),
    "method": ("class Saver:\n"
               "    def save_checkpoint(self, model, optimizer, amp_state):\n"
               "        torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'amp': amp_state}, 'last.pt')\n",
               "saver.save_checkpoint(model, optimizer, {given})", "saver.save_checkpoint(model, optimizer, amp_state={given})"),
}
GIVEN = ["scaler.state_dict()", "scaler.state_dict() if use_amp else None", "scaler", "{'scaler': scaler.state_dict()}"]
NOT_GIVEN = ["None", "{}", "lr_scheduler.state_dict()"]


def _script(helper: str, form: int, given: str) -> str:
    definition, *calls = HELPERS[helper]
    return (
        "import torch\n\n"
        "scaler = torch.amp.GradScaler('cuda')\n\n"
        + definition + "\n\n"
        "def train(model, optimizer, loader, saver, use_amp, lr_scheduler):\n"
        "    for x in loader:\n"
        "        scaler.scale(model(x)).backward()\n"
        "        scaler.step(optimizer)\n"
        "        scaler.update()\n"
        f"    {calls[form].format(given=given)}\n"
    )


def _amp107(source: str) -> list[int]:
    result = run_rules(source, "train.py", _AMP107)
    assert result.error is None, result.error
    return [d.location.row for d in result.diagnostics]


@pytest.mark.parametrize(("helper", "form", "given"), list(itertools.product(HELPERS, (0, 1), GIVEN)))
def test_a_helper_handed_the_scalers_state_saves_it(helper, form, given):
    source = _script(helper, form, given)
    assert _amp107(source) == [], source


@pytest.mark.parametrize(("helper", "form", "given"), list(itertools.product(HELPERS, (0, 1), NOT_GIVEN)))
def test_a_helper_handed_something_else_is_still_reported(helper, form, given):
    source = _script(helper, form, given)
    assert _amp107(source) != [], source


@pytest.mark.parametrize(("helper", "form"), list(itertools.product(HELPERS, (0, 1))))
@pytest.mark.parametrize(("given", "saved"), [("scaler", True), ("lr_scheduler", False)])
def test_a_helper_saving_the_state_of_what_it_is_handed(helper, form, given, saved):
    """``save_checkpoint(model, optimizer, scaler)`` saving ``{..., "amp": amp.state_dict()}``: the
    parameter (named for apex's module) is the scaler, its state is saved."""
    source = _script(helper, form, given).replace("amp_state}", "amp_state.state_dict()}")
    assert (_amp107(source) == []) == saved, source
