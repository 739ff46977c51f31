"""``if self.use_amp: self.setup_amp()`` in ``__init__``, where ``setup_amp`` runs ``amp.initialize``
and training tests the same flag for a plain backward: where the flag is off the method never
runs, so the scaler that stands in stays disabled and the plain backward is no backward the
scaler must scale, though the optimizer steps in another method. The rewrite is safe, as it is where ``__init__`` initializes under the flag
itself. Where the method may run another way (a second call, its name handed on, a call in a
loop), the plain backward may meet an enabled scaler: still unsafe."""
from __future__ import annotations

import itertools
import textwrap

import pytest
import torch

from migrate.api import migrate_source

TRAINER = '''\
import torch
import torch.nn.functional as F
from apex import amp


class Trainer:
    def __init__(self, model, {flag_parameter}):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
{keep}
{call}

    def {method}(self):
        self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1", verbosity=0)
{elsewhere}
    def backward(self, loss):
{backward}

    def fit(self, batches):
        for x, y in batches:
            loss = F.mse_loss(self.model(x), y)
            self.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
'''
# how the flag reaches the trainer: (__init__'s parameter, what __init__ keeps, the test of the call, the test training reads)
FLAGS = {
    "copy": ("use_amp", "self.use_amp = use_amp", "self.use_amp", "self.use_amp"),
    "parameter": ("use_amp", "self.use_amp = use_amp", "use_amp", "self.use_amp"),
    "options": ("args", "self.args = args", "self.args.fp16", "self.args.fp16"),
}
BACKWARDS = {
    "plain_first": "if not {flag}:\n    loss.backward()\n    return\nwith amp.scale_loss(loss, self.optimizer) as scaled_loss:\n    scaled_loss.backward()",
    "plain_else": "if not {flag}:\n    loss.backward()\nelse:\n    with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n        scaled_loss.backward()",
    "scaled_first": "if {flag}:\n    with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n        scaled_loss.backward()\nelse:\n    loss.backward()",
}
METHODS = ["setup_amp", "_init_amp"]


def _source(flag: str, backward: str, method: str, call: str | None = None, elsewhere: str = "") -> str:
    parameter, keep, tested, trained = FLAGS[flag]
    call = call or f"if {tested}:\n    self.{method}()"
    return TRAINER.format(flag_parameter=parameter, keep=textwrap.indent(keep, " " * 8),
                          call=textwrap.indent(call.format(tested=tested, method=method), " " * 8), method=method,
                          elsewhere=textwrap.indent(elsewhere.format(method=method), " " * 4),
                          backward=textwrap.indent(BACKWARDS[backward].format(flag=trained), " " * 8))


class Args:
    def __init__(self, fp16: bool):
        self.fp16 = fp16


def _trains(source: str, flag: str, on: bool) -> None:
    namespace: dict = {}
    exec(compile(source, "trainer.py", "exec"), namespace)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    trainer = namespace["Trainer"](model, Args(on) if flag == "options" else on)
    before = model.weight.detach().clone()
    trainer.fit([(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(3)])
    assert not torch.equal(before, model.weight.detach())


@pytest.mark.filterwarnings("ignore::UserWarning")  # a CUDA GradScaler and autocast on a CPU-only machine
@pytest.mark.parametrize("flag, backward, method", list(itertools.product(FLAGS, BACKWARDS, METHODS)))
def test_the_set_up_method_under_the_flag_is_a_safe_rewrite(flag, backward, method):
    source = _source(flag, backward, method)
    result = migrate_source(source, "trainer.py")
    new = result.new_source
    assert "apex" not in new and "TODO(ampmigrate)" not in new, new
    init, rest = new.split(f"    def {method}(self):")
    assert 'self.scaler = torch.amp.GradScaler("cuda", enabled=False)' in init, new
    assert 'self.scaler = torch.amp.GradScaler("cuda")' in rest.split("    def fit")[0], new
    for on in (False, True):  # runs with the flag either way
        _trains(new, flag, on)


# the method may run where the flag is off: the plain backward may meet an enabled scaler
ANOTHER_WAY = {
    "second_call": ("if {tested}:\n    self.{method}()", "\ndef resume(self):\n    self.{method}()\n"),
    "handed_on": ("if {tested}:\n    self.{method}()", "\ndef hooks(self):\n    return [self.{method}]\n"),
    "in_a_loop": ("for _ in range(1):\n    if {tested}:\n        self.{method}()", ""),
    "unconditional": ("self.{method}()", ""),
}


@pytest.mark.parametrize("shape, method", list(itertools.product(ANOTHER_WAY, METHODS)))
def test_a_set_up_method_that_may_run_another_way_stays_unsafe(shape, method):
    call, elsewhere = ANOTHER_WAY[shape]
    source = _source("copy", "plain_first", method, call=call, elsewhere=elsewhere)
    assert "with amp.scale_loss" in migrate_source(source, "trainer.py").new_source
    fixed = migrate_source(source, "trainer.py", unsafe_fixes=True).new_source
    assert "with amp.scale_loss" not in fixed and "TODO(ampmigrate)" in fixed, fixed
