"""``with amp.scale_loss(loss, opt) as scaled_loss: self._backward(scaled_loss)``: the helper's
``scaled_loss.backward()`` is the scaled backward pass, not a plain one to scale again (scaled
twice, the gradients came out 65,536 times too large), however the helper is written and called.
And ``amp.initialize(model, None)``, which hands back the model alone."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

# the helper taking the scaled loss, and how the `scale_loss` body calls it with `{name}`
HELPERS = {
    "method": ("    def _backward(self, scaled):\n        scaled.backward()\n", "self._backward({name})"),
    "method-keyword": ("    def _backward(self, scaled, retain=False):\n        scaled.backward(retain_graph=retain)\n",
                       "self._backward(scaled={name})"),
    "function": ("", "run_backward({name})"),
}
NAMES = ["scaled_loss", "scaled"]


def _script(helper: str, name: str, extra_call: str = "", step_in: str = "line") -> str:
    """``step_in``: the optimizer steps on the next line, or in a method of its own (``self._step()``)."""
    method, call = HELPERS[helper]
    step = "        self.optimizer.step()\n" if step_in == "line" else "        self._step()\n"
    used = helper == "function" or "run_backward" in extra_call  # an uncalled one would be a plain backward
    return (
        "import torch\nfrom apex import amp\n\n\n"
        + ("def run_backward(scaled):\n    scaled.backward()\n\n\n" if used else "")
        + "class Trainer:\n"
        "    def __init__(self, model, optimizer):\n"
        "        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n\n"
        + method + "\n"
        "    def _step(self):\n"
        "        self.optimizer.step()\n\n"
        "    def step(self, x):\n"
        "        loss = self.model(x).sum()\n"
        f"        with amp.scale_loss(loss, self.optimizer) as {name}:\n"
        f"            {call.format(name=name)}\n"
        + extra_call + step +
        "        self.optimizer.zero_grad()\n"
    )


def _migrate(source: str, unsafe_fixes: bool):
    result = migrate_source(source, "train.py", unsafe_fixes=unsafe_fixes)
    assert result.error is None, result.error
    return result.new_source or source, result.diagnostics


@pytest.mark.parametrize(("helper", "name", "step_in", "unsafe_fixes"),
                         list(itertools.product(HELPERS, NAMES, ("line", "method"), (False, True))))
def test_the_loss_is_scaled_once(helper, name, step_in, unsafe_fixes):
    output, _ = _migrate(_script(helper, name, step_in=step_in), unsafe_fixes)
    assert "apex" not in output, output
    assert output.count(".scale(") == 1, output  # `scaled = self.scaler.scale(loss)`, the helper untouched
    assert "scale(scaled" not in output, output


def test_a_helper_handed_scaled_and_unscaled_losses_is_left_alone():
    """One call hands it the scaled loss, another a plain one: the rewrite cannot scale one and
    not the other through the same helper, so the file stays as it is, and says why."""
    extra = "        aux = self.model(x).mean()\n        self._backward(aux)\n"
    source = _script("method", "scaled_loss", extra)
    for unsafe_fixes in (False, True):
        output, diagnostics = _migrate(source, unsafe_fixes)
        assert output == source
        assert any("scaled by one call and an unscaled one by another" in d.message for d in diagnostics)


@pytest.mark.parametrize("optimizers", ["None", "optimizers=None"])
@pytest.mark.parametrize("target", ["teacher = ", "return "])
def test_initialize_without_optimizers_hands_back_the_model(optimizers, target):
    source = (
        "import torch\nfrom apex import amp\n\n\n"
        "def ready(teacher, fp16):\n"
        "    if fp16:\n"
        f"        {target}amp.initialize(teacher, {optimizers}, opt_level=\"O1\")\n"
        "    return teacher\n\n\n"
        "def train(model, optimizer, teacher, loader, fp16):\n"
        "    model, optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n"
        "    teacher = ready(teacher, fp16)\n"
        "    for x in loader:\n"
        "        loss = (model(x) - teacher(x)).pow(2).mean()\n"
        "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "            scaled_loss.backward()\n"
        "        optimizer.step()\n"
    )
    output, _ = _migrate(source, unsafe_fixes=True)
    assert "teacher, None" not in output, output
    if target == "return ":
        assert "        return teacher\n" in output, output


@pytest.mark.parametrize("helper", ["run_backward(aux)", "self._backward(aux)", "self._plain(aux)"])
def test_a_plain_backward_in_a_helper_beside_the_scaled_one_is_seen(helper):
    """``run_backward(aux)`` between the scaled backward and the step adds gradients apex kept as
    they were, which ``scaler.step`` would divide by the scale: not a safe rewrite."""
    extra = f"        aux = self.model(x).mean()\n        {helper}\n"
    source = _script("method", "scaled_loss", extra).replace(
        "    def step(self, x):\n", "    def _plain(self, loss):\n        loss.backward()\n\n    def step(self, x):\n")
    output, _ = _migrate(source, unsafe_fixes=False)
    assert output == source, output
