"""``if flag: <amp.scale_loss of loss> else: loss.backward()``, where the rewrite's scaler is off
whenever the flag fails: the plain arm is the scaled line, since a disabled GradScaler's
``scale`` hands the loss back, so the ``if``/``else`` is written as ``scaler.scale(loss).backward()``
alone, as a person writing native torch.amp would. The flag spelled as a local, an argument's
attribute, a trainer's attribute or the options a trainer keeps; the arms in either order. It
stays an ``if`` where the test may read differently each time, where a comment sits on it, where
the plain arm does more than the backward pass or passes it arguments, and where the flag is not
the one the scaler is made from.
"""
from __future__ import annotations

import itertools

import pytest

from generated.apex_scripts import Features
from generated.judge import judge
from migrate.api import migrate_source

# (initialize's test, the backward's test, the trainer's own lines or "" for a function)
FLAGS = {
    "local": ("use_amp", "use_amp", ""),
    "argument": ("args.fp16", "args.fp16", ""),
    "attribute": ("use_amp", "self.use_amp", "self.use_amp = use_amp"),
    "options": ("opt.fp16", "self.opt.fp16", "self.opt = opt"),
}
ORDERS = {
    "scaled_first": "if {flag}:\n{scaled}else:\n    {loss}.backward()\n",
    "plain_first": "if not {flag}:\n    {loss}.backward()\nelse:\n{scaled}",
}
LOSSES = ["loss", "self.loss_g"]


def _script(flag: str, order: str, loss: str, tweak=lambda arms: arms) -> str:
    init_test, test, keep = FLAGS[flag]
    scaled = f"    with amp.scale_loss({loss}, optimizer) as scaled_loss:\n        scaled_loss.backward()\n"
    arms = tweak(ORDERS[order].format(flag=test, scaled=scaled, loss=loss))
    if keep:  # a trainer: initialize in __init__, the loop in a method
        parameter = "opt" if flag == "options" else "use_amp"
        body = "\n".join("            " + line if line else line for line in arms.splitlines())
        return ("import torch\nfrom apex import amp\n\n\nclass Trainer:\n"
                f"    def __init__(self, model, optimizer, {parameter}):\n"
                f"        {keep}\n        self.model = model\n"
                f"        if {init_test}:\n"
                "            self.model, self.optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n"
                "        else:\n            self.optimizer = optimizer\n\n"
                "    def fit(self, loader):\n        optimizer = self.optimizer\n        for x in loader:\n"
                f"            {loss} = self.model(x).sum()\n{body}\n"
                "            optimizer.step()\n            optimizer.zero_grad()\n")
    owner = "args, " if flag == "argument" else ""
    flag_param = ", use_amp" if flag == "local" else ""
    body = "\n".join("        " + line if line else line for line in arms.splitlines())
    loss = "loss"
    return ("import torch\nfrom apex import amp\n\n\n"
            f"def train({owner}model, optimizer, loader{flag_param}):\n"
            f"    if {init_test}:\n"
            "        model, optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n"
            "    for x in loader:\n"
            f"        {loss} = model(x).sum()\n{body}\n"
            "        optimizer.step()\n        optimizer.zero_grad()\n")


def _rewrite(source: str) -> str:
    result = migrate_source(source, "train.py")
    assert result.error is None and "amp.initialize" not in result.new_source, result.new_source
    assert "TODO(ampmigrate)" not in result.new_source, result.new_source
    return result.new_source


def _loss_of(flag: str, loss: str) -> str:
    return loss if FLAGS[flag][2] else "loss"


@pytest.mark.parametrize(("flag", "order", "loss"), [
    (flag, order, loss) for flag, order, loss in itertools.product(FLAGS, ORDERS, LOSSES)
    if loss == "loss" or FLAGS[flag][2]])
def test_the_arms_are_the_scaled_line(flag, order, loss):
    output = _rewrite(_script(flag, order, loss))
    loss = _loss_of(flag, loss)
    lines = [line.strip() for line in output.splitlines()]
    scaled = next(line for line in lines if line.endswith(f".scale({loss}).backward()"))
    at = lines.index(scaled)
    assert lines[at - 1] not in ("else:",) and not lines[at - 1].startswith("if "), output
    assert lines[at + 1].endswith(".step(optimizer)"), output
    assert f"{loss}.backward()" not in lines and "else:" not in lines[at - 2:at + 2], output


@pytest.mark.parametrize("flag", ["argument", "options"])
@pytest.mark.parametrize(("case", "tweak"), [
    ("comment on the if", lambda arms: arms.replace(":\n", ":  # mixed precision\n", 1)),
    ("comment on the else", lambda arms: arms.replace("else:\n", "else:  # fp32\n")),
    ("plain arm does more", lambda arms: arms.replace("loss.backward()\n", "loss.backward()\n    print('fp32')\n")),
    ("plain backward's arguments", lambda arms: arms.replace("loss.backward()", "loss.backward(retain_graph=True)")),
])
def test_the_if_stays_where_the_arms_differ_or_are_commented(flag, case, tweak):
    output = _rewrite(_script(flag, "scaled_first", "loss", tweak))
    assert "else:" in output, output


def test_a_test_that_calls_something_stays():
    """``if amp_enabled():`` may answer differently each time: both arms are kept."""
    source = _script("argument", "scaled_first", "loss").replace("if args.fp16:\n            with", "if amp_enabled(args):\n            with")
    result = migrate_source(source, "train.py", unsafe_fixes=True)
    assert "if amp_enabled(args):" in result.new_source, result.new_source


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["on", "off"])
def test_the_folded_rewrite_trains_the_same_with_the_flag_either_way(flag, tmp_path):
    """A trainer handed the parsed options, testing ``self.opt.use_amp``: the rewrite folds its
    arms and trains as apex did, the flag on and turned off (``judge`` runs both)."""
    drawn = Features(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="parameters",
                     clip_at="boundary", flag=flag, import_guard=True, inner_fp32=False,
                     names=("model", "optimizer", "loss"), holder="method", flag_via="options", flag_copy=True)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "same" and outcome.safe_complete, outcome.summary + "\n".join(outcome.reports.values())
    rewritten = (tmp_path / "safe.py").read_text()
    assert "            self.scaler.scale(loss).backward()\n            self.scaler.unscale_(" in rewritten, rewritten
