"""AMP109 on a plain backward pass where a flag fails (``else:`` of ``if use_amp:``), before a
``scaler.step`` in the body of a conjunction holding that flag (``if scaler is not None and
use_amp:``): the two never run in one pass, so nothing is reported and a fixing run leaves the
plain backward plain. (A fixing run wrote such steps itself, then scaled the plain backward through
a scaler that, made under the flag, does not exist where it runs.)"""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source
from migrate.engine import run_rules
from migrate.rules import all_rules

from generated.apex_scripts import Features
from generated.judge import judge

_AMP109 = [rule for rule in all_rules() if rule.CODE == "AMP109"]

FLAGS = ["self.use_amp", "self.cfg.fp16"]
# the plain backward's arm, where `{flag}` fails (the scaled pass is the code's concern elsewhere)
SCALED = "self.log.append(loss)"
PLAIN_ARMS = {
    "else": "if {flag}:\n                " + SCALED + "\n            else:\n                loss.backward()",
    "not": "if not {flag}:\n                loss.backward()",
}
# the step's test, holding `{flag}` and that the scaler is there
STEP_TESTS = ['(getattr(self, "scaler", None) is not None) and {flag}', '{flag} and hasattr(self, "scaler")',
              "self.scaler is not None and {flag} and self.step_count >= 0"]


def _trainer(flag: str, plain: str, step_test: str) -> str:
    return (
        "import torch\n\n\n"
        "class Trainer:\n"
        "    def __init__(self, model, opt, use_amp, cfg):\n"
        "        self.model, self.opt, self.use_amp, self.cfg = model, opt, use_amp, cfg\n"
        "        self.step_count = 0\n"
        f"        if {flag}:\n"
        '            self.scaler = torch.amp.GradScaler("cuda")\n\n'
        "    def fit(self, loader):\n"
        "        for x in loader:\n"
        f'            with torch.autocast("cuda", enabled={flag}):\n'
        "                loss = self.model(x).sum()\n"
        f"            {PLAIN_ARMS[plain].format(flag=flag)}\n"
        f"            if {step_test.format(flag=flag)}:\n"
        "                self.scaler.step(self.opt)\n"
        "                self.scaler.update()\n"
        "            else:\n"
        "                self.opt.step()\n"
        "            self.opt.zero_grad()\n"
    )


def _amp109(source: str) -> list[int]:
    result = run_rules(source, "train.py", _AMP109)
    assert result.error is None, result.error
    return [d.location.row for d in result.diagnostics]


@pytest.mark.parametrize(("flag", "plain", "step_test"), list(itertools.product(FLAGS, PLAIN_ARMS, STEP_TESTS)))
def test_a_plain_backward_where_the_flag_fails_is_apart_from_the_scaled_step(flag, plain, step_test):
    source = _trainer(flag, plain, step_test)
    assert _amp109(source) == []
    fixed = migrate_source(source, "train.py", unsafe_fixes=True)
    assert (fixed.new_source or source).count("                loss.backward()") == 1, fixed.new_source


@pytest.mark.parametrize("plain", list(PLAIN_ARMS))
def test_a_step_under_another_flag_still_follows_the_plain_backward(plain):
    """``if scaler is not None and warm:``: ``warm`` says nothing of ``use_amp``, the plain
    backward may reach the scaled step."""
    source = _trainer("self.use_amp", plain, '(getattr(self, "scaler", None) is not None) and self.warm')
    assert len(_amp109(source)) == 1


def test_a_name_bound_to_the_scaled_loss_handed_to_a_method_is_scaled_there():
    """``scaled = scaler.scale(loss)``, then ``self.apply_backward(scaled)``: the method's
    ``scaled.backward()`` is the scaled backward pass, not a plain one before ``scaler.step``."""
    source = (
        "import torch\n\n\n"
        "class Trainer:\n"
        "    def __init__(self, model, opt):\n"
        "        self.model, self.opt = model, opt\n"
        '        self.grad_scaler = torch.amp.GradScaler("cuda")\n\n'
        "    def fit(self, loader):\n"
        "        for x in loader:\n"
        '            with torch.autocast("cuda"):\n'
        "                loss = self.model(x).sum()\n"
        "            scaled_loss = self.grad_scaler.scale(loss)\n"
        "            self.apply_backward(scaled_loss)\n"
        "            self.grad_scaler.step(self.opt)\n"
        "            self.grad_scaler.update()\n\n"
        "    def apply_backward(self, scaled):\n"
        "        scaled.backward()\n"
    )
    assert _amp109(source) == []
    assert len(_amp109(source.replace("self.apply_backward(scaled_loss)", "self.apply_backward(loss)"))) == 1


@pytest.mark.slow
def test_a_scaled_method_and_a_scaler_made_in_the_flags_block(tmp_path):
    """The generated shape where this was found: the trainer's plain backward in the flag's
    ``else:``, its steps in a loop over two optimizers under the rewrite's own test."""
    drawn = Features(loss="inline", loop="range", accumulation="plain", boundary="minus_one", clip="parameters",
                     clip_at="boundary", flag="on", import_guard=False, inner_fp32=False,
                     names=("network", "optims", "train_loss"), holder="method", optimizers="two",
                     between="parameter_loop", backward_in="scaled_method", trainer_init="none", clip_in="helper",
                     grads_in="attribute", import_in="global_first", level_in_block=True)
    outcome = judge(drawn, tmp_path)
    assert not outcome.unsafe_crash and not outcome.safe_wrong and not outcome.unsafe_unmarked, outcome.summary
