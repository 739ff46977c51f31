"""AMP105 where the loop reaches a scaler's creation only through a call whose literal argument
turns the ``if`` around it false: an evaluation inside the training loop calling
``self._wrap_model(model, training=False)``, whose helper makes the scaler under
``if self.use_apex and training:`` (transformers' Trainer, once migrated). That evaluation never
makes a scaler; the rule reports only where some call in the loop can."""
from __future__ import annotations

import itertools

import pytest

from migrate.engine import run_rules
from migrate.rules import all_rules

_RULES = [rule for rule in all_rules() if rule.CODE == "AMP105"]

TRAINER = """\
import torch


class Trainer:
    def wrap(self, model, {param}={default}):
{rebind}        if {test}:
            self.scaler = torch.amp.GradScaler("cuda")
        return model

    def evaluate(self):
        model = self.wrap(self.model{argument})
        return model(self.batch).mean()

    def train(self, loader):
        model = self.wrap(self.model)
        for x in loader:
            with torch.autocast("cuda"):
                loss = model(x)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.step % 100 == 0:
                self.evaluate()
"""
# (parameter, its default, the test, the argument evaluation passes, rebound first?) -> reported?
PARAMS = {"training": ("True", "self.use_amp and {p}", "False"), "evaluating": ("False", "not {p}", "True")}
SPELLINGS = {"keyword": ", {p}={v}", "positional": ", {v}"}


def _case(param, spelling, argument, rebind):
    default, test, falsy = PARAMS[param]
    value = {"literal": falsy, "none": "None" if param == "training" else "1", "variable": "self.flag"}[argument]
    return TRAINER.format(
        param=param, default=default, test=test.format(p=param),
        argument=SPELLINGS[spelling].format(p=param, v=value),
        rebind=f"        {param} = self.flag\n" if rebind else "")


@pytest.mark.parametrize(("param", "spelling", "argument", "rebind"), list(itertools.product(
    sorted(PARAMS), sorted(SPELLINGS), ["literal", "none", "variable"], [False, True])))
def test_a_scaler_the_loops_call_never_makes_is_not_reported(param, spelling, argument, rebind):
    source = _case(param, spelling, argument, rebind)
    reported = [d for d in run_rules(source, "trainer.py", _RULES).diagnostics if d.code == "AMP105"]
    assert bool(reported) == (argument == "variable" or rebind), source


def test_the_default_taken_in_the_loop_still_reports():
    source = TRAINER.format(param="training", default="True", test="self.use_amp and training", argument="", rebind="")
    assert [d.code for d in run_rules(source, "trainer.py", _RULES).diagnostics] == ["AMP105"]
