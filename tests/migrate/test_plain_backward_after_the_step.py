"""A plain backward pass after the scaled optimizer's step (a second loss stepped by an optimizer of
its own, as a stop-token net is): its gradients are left as apex left them, as long as a
``zero_grad()`` clears them on every way to the scaled optimizer's next step. Then the safe rewrite
migrates the file; where some way keeps them (no clear, a clear under a test, the plain pass before
the step, the clear before the plain pass only), the rewrite stays unsafe.

Whether the safe rewrite trains the same is run by the generator (``Features.after_step``)."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

from generated.apex_scripts import Features
from generated.judge import judge

# how the iteration's gradients are cleared, at its top: the scaled optimizer, the initialized model
CLEARS = ["{opt}.zero_grad()", "{model}.zero_grad()", "{opt}.zero_grad(set_to_none=True)"]
# where the second loss is stepped apart, after the scaled optimizer's step
APART = {
    "line": ["aux.backward()", "{aux}.step()"],
    "flagged": ["if cfg.separate:", "    aux.backward()", "    {aux}.step()"],
    "else": ["if not cfg.separate:", "    pass", "else:", "    aux.backward()", "    {aux}.step()"],
}
LOOPS = {
    "for": ("for x, y in loader:", []),
    "enumerate": ("for i, (x, y) in enumerate(loader):", []),
    "while": ("while batches:", ["x, y = batches.pop()"]),
}
NAMES = [("model", "optimizer", "stop_optimizer"), ("net", "opt", "opt_aux")]


def _script(clear: str | None, apart: str, loop: str, names: tuple[str, str, str], *, late_clear: str | None = None) -> str:
    model, opt, aux = names
    head, first = LOOPS[loop]
    body = [*first, *([clear.format(opt=opt, model=model)] if clear else []),
            f"out = {model}(x)", "loss = (out - y).pow(2).mean()", "aux = out.detach().abs().mean() * stop_weight",
            f"with amp.scale_loss(loss, {opt}) as scaled_loss:", "    scaled_loss.backward()",
            f"{opt}.step()", *(f.format(aux=aux) for f in APART[apart]),
            *([late_clear.format(opt=opt, model=model)] if late_clear else [])]
    lines = ["import torch", "from apex import amp", "", "", f"def train({model}, {opt}, {aux}, loader, batches, cfg):",
             "    stop_weight = torch.ones((), requires_grad=True)",
             f"    {model}, {opt} = amp.initialize({model}, {opt}, opt_level=\"O1\")",
             f"    {head}", *("        " + line for line in body)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("clear", "apart", "loop", "names"), list(itertools.product(CLEARS, APART, LOOPS, NAMES)))
def test_cleared_at_the_top_of_each_iteration_the_plain_pass_is_migrated(clear, apart, loop, names):
    result = migrate_source(_script(clear, apart, loop, names), "train.py")
    assert result.error is None, result.error
    assert "amp.scale_loss" not in result.new_source, result.new_source
    assert "    aux.backward()" in result.new_source  # left plain, as apex left it
    assert f"scaler.step({names[1]})" in result.new_source


@pytest.mark.parametrize(("apart", "loop"), list(itertools.product(APART, LOOPS)))
def test_cleared_after_the_plain_pass_counts_too(apart, loop):
    names = NAMES[0]
    result = migrate_source(_script(None, apart, loop, names, late_clear="{opt}.zero_grad()"), "train.py")
    assert "amp.scale_loss" not in result.new_source, result.new_source


KEPT = {
    "no clear": dict(clear=None),
    "the clear before the plain pass only": dict(clear=None, late_clear=None, before_plain=True),
    "a clear under a test": dict(clear="if cfg.clear:\n            {opt}.zero_grad()"),
    "another optimizer cleared": dict(clear="cfg.other_optimizer.zero_grad()"),
}


@pytest.mark.parametrize("case", list(KEPT))
@pytest.mark.parametrize("apart", list(APART))
def test_where_a_way_keeps_its_gradients_the_rewrite_stays_unsafe(case, apart):
    options = dict(KEPT[case])
    names = NAMES[0]
    source = _script(options.get("clear"), apart, "for", names)
    if options.get("before_plain"):  # cleared right after the scaled step, before the plain pass adds
        source = source.replace(f"        {names[1]}.step()\n", f"        {names[1]}.step()\n        {names[1]}.zero_grad()\n")
    source = source.replace("{aux}", names[2])
    safe = migrate_source(source, "train.py")
    assert safe.new_source == source  # left, with its reason
    unsafe = migrate_source(source, "train.py", unsafe_fixes=True)
    # the marker, in the rewritten file whose lines moved, names the pass by its code
    assert "TODO(ampmigrate)" in unsafe.new_source and "the plain backward pass `aux.backward()`" in " ".join(
        line.strip("# ") for line in unsafe.new_source.splitlines()), unsafe.new_source


def test_a_plain_pass_between_the_scaled_backward_and_the_step_stays_unsafe():
    source = _script("{opt}.zero_grad()", "line", "for", NAMES[0]).replace(
        "        optimizer.step()\n        aux.backward()\n", "        aux.backward()\n        optimizer.step()\n")
    assert "aux.backward()\n        optimizer.step()" in source
    assert migrate_source(source, "train.py").new_source == source


def test_a_plain_pass_in_a_step_function_cleared_at_its_start_is_migrated():
    source = ("import torch\nfrom apex import amp\n\n\nclass Trainer:\n"
              "    def __init__(self, model, opt, stop_opt):\n"
              "        self.model, self.opt = amp.initialize(model, opt, opt_level=\"O1\")\n"
              "        self.stop_opt = stop_opt\n\n"
              "    def train_step(self, x, y):\n"
              "        self.opt.zero_grad()\n"
              "        out = self.model(x)\n"
              "        loss = (out - y).pow(2).mean()\n"
              "        stop = out.detach().sum() * self.model.stop.weight.sum()\n"
              "        with amp.scale_loss(loss, self.opt) as scaled_loss:\n"
              "            scaled_loss.backward()\n"
              "        self.opt.step()\n"
              "        stop.backward()\n"
              "        self.stop_opt.step()\n"
              "        self.stop_opt.zero_grad()\n")
    result = migrate_source(source, "train.py")
    assert "amp.scale_loss" not in result.new_source, result.new_source
    unclear = source.replace("        self.opt.zero_grad()\n        out", "        out")
    assert migrate_source(unclear, "train.py").new_source == unclear


@pytest.mark.slow
@pytest.mark.parametrize(("after_step", "accumulation", "flag"),
                         [("cleared", "none", "none"), ("cleared", "none", "off"), ("stale", "none", "none"), ("stale", "plain", "on")])
def test_generated_scripts_with_a_loss_stepped_apart_train_the_same(tmp_path, after_step, accumulation, flag):
    drawn = Features(loss="inline", loop="range", accumulation=accumulation, boundary="plus_one", clip="parameters",
                     clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False, names=("net", "opt", "loss"),
                     after_step=after_step)
    outcome = judge(drawn, tmp_path)
    assert not (outcome.safe_wrong or outcome.unsafe_crash or outcome.unsafe_unmarked), outcome.reports
    assert (outcome.safe == "same") == (after_step == "cleared"), outcome.summary
