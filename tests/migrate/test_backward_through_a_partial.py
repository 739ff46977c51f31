"""A function scaling a loss, called through a ``functools.partial`` of it made before the loop
(``backwards = partial(loss_backwards, self.fp16)``, then ``backwards(loss, opt)``): its calls are
the partial's, with the arguments the partial bound first. The callers' steps go through the
scaler, the flag bound by the partial is read as the flag. Every spelling: bound by position or
by keyword, the flag or the optimizer bound, ``functools.partial`` or ``partial``, a function or
a trainer's method."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source
from test_optimizer_handed_to_a_backward_helper import TRAINERS as HANDED_TRAINERS
from test_optimizer_handed_to_a_backward_helper import assert_stepped_through_the_scaler, plain_backward_kept

# the function scaling the loss, and the partial of it, with `{flag}` and `{opt}` to fill in
BINDINGS = {
    "flag_first": ("def loss_backwards(fp16, loss, optimizer):\n"
                   "    if fp16:\n"
                   "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
                   "            scaled_loss.backward()\n"
                   "    else:\n"
                   "        loss.backward()\n",
                   "backwards = partial(loss_backwards, {flag})", "backwards(loss, {opt})"),
    "flag_by_keyword": ("def backward_pass(loss, handed, mixed=True):\n"
                        "    if not mixed:\n"
                        "        loss.backward()\n"
                        "        return\n"
                        "    with amp.scale_loss(loss, handed) as scaled:\n"
                        "        scaled.backward()\n",
                        "step_back = functools.partial(backward_pass, mixed={flag})", "step_back(loss, {opt})"),
    "optimizer_bound": ("def loss_backwards(fp16, loss, optimizer):\n"
                        "    if fp16:\n"
                        "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
                        "            scaled_loss.backward()\n"
                        "    else:\n"
                        "        loss.backward()\n",
                        "backwards = partial(loss_backwards, optimizer={opt}, fp16={flag})", "backwards(loss=loss)"),
}

def _with_partial(body: str) -> str:
    """The trainer, with ``{bind}`` (the partial) before its loop."""
    indent = body.split("for x in loader:")[0].rsplit("\n", 1)[1]
    return body.replace(indent + "for x in loader:", indent + "{bind}\n" + indent + "for x in loader:")


# the training code of the function called directly, the partial made before its loop
TRAINERS = {name: (_with_partial(body), opt, flag) for name, (body, opt, flag) in HANDED_TRAINERS.items()}

HEADER = "import functools\nfrom functools import partial\n\nimport torch\nfrom apex import amp\n\n\n"


def _script(binding: str, trainer: str) -> str:
    definition, bind, call = BINDINGS[binding]
    body, opt, flag = TRAINERS[trainer]
    return HEADER + definition + "\n\n" + body.format(bind=bind.format(flag=flag, opt=opt), call=call.format(opt=opt))


def _migrate(source: str, unsafe_fixes: bool = False):
    result = migrate_source(source, "train.py", unsafe_fixes=unsafe_fixes)
    assert result.error is None, result.error
    assert not any(d.code == "AMP901" for d in result.diagnostics), [d.message for d in result.diagnostics]
    return result.new_source or source, result.diagnostics


@pytest.mark.parametrize(("binding", "trainer"), list(itertools.product(BINDINGS, TRAINERS)))
def test_the_partials_callers_step_through_the_scaler(binding, trainer):
    """The flag the partial binds is the flag: the rewrite is safe, the plain arm needs no scaling."""
    output, diagnostics = _migrate(_script(binding, trainer))
    assert_stepped_through_the_scaler(output, diagnostics, TRAINERS[trainer][1])


@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_a_name_bound_twice_is_not_read_as_the_partial(trainer):
    """``backwards`` bound to the partial and to something else: which one a call runs is not
    known, so the step is not followed."""
    source = _script("flag_first", trainer)
    bind = BINDINGS["flag_first"][1].format(flag=TRAINERS[trainer][2])
    source = source.replace(bind, bind + "\n" + " " * (8 if trainer == "method" else 4) + "backwards = print")
    output, diagnostics = _migrate(source, unsafe_fixes=True)
    assert output == source
    assert any("no `optimizer.step()` follows" in d.message for d in diagnostics), [d.message for d in diagnostics]


def test_a_partial_made_in_another_function_is_not_followed():
    """A call of a parameter named like a partial made elsewhere calls what it was handed."""
    source = (HEADER + BINDINGS["flag_first"][0] + "\n\n"
              "def make(args):\n"
              "    backwards = partial(loss_backwards, args.fp16)\n"
              "    return backwards\n\n\n"
              "def train(model, opt, loader, args, backwards):\n"
              "    if args.fp16:\n"
              "        model, opt = amp.initialize(model, opt, opt_level=\"O1\")\n"
              "    for x in loader:\n"
              "        loss = model(x).sum()\n"
              "        backwards(loss, opt)\n"
              "        opt.step()\n")
    output, diagnostics = _migrate(source, unsafe_fixes=True)
    assert output == source
    assert any("no `optimizer.step()` follows" in d.message for d in diagnostics), [d.message for d in diagnostics]


def test_a_partial_of_something_else_named_partial_is_not_followed():
    """``partial`` that is not ``functools.partial`` (the file's own) binds nothing known."""
    source = _script("flag_first", "function").replace(
        "import functools\nfrom functools import partial\n", "import functools\n\n\ndef partial(*args):\n    return print\n")
    output, _ = _migrate(source, unsafe_fixes=True)
    assert "opt.step()" in output and "scaler.step(opt)" not in output, output


def test_a_partial_of_a_method_binds_after_self():
    """``partial(self.backward_step, self.use_amp)``: the method's first parameter is ``self``."""
    trainer_init = HANDED_TRAINERS["method"][0].split("    def fit")[0]
    source = (HEADER + trainer_init +
              "    def backward_step(self, fp16, loss, optimizer):\n"
              "        if fp16:\n"
              "            with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
              "                scaled_loss.backward()\n"
              "        else:\n"
              "            loss.backward()\n"
              "\n"
              "    def fit(self, loader):\n"
              "        backwards = partial(self.backward_step, self.use_amp)\n"
              "        for x in loader:\n"
              "            loss = self.model(x).sum()\n"
              "            backwards(loss, self.opt)\n"
              "            self.opt.step()\n")
    output, _ = _migrate(source)
    assert "apex" not in output and "scaler.step(self.opt)" in output, output
    assert "TODO(ampmigrate)" not in output and plain_backward_kept(output), output
