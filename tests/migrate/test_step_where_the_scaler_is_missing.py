"""An optimizer step where the scaler is not there: AMP102 leaves it alone (a backward scaled by a
scaler that does not exist would have raised), however the test for the scaler is spelled; and
the rewrite writes its step's test once, without a test the ``if`` around the step already makes,
so that a fixing run's own output lints clean."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source
from migrate.engine import run_rules
from migrate.rules import all_rules
from migrate.step_model.vocabulary import normalised_test

from generated.apex_scripts import Features, script

_AMP102 = [rule for rule in all_rules() if rule.CODE == "AMP102"]

# `if <test>:` arms that run only where the scaler is there, and those that run only where it is not
PRESENT = ['getattr(self, "scaler", None) is not None', "getattr(self, 'scaler', None)", 'hasattr(self, "scaler")',
           "self.scaler is not None", "self.scaler", 'not getattr(self, "scaler", None) is None']
MISSING = ['getattr(self, "scaler", None) is None', 'not hasattr(self, "scaler")', "self.scaler is None",
           "not self.scaler", 'not getattr(self, "scaler", None)']

# where the scaled backward runs: in the loop, in a helper method, under a flag of its own
BACKWARDS = {
    "inline": ("self.scaler.scale(loss).backward()", ""),
    "method": ("self.backward(loss)", "    def backward(self, loss):\n        self.scaler.scale(loss).backward()\n"),
    "flagged": ("if self.use_amp:\n                self.scaler.scale(loss).backward()\n"
                "            else:\n                loss.backward()", ""),
}


def _trainer(backward: str, test: str, present_first: bool) -> str:
    call, helper = BACKWARDS[backward]
    scaled = "self.scaler.step(self.opt)\n                self.scaler.update()"
    arms = (scaled, "self.opt.step()") if present_first else ("self.opt.step()", scaled)
    return (
        "import torch\n\n\n"
        "class Trainer:\n"
        "    def __init__(self, model, opt, use_amp):\n"
        "        self.model, self.opt, self.use_amp = model, opt, use_amp\n"
        "        if use_amp:\n"
        '            self.scaler = torch.amp.GradScaler("cuda")\n\n'
        "    def fit(self, loader):\n"
        "        for x in loader:\n"
        '            with torch.autocast("cuda", enabled=self.use_amp):\n'
        "                loss = self.model(x).sum()\n"
        f"            {call}\n"
        f"            if {test}:\n"
        f"                {arms[0]}\n"
        "            else:\n"
        f"                {arms[1]}\n"
        "            self.opt.zero_grad()\n\n"
        + helper
    )


def _amp102(source: str) -> list[int]:
    result = run_rules(source, "train.py", _AMP102)
    assert result.error is None, result.error
    return [d.location.row for d in result.diagnostics]


@pytest.mark.parametrize(("backward", "test", "present_first"),
                         [(b, t, True) for b, t in itertools.product(BACKWARDS, PRESENT)]
                         + [(b, t, False) for b, t in itertools.product(BACKWARDS, MISSING)])
def test_a_plain_step_where_the_scaler_is_missing_is_not_reported(backward, test, present_first):
    source = _trainer(backward, test, present_first)
    assert _amp102(source) == [], source


OTHER_TESTS = ["self.use_amp", 'getattr(self, "other", None) is not None', 'hasattr(self, "scaler_state")']


# (not `flagged` with `self.use_amp`: there the plain step is in the arm where nothing was scaled)
@pytest.mark.parametrize(("backward", "test"), [(b, t) for b, t in itertools.product(BACKWARDS, OTHER_TESTS)
                                                if (b, t) != ("flagged", "self.use_amp")])
def test_a_plain_step_beside_another_test_is_still_reported(backward, test):
    """Where the ``if`` tests something else, the plain step may follow a scaled backward."""
    source = _trainer(backward, test, True).replace(f"if {test}:", f"if not ({test}):")
    assert _amp102(source) != [], source


@pytest.mark.parametrize(("test", "flag", "polarity"), [
    ('getattr(self, "scaler", None) is not None', "scaler", True),
    ('hasattr(self, "scaler")', "scaler", True),
    ('getattr(trainer, "scaler", None) is None', "trainer.scaler", False),
    ('not getattr(args, "fp16", None)', "args.fp16", False),
    ('getattr(args, "fp16", False)', 'getattr(args, "fp16", False)', True),  # a default other than None: a value
    ("getattr(self, name, None)", "getattr(self, name, None)", True),  # an attribute named at run time
])
def test_a_test_of_an_attribute_is_read_as_the_attribute(test, flag, polarity):
    import libcst as cst
    assert normalised_test(cst.parse_expression(test)) == (flag, polarity)


# Generated trainers whose scaler is made in a block (`if use_amp: opt_level = "O1"; amp.initialize`)
# and whose step sits in an `if` on what received it, or on the flag.
STEP_IN_AN_ARM = [
    Features(loss="helper", loop="range", accumulation="delay_unscale", boundary="plus_one", clip="parameters",
             clip_at="boundary", flag="on", import_guard=False, inner_fp32=True, names=("net", "optimizer", "train_loss"),
             holder="method", amp_via="attribute", native_beside=True, level_in_block=True),
    Features(loss="inline", loop="range", accumulation="none", boundary="minus_one", clip="parameters",
             clip_at="boundary", flag="on", import_guard=False, inner_fp32=True, names=("model", "optim", "loss"),
             holder="method", backward_in="update", flag_copy=True, level_in_block=True),
    Features(loss="helper", loop="while", accumulation="delay_unscale", boundary="plus_one", clip="parameters",
             clip_at="boundary", flag="off", import_guard=False, inner_fp32=True, names=("model", "optimizer", "loss"),
             holder="handed", native_beside=True, finite_guard=True),
    Features(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="none",
             clip_at="boundary", flag="on", import_guard=False, inner_fp32=False, names=("model", "opt", "loss"),
             amp_via="parameter", native_beside=True),
]


def _if_tests(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if line.strip().startswith("if ")]


@pytest.mark.parametrize("drawn", STEP_IN_AN_ARM, ids=lambda f: f"{f.holder}-{f.amp_via}-{f.flag}")
def test_the_rewritten_step_tests_nothing_twice_and_lints_clean(drawn):
    result = migrate_source(script(drawn), "train.py", unsafe_fixes=True)
    assert result.error is None and result.new_source is not None
    output = result.new_source
    assert _amp102(output) == [], output
    for test in _if_tests(output):  # no `(a) and (a)`, and no test inside an `if` making it already
        parts = [part.strip("() :") for part in test[3:].split(" and ")]
        assert len(parts) == len(set(parts)), test
    lines = output.splitlines()
    for index, line in enumerate(lines):
        inner = line.strip()
        if inner.startswith("if ") and index + 1 < len(lines):
            following = lines[index + 1].strip()
            assert not (following.startswith("if ") and following.rstrip(":").endswith(inner[3:].rstrip(":"))), output
