"""A function that scales a loss for the optimizer it is handed (``def loss_backwards(loss,
optimizer)``), called by training code that then steps what it handed (``loss_backwards(loss,
opt)``, ``opt.step()``): the steps of the callers go through the scaler, the callers' forward
passes go under autocast, and a flag handed to the function (``loss_backwards(loss, opt,
use_amp)``) is read as the flag. Every spelling: the parameter's name, by position or keyword,
a function or a method of the trainer, one caller or two with their own optimizers."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

# the function scaling the loss: (its definition, how it is called with `{loss}`, `{opt}`, `{flag}`)
HELPERS = {
    "positional": ("def loss_backwards(loss, optimizer, fp16):\n"
                   "    if fp16:\n"
                   "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
                   "            scaled_loss.backward()\n"
                   "    else:\n"
                   "        loss.backward()\n",
                   "loss_backwards({loss}, {opt}, {flag})"),
    "keyword": ("def backward_pass(loss, handed, mixed=True):\n"
                "    if not mixed:\n"
                "        loss.backward()\n"
                "        return\n"
                "    with amp.scale_loss(loss, handed) as scaled:\n"
                "        scaled.backward()\n",
                "backward_pass({loss}, handed={opt}, mixed={flag})"),
}

# the training code: a function with locals, or a trainer's method with attributes
TRAINERS = {
    "function": ("def train(model, opt, loader, args):\n"
                 "    if args.fp16:\n"
                 "        model, opt = amp.initialize(model, opt, opt_level=\"O1\")\n"
                 "    for x in loader:\n"
                 "        loss = model(x).sum()\n"
                 "        {call}\n"
                 "        opt.step()\n"
                 "        opt.zero_grad()\n",
                 "opt", "args.fp16"),
    "method": ("class Trainer:\n"
               "    def __init__(self, model, opt, use_amp):\n"
               "        self.use_amp = use_amp\n"
               "        self.model, self.opt = model, opt\n"
               "        if use_amp:\n"
               "            self.model, self.opt = amp.initialize(self.model, self.opt, opt_level=\"O1\")\n"
               "\n"
               "    def fit(self, loader):\n"
               "        for x in loader:\n"
               "            loss = self.model(x).sum()\n"
               "            {call}\n"
               "            self.opt.step()\n"
               "            self.opt.zero_grad()\n",
               "self.opt", "self.use_amp"),
}


def _script(helper: str, trainer: str) -> str:
    definition, call = HELPERS[helper]
    body, opt, flag = TRAINERS[trainer]
    return ("import torch\nfrom apex import amp\n\n\n" + definition + "\n\n"
            + body.format(call=call.format(loss="loss", opt=opt, flag=flag)))


def _migrate(source: str, unsafe_fixes: bool = False):
    result = migrate_source(source, "train.py", unsafe_fixes=unsafe_fixes)
    assert result.error is None, result.error
    return result.new_source or source, result.diagnostics


@pytest.mark.parametrize(("helper", "trainer"), list(itertools.product(HELPERS, TRAINERS)))
def test_the_callers_step_goes_through_the_scaler(helper, trainer):
    output, diagnostics = _migrate(_script(helper, trainer))
    assert_stepped_through_the_scaler(output, diagnostics, TRAINERS[trainer][1])


def assert_stepped_through_the_scaler(output: str, diagnostics, opt: str) -> None:
    """All safe and no apex left: the caller's ``opt`` steps through the scaler, its forward pass
    under autocast, the flag's plain backward kept as written (``plain_backward_kept``)."""
    assert "apex" not in output, output
    assert f"    {opt}.step()" not in output and f"scaler.step({opt})" in output, output
    assert output.count(".update()") == 1 and "TODO(ampmigrate)" not in output, output
    lines = output.splitlines()
    forward = next(i for i, line in enumerate(lines) if "loss = " in line and ".sum()" in line)
    assert any("torch.autocast(" in line for line in lines[forward - 3:forward]), output
    assert plain_backward_kept(output), output
    assert all(d.fix is None or d.fix.applicability.name == "SAFE" for d in diagnostics), output


