"""Two shapes the 1,000-script bench (seed 4200) found, each written every way it can be:

- A warm-up arm that ends the iteration (``if step < warm: loss.backward(); opt.step(); continue``)
  never runs with the ``scaler.step`` after it: AMP109 reports nothing there, and a fixing run does
  not scale the warm-up's backward (apex stepped it plainly).
- Where every ``opt.step()`` of the file goes through the scaler (the step is not next to
  ``amp.scale_loss``) and the scaler was handed to what may be None (``self.amp = scaler if
  use_amp else None``), the backward pass where it is None stays plain and the steps and the
  ``unscale_`` ask whether it is there, as the scaled backward did: on the float32 run they
  called methods of None.
"""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source
from migrate.engine import run_rules
from migrate.rules import all_rules

from generated.apex_scripts import Features
from generated.judge import judge

_AMP109 = [rule for rule in all_rules() if rule.CODE == "AMP109"]

# how the warm-up arm ends the iteration ("" : it does not, and the report is right)
ENDINGS = {"continue": "continue", "return": "return losses", "break": "break", "none": "pass"}
# how the scaled pass reaches its backward: through a base class's helper the lint does not enter, or inline
SCALED = {"inherited_helper": "self.apply_backward(self.scaler.scale(loss))",
          "inline": "self.scaler.scale(loss).backward()"}
WARM_TESTS = ["step < 2", "self.warming_up(step)", "not self.started"]


def _native_trainer(ending: str, scaled: str, warm_test: str) -> str:
    return (
        "import torch\n"
        "from base import BaseTrainer\n\n\n"
        "class Trainer(BaseTrainer):\n"
        "    def train(self, batches):\n"
        "        losses = []\n"
        "        for step, (x, y) in enumerate(batches):\n"
        '            with torch.autocast("cuda"):\n'
        "                loss = self.loss(x, y)\n"
        f"            if {warm_test}:\n"
        "                loss.backward()\n"
        "                self.optimizer.step()\n"
        "                self.optimizer.zero_grad()\n"
        f"                {ENDINGS[ending]}\n"
        f"            {SCALED[scaled]}\n"
        "            self.scaler.step(self.optimizer)\n"
        "            self.scaler.update()\n"
        "            self.optimizer.zero_grad()\n"
        "            losses.append(loss.detach())\n"
        "        return losses\n"
    )


@pytest.mark.parametrize("ending, scaled, warm_test",
                         list(itertools.product(ENDINGS, SCALED, WARM_TESTS)))
def test_a_warm_up_arm_that_ends_the_iteration_is_not_before_the_scaler_step(ending, scaled, warm_test):
    result = run_rules(_native_trainer(ending, scaled, warm_test), "train.py", _AMP109)
    assert result.error is None, result.error
    reported = [d.location.row for d in result.diagnostics]
    if ending == "none" and scaled == "inherited_helper":
        assert reported == [12]  # the warm-up's backward runs on to `scaler.step`, and no scaled pass is seen
    else:
        assert reported == []


def _apex_trainer(alias_test: str, plain_arm: str, inner_exit: str) -> str:
    """A trainer whose step sits after an inner loop of micro-batches the planner cannot follow
    (``inner_exit`` leaves the function from inside it), so every step goes through the scaler."""
    i = " " * 16  # the inner loop's body
    scaled = f"{i}    with self.amp.scale_loss(loss, self.opt) as scaled_loss:\n{i}        scaled_loss.backward()\n"
    plain = f"{i}    loss.backward()\n"
    if plain_arm == "else":
        backward = f"{i}if {alias_test}:\n{scaled}{i}else:\n{plain}"
    else:  # the plain pass first, under the opposite test
        negated = {"self.amp is not None": "self.amp is None", "self.amp": "not self.amp"}[alias_test]
        backward = f"{i}if {negated}:\n{plain}{i}else:\n{scaled}"
    return (
        "import argparse\n\n"
        "import torch\n"
        "import torch.nn as nn\n"
        "import torch.nn.functional as F\n"
        "from apex import amp\n\n\n"
        "class Trainer:\n"
        "    def __init__(self, net, opt, use_amp):\n"
        "        self.net, self.opt = net, opt\n"
        "        if use_amp:\n"
        '            self.net, self.opt = amp.initialize(self.net, self.opt, opt_level="O1", verbosity=0)\n'
        "        self.amp = amp if use_amp else None\n\n"
        "    def train(self, batches):\n"
        "        losses = []\n"
        "        for x, y in batches * 3:\n"
        "            for xs, ys in zip(x.chunk(2), y.chunk(2)):\n"
        f"                if {inner_exit}:\n"
        "                    return losses\n"
        "                loss = F.mse_loss(self.net(xs), ys) / 2\n"
        f"{backward}"
        "            torch.nn.utils.clip_grad_norm_(self.net.parameters(), 0.5)\n"
        "            self.opt.step()\n"
        "            self.opt.zero_grad()\n"
        "            losses.append(float(loss))\n"
        "        return losses\n\n\n"
        "def main():\n"
        "    parser = argparse.ArgumentParser()\n"
        '    parser.add_argument("--no-fp16", dest="fp16", action="store_false")\n'
        "    args = parser.parse_args()\n"
        "    torch.manual_seed(0)\n"
        "    net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)).cuda()\n"
        "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        '    data = torch.randn(64, 16, device="cuda")\n'
        "    target = data[:, :1].sin() * 3\n"
        "    batches = [(data[i:i + 16], target[i:i + 16]) for i in range(0, 64, 16)]\n"
        "    print(Trainer(net, opt, args.fp16).train(batches)[-1])\n\n\n"
        'if __name__ == "__main__":\n'
        "    main()\n"
    )


