"""AMP109's fix where the scaler steps only under a test the backward pass is not under.

``loss.backward()``, then ``if fp16: scaler.step(optimizer); scaler.update()`` ``else:
optimizer.step()`` (cshizhe/VLN-HAMT's pretraining loop). The fix made the backward
``scaler.scale(loss).backward()`` on every run: where the flag is off the scaler is ``None``
(AttributeError) or scales gradients that the plain step never divides (65,536 times the update).
It now scales only where the scaler steps, ``(scaler.scale(loss) if fp16 else loss).backward()``,
and offers no fix where that test cannot be said again (an ``elif``, a test that calls something).
"""
from __future__ import annotations

import itertools

import pytest
import torch

from migrate.engine import run_rules
from migrate.rules import all_rules

RULES = all_rules()

TEMPLATE = """import torch


def train(fp16, batches, flags):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = {make}
    for i, x in enumerate(batches):
        loss = model(x).pow(2).mean()
        loss.backward()
{step}
    return model
"""
MAKES = {"always": 'torch.amp.GradScaler("cpu", enabled={flag})', "none_when_off": 'torch.amp.GradScaler("cpu") if {flag} else None'}
FLAGS = {"name": "fp16", "attribute": "flags.fp16", "negated": "not flags.fp32"}
# where the scaler's step sits, and whether the fix can say its test again
CHOICE = "if {flag}:\n    scaler.step(optimizer)\n    scaler.update()\nelse:\n    optimizer.step()\n"
STEPS = {
    "body": (CHOICE + "optimizer.zero_grad()", True),
    "else_arm": ("if {off}:\n    optimizer.step()\nelse:\n    scaler.step(optimizer)\n    scaler.update()\noptimizer.zero_grad()", True),
    "clip_between": ("if {flag}:\n    scaler.unscale_(optimizer)\n"
                     "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n" + CHOICE + "optimizer.zero_grad()", True),
    # the step every second micro-batch: each one feeding the scaler's step is scaled, not only the last
    "accumulated": ("if i % 2 == 1:\n" + "".join("    " + line + "\n" for line in CHOICE.splitlines())
                    + "    optimizer.zero_grad()", True),
    "elif_arm": ("if len(batches) > 99:\n    optimizer.step()\nelif {flag}:\n    scaler.step(optimizer)\n    scaler.update()\n"
                 "else:\n    optimizer.step()\noptimizer.zero_grad()", False),
    "calling_test": ("if bool({flag}):\n    scaler.step(optimizer)\n    scaler.update()\nelse:\n    optimizer.step()\n"
                     "optimizer.zero_grad()", False),
    "no_plain_arm": ("if {flag}:\n    scaler.step(optimizer)\n    scaler.update()\noptimizer.zero_grad()", False),
}
OFF = {"name": "not fp16", "attribute": "not flags.fp16", "negated": "flags.fp32"}


def _script(make: str, flag: str, step: str) -> str:
    text = STEPS[step][0].format(flag=FLAGS[flag], off=OFF[flag])
    body = "".join(" " * 8 + line + "\n" for line in text.splitlines()).rstrip("\n")
    return TEMPLATE.format(make=MAKES[make].format(flag=FLAGS[flag]), step=body)


class Flags:
    def __init__(self, fp16: bool):
        self.fp16, self.fp32 = fp16, not fp16


def _trained(source: str, fp16: bool) -> torch.Tensor:
    namespace: dict = {}
    exec(compile(source, "train.py", "exec"), namespace)
    batches = [torch.randn(8, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    return namespace["train"](fp16, batches, Flags(fp16)).weight.detach()


@pytest.mark.parametrize(("make", "flag", "step"), list(itertools.product(sorted(MAKES), sorted(FLAGS), sorted(STEPS))))
def test_the_fix_scales_the_backward_only_where_the_scaler_steps(make, flag, step):
    source = _script(make, flag, step)
    result = run_rules(source, "train.py", RULES, unsafe_fixes=True)
    [finding] = [d for d in result.diagnostics if d.code == "AMP109"]
    if not STEPS[step][1]:
        assert not finding.applied and "scale(loss)" not in result.source, result.source
        return
    assert finding.applied and "TODO(ampmigrate)" in result.source, result.source
    # the run with mixed precision off trains exactly as before the fix
    assert torch.equal(_trained(result.source, False), _trained(source, False)), result.source
    # with it on, the backward is scaled: the update is the true one (GradScaler divides it back)
    assert torch.allclose(_trained(result.source, True), _trained(source, False), atol=1e-6), result.source


def test_a_step_under_no_test_of_its_own_keeps_the_plain_fix():
    source = TEMPLATE.format(make='torch.amp.GradScaler("cpu")',
                             step="        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()")
    result = run_rules(source, "train.py", RULES, unsafe_fixes=True)
    assert "        scaler.scale(loss).backward()\n" in result.source, result.source
