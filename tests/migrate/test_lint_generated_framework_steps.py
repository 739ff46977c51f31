"""AMP101's and AMP109's framework halves on generated steps: every framework that scales the loss
itself (Accelerate, Fabric, Lightning's manual optimisation), every spelling of what runs it (a
local name, an attribute, a parameter), every gradient read and where it stands, every way the
precision is given. The expected finding is worked out from the semantics, not from the rule:

- AMP101: a torch read of the gradients between the framework's backward and the optimizer's
  step, where the precision may scale (fp16, or not said), is reported; the framework's own clip,
  a read after the step, or a precision without a scaler is not.
- AMP109: a plain ``loss.backward()`` whose optimizer the framework prepared (or in a
  LightningModule stepping by hand), where the precision may scale, is reported.
"""
from __future__ import annotations

import itertools
import textwrap

import pytest

from migrate.engine import run_rules
from migrate.rules import rule_by_code

RULES = [rule_by_code("AMP101"), rule_by_code("AMP109")]

# framework -> (how the object is made with a precision, its backward, its own clip, the precisions
# with and without a scaler, what hands it the model and the optimizer)
FRAMEWORKS = {
    "Accelerate": ("Accelerator(mixed_precision={precision})", "{runner}.backward(loss)",
                   "{runner}.clip_grad_norm_(model.parameters(), 1.0)", {"fp16": True, "bf16": False, "no": False}, "prepare"),
    "Fabric": ("Fabric(precision={precision})", "{runner}.backward(loss)",
               "{runner}.clip_gradients(model, optimizer, max_norm=1.0)",
               {"16-mixed": True, "bf16-mixed": False, "32": False}, "setup"),
}
RUNNERS = {"local": "{name}", "attribute": "self.{name}"}
READS = {
    "torch clip": ("torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)", True),
    "clip by value": ("torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)", True),
    "own clip": (None, False),  # the framework's, filled in per framework
}
PRECISION_GIVEN = ("literal", "module constant", "run time")


def _script(framework: str, runner_kind: str, precision: str, given: str, read: str, read_after_step: bool,
            plain_backward: bool) -> str:
    make, backward, own_clip, _, prepare = FRAMEWORKS[framework]
    name = "fabric" if framework == "Fabric" else "accelerator"
    runner = RUNNERS[runner_kind].format(name=name)
    model, optimizer = ("self.model", "self.optimizer") if runner_kind == "attribute" else ("model", "optimizer")
    value = {"literal": repr(precision), "module constant": "PRECISION", "run time": "args.precision"}[given]
    made = [f"{runner} = {make.format(precision=value)}", f"{model}, {optimizer} = {runner}.{prepare}(model, optimizer)"]
    line = (own_clip.format(runner=runner) if read == "own clip" else READS[read][0]).replace("model.", f"{model}.")
    step = [f"{optimizer}.step()", f"{optimizer}.zero_grad()"]
    body = [f"loss = {model}(x, y)", "loss.backward()" if plain_backward else backward.format(runner=runner)]
    body += [*step, line] if read_after_step else [line, *step]
    setup, loop = ("\n        ".join(made), "pass") if runner_kind == "attribute" else ("pass", "\n        ".join(made))
    statements = "\n            ".join(body)
    return textwrap.dedent(f"""\
        import torch

        PRECISION = {precision!r}


        class Trainer:
            def __init__(self, args, model, optimizer):
                {{setup}}

            def fit(self, args, model, optimizer, loader):
                {{loop}}
                for x, y in loader:
                    {{statements}}
        """).format(setup=setup, loop=loop, statements=statements)


CASES = [
    case for case in itertools.product(FRAMEWORKS, RUNNERS, ["scales", "no scaler"], PRECISION_GIVEN, READS,
                                       [False, True], [False, True])
]


@pytest.mark.parametrize(("framework", "runner", "scaling", "given", "read", "after_step", "plain"), CASES,
                         ids=["-".join(str(part) for part in case) for case in CASES])
def test_a_framework_step_is_judged_by_what_its_precision_does(framework, runner, scaling, given, read, after_step,
                                                               plain):
    precisions = FRAMEWORKS[framework][3]
    precision = next(p for p, scales in precisions.items() if scales == (scaling == "scales"))
    source = _script(framework, runner, precision, given, read, after_step, plain)
    compile(source, "train.py", "exec")
    found = {d.code for d in run_rules(source, "train.py", RULES).diagnostics}
    may_scale = scaling == "scales" or given == "run time"
    reads_scaled = READS[read][1] and not after_step and not plain
    assert ("AMP101" in found) == (may_scale and reads_scaled), source
    assert ("AMP109" in found) == (may_scale and plain), source