def plain_backward_kept(output: str) -> bool:
    """The flag's plain backward: where it returns early (``if not mixed: loss.backward();
    return``), as it was; the ``if fp16:``/``else:`` around a scaled and a plain one, folded into
    ``scaler.scale(loss).backward()`` alone (a disabled scaler hands the loss back)."""
    lines = [line.strip() for line in output.splitlines()]
    if "loss.backward()" in lines:
        return lines[lines.index("loss.backward()") + 1] == "return"
    at = next(at for at, line in enumerate(lines) if line.endswith("scaler.scale(loss).backward()"))
    return not lines[at - 1].startswith(("if ", "else")) and lines[at + 1] != "else:"


def test_two_callers_step_their_own_optimizers():
    source = ("import torch\nfrom apex import amp\n\n\n" + HELPERS["positional"][0] + "\n\n"
              "def train(gen, disc, g_opt, d_opt, loader, args):\n"
              "    if args.fp16:\n"
              "        [gen, disc], [g_opt, d_opt] = amp.initialize([gen, disc], [g_opt, d_opt], opt_level=\"O1\", num_losses=1)\n"
              "    for x in loader:\n"
              "        d_loss = disc(x).mean() - disc(gen(x).detach()).mean()\n"
              "        loss_backwards(d_loss, d_opt, args.fp16)\n"
              "        d_opt.step()\n"
              "        d_opt.zero_grad()\n"
              "        g_loss = -disc(gen(x)).mean()\n"
              "        loss_backwards(g_loss, g_opt, args.fp16)\n"
              "        g_opt.step()\n"
              "        g_opt.zero_grad()\n")
    output, _ = _migrate(source, unsafe_fixes=True)
    assert "scaler.step(d_opt)" in output and "scaler.step(g_opt)" in output, output
    assert "d_opt.step()" not in output.replace("scaler.step(d_opt)", "") and "g_opt.step()" not in output.replace(
        "scaler.step(g_opt)", ""), output


@pytest.mark.parametrize("call", [
    "loss_backwards(loss, make_optimizer(), args.fp16)",  # not a name: what it steps is unknown
    "loss_backwards(loss, other_opt, args.fp16)",  # an optimizer no step of the file steps
])
def test_a_caller_handing_what_no_step_steps_is_not_followed(call):
    source = _script("positional", "function").replace("loss_backwards(loss, opt, args.fp16)", call)
    output, diagnostics = _migrate(source, unsafe_fixes=True)
    assert output == source
    assert any("no `optimizer.step()` follows" in d.message for d in diagnostics), [d.message for d in diagnostics]


@pytest.mark.parametrize("flag", ["True", "args.fp16 and warm"])
def test_a_flag_given_otherwise_than_as_the_flag_is_not_read_as_it(flag):
    """``loss_backwards(loss, opt, True)``: the plain backward of the function's other arm may run
    where the scaler is on (no caller says otherwise), so it is scaled too, as an unsafe fix."""
    source = _script("positional", "function").replace("loss_backwards(loss, opt, args.fp16)", f"loss_backwards(loss, opt, {flag})")
    output, _ = _migrate(source)
    assert output == source
    unsafe, _ = _migrate(source, unsafe_fixes=True)
    assert "scaler.scale(loss).backward()" in unsafe and "        loss.backward()" not in unsafe, unsafe


_BETWEEN = {
    # a clip between the two scaled backward passes: the scale-aware clip (the threshold times
    # the scale) cuts what apex's clip of the unscaled gradients cut
    "clip": ("        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n", "scaler.get_scale()"),
    # a norm read there (not a clip): the first pass's unscaled gradients cannot be had natively
    "norm": ("        print(float(sum(p.grad.norm() for p in model.parameters())))\n", None),
}


@pytest.mark.parametrize("between", list(_BETWEEN))
def test_a_backward_helper_called_before_a_reader_and_another_backward_is_a_backward(between):
    """The gradients read after ``backward_pass(...)`` were unscaled by apex: the call is a
    backward pass, the reader is between two scaled backward passes."""
    reader, expected = _BETWEEN[between]
    source = _script("keyword", "function").replace(
        "        opt.step()\n",
        reader + "        aux = model(x).pow(2).mean()\n"
        "        with amp.scale_loss(aux, opt) as scaled_aux:\n"
        "            scaled_aux.backward()\n"
        "        opt.step()\n")
    output, diagnostics = _migrate(source)
    if expected is not None:
        assert expected in output and "unscale_" not in output, output
    else:
        assert output == source, output
        assert any("gradients are read" in d.fix.why_unsafe for d in diagnostics if d.fix), [d.message for d in diagnostics]