ALIAS_TESTS = ["self.amp is not None", "self.amp"]
PLAIN_ARMS = ["else", "first"]
INNER_EXITS = ["xs.numel() == 0", "not len(xs)"]


@pytest.mark.parametrize("alias_test, plain_arm, inner_exit",
                         list(itertools.product(ALIAS_TESTS, PLAIN_ARMS, INNER_EXITS)))
def test_steps_through_a_scaler_that_may_be_none_ask_for_it(alias_test, plain_arm, inner_exit):
    source = _apex_trainer(alias_test, plain_arm, inner_exit)
    compile(source, "train.py", "exec")
    rewritten = migrate_source(source, filename="train.py", unsafe_fixes=True).new_source
    compile(rewritten, "train.py", "exec")
    # the pass where `self.amp` is None stays plain; the other is the scaled one
    assert rewritten.count("    loss.backward()") == 1 and rewritten.count("self.amp.scale(loss).backward()") == 1, rewritten
    lines = rewritten.splitlines()
    for call in ("self.amp.unscale_(self.opt)", "self.amp.step(self.opt)"):
        at = next(i for i, line in enumerate(lines) if line.strip() == call)
        guard = lines[at - 1].strip()
        assert guard.startswith("if ") and "self.amp is not None" in guard, (call, rewritten)


@pytest.mark.slow
@pytest.mark.parametrize("alias_test, plain_arm", list(itertools.product(ALIAS_TESTS, PLAIN_ARMS)))
def test_steps_through_a_scaler_that_may_be_none_train_the_same(alias_test, plain_arm, tmp_path):
    from ampshim.compare import SAME, Target, compare

    original = tmp_path / "original.py"
    original.write_text(_apex_trainer(alias_test, plain_arm, "xs.numel() == 0"))
    rewritten = tmp_path / "rewritten.py"
    rewritten.write_text(migrate_source(original.read_text(), filename="train.py", unsafe_fixes=True).new_source)
    for args in ([], ["--no-fp16"]):
        comparison = compare(Target(str(original)), Target(str(rewritten)), args, device="cpu", steps=20, timeout=240)
        assert comparison.verdict == SAME, (args, comparison)


# the bench's scripts, by their generator labels: a warm-up arm before a trainer's delayed-unscale
# accumulation through `self.amp`; alternating micro-batch and whole-batch passes with a helper
# defined in the inner loop and `self.amp` None when off
BENCH_SHAPES = {
    "warm_up": ((
        "loss=method, loop=enumerate, accumulation=delay_unscale, boundary=plus_one, clip=master_params, "
        "clip_at=boundary, flag=none, import_guard=False, inner_fp32=False, holder=method, "
        "amp_via=attribute, optimizers=one, checkpoint=True, early_continue=True, register_half=False, "
        "finite_guard=False, overflow=True, between=parameter_loop, warmup=True, backward_in=scaled_method, "
        "flag_copy=False, flag_via=value, loop_in=main, initialize_always=False, alternate=False, "
        "half_evaluation=False, trainer_init=base, clip_in=loop, grads_in=local, import_in=function, "
        "level_in_block=True, delay_spelling=local, forward_via=model, scale_bounds=cap, nan_skip=False, "
        "clip_or_norm=False, entry=main, memory=after, native_beside=False, after_step=none, "
        "methods_in=base, amp_setup=method, penalty=keywords, own_tests=none, local_helper=none, "
        "own_autocast=none"
    ), ("net", "optimizer", "train_loss")),
    "none_alias": ((
        "loss=arms, loop=enumerate, accumulation=inner_loop, boundary=minus_one, clip=master_params, "
        "clip_at=boundary, flag=on, import_guard=True, inner_fp32=True, holder=method, amp_via=attribute, "
        "optimizers=one, checkpoint=True, early_continue=True, register_half=True, finite_guard=False, "
        "overflow=False, between=parameter_loop, warmup=False, backward_in=scaled_method, flag_copy=True, "
        "flag_via=value, loop_in=main, initialize_always=False, alternate=True, half_evaluation=False, "
        "trainer_init=none, clip_in=loop, grads_in=local, import_in=module, level_in_block=True, "
        "delay_spelling=not_flag, forward_via=model, scale_bounds=none, nan_skip=False, clip_or_norm=False, "
        "entry=main, memory=before, native_beside=False, after_step=none, methods_in=base, amp_setup=init, "
        "penalty=none, own_tests=none, local_helper=before, own_autocast=none"
    ), ("network", "opt", "train_loss")),
}


def _features(label: str, names: tuple[str, str, str]) -> Features:
    values = dict(part.split("=", 1) for part in label.split(", "))
    return Features(**{key: {"True": True, "False": False}.get(value, value) for key, value in values.items()}, names=names)


@pytest.mark.slow
@pytest.mark.parametrize("shape", BENCH_SHAPES)
def test_the_bench_shapes_train_the_same(shape, tmp_path):
    outcome = judge(_features(*BENCH_SHAPES[shape]), tmp_path)
    assert outcome.safe == "same", outcome.summary
    assert not outcome.unsafe_crash and not outcome.unsafe_unmarked, outcome.summary
