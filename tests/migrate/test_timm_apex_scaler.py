"""A training script built on timm picks timm's ``ApexScaler`` (which calls ``amp.scale_loss``
itself) or its ``NativeScaler`` by its amp option, and runs its forward passes under an autocast
factory it sets in the native arm. ``--unsafe-fixes`` turns the apex arm into the native one:
the factory set to float16 autocast where ``amp.initialize`` was, ``NativeScaler()`` for
``ApexScaler()``; however the factory, the imports, the arms and the training loop are spelled.
The rewrite is judged by running it against the original on ampshim, with a ``timm.utils`` of
this test's own beside the script."""
from __future__ import annotations

import itertools
import re

import pytest

from migrate.api import migrate_source

# What the script needs of timm.utils: a scaler called with the loss and the optimizer, which
# backpropagates, clips when asked and steps (timm's interface; written for this test).
TIMM_UTILS = '''\
import torch


class ApexScaler:
    state_dict_key = "amp"

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None):
        from apex import amp

        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        if clip_grad is not None:
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), clip_grad)
        optimizer.step()


class NativeScaler:
    state_dict_key = "amp_scaler"

    def __init__(self):
        self._scaler = torch.amp.GradScaler("cuda")

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None):
        self._scaler.scale(loss).backward()
        if clip_grad is not None:
            self._scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        self._scaler.step(optimizer)
        self._scaler.update()
'''

FACTORIES = {
    "cuda autocast": "torch.cuda.amp.autocast",
    "partial, keywords": 'partial(torch.autocast, device_type="cuda", dtype=torch.float16)',
    "functools.partial": 'functools.partial(torch.autocast, "cuda")',
}
IMPORTS = {
    "both": "from timm.utils import ApexScaler, NativeScaler",
    "apex's only": "from timm.utils import ApexScaler",
    "aliased": "from timm.utils import ApexScaler as Scaler, NativeScaler as Native",
}

ARMS = {
    "apex first": '''\
    if args.amp == "apex":
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        loss_scaler = {apex}()
    elif args.amp == "native":
        amp_autocast = {factory}
        loss_scaler = {native}()
''',
    "native first": '''\
    if args.amp == "native":
        amp_autocast = {factory}
        loss_scaler = {native}()
    elif args.amp == "apex":
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
        loss_scaler = {apex}()
''',
}

LOOP = '''\
    for step in range(16):
        x, y = batches[step % len(batches)]
        with amp_autocast():
            loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        if loss_scaler is not None:
            loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters())
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        losses.append(float(loss))
'''

SCRIPT = '''\
import argparse
{functools}from contextlib import suppress

import torch
import torch.nn as nn
import torch.nn.functional as F
{imports}

try:
    from apex import amp
except ImportError:
    amp = None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", default="apex", choices=["apex", "native", "none"])
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    amp_autocast = suppress
    loss_scaler = None
{arms}
    data = torch.randn(64, 16, device="cuda")
    target = data[:, :1].sin() * 3
    batches = [(data[i:i + 16], target[i:i + 16]) for i in range(0, 64, 16)]
    losses = []
{loop}
    print(losses[-1])


if __name__ == "__main__":
    main()
'''

HELPER_LOOP = '''\
    losses = train_one_epoch(model, optimizer, batches, amp_autocast=amp_autocast, loss_scaler=loss_scaler)
'''
HELPER = '''

def train_one_epoch(model, optimizer, batches, amp_autocast=suppress, loss_scaler=None):
    losses = []
{loop}
    return losses
'''


def _names(imports: str) -> tuple[str, str]:
    return ("Scaler", "Native") if imports == "aliased" else ("ApexScaler", "NativeScaler")


# what the factory needs of functools, and the partial the rewrite then writes
FUNCTOOLS = {"cuda autocast": ("", "functools.partial"),
             "partial, keywords": ("from functools import partial\n", "partial"),
             "functools.partial": ("import functools\n", "functools.partial")}


def _script(factory: str, imports: str, arms: str, helper: bool) -> str:
    apex, native = _names(imports)
    source = SCRIPT.format(
        functools=FUNCTOOLS[factory][0],
        imports=IMPORTS[imports],
        arms=ARMS[arms].format(apex=apex, native=native, factory=FACTORIES[factory]),
        loop=HELPER_LOOP if helper else LOOP)
    if helper:
        source = source.replace('\n\nif __name__', HELPER.format(loop=LOOP) + '\n\nif __name__')
    return source


FORMS = list(itertools.product(sorted(FACTORIES), sorted(IMPORTS), sorted(ARMS), [False, True]))


@pytest.mark.parametrize(("factory", "imports", "arms", "helper"), FORMS)
def test_the_apex_arm_becomes_the_native_one(factory, imports, arms, helper):
    source = _script(factory, imports, arms, helper)
    result = migrate_source(source, filename="train.py", unsafe_fixes=True)
    fixed = result.new_source
    apex, native = _names(imports)
    assert result.changed and not re.search(r"(?<![\w.])amp\.", fixed) and "from apex" not in fixed, fixed
    assert f"{apex}()" not in fixed and fixed.count(f"loss_scaler = {native}()") == 2, fixed
    assert f'amp_autocast = {FUNCTOOLS[factory][1]}(torch.autocast, "cuda", dtype=torch.float16)' in fixed, fixed
    assert "TODO(ampmigrate)" in fixed and "`amp_scaler`" in fixed, fixed
    if imports == "apex's only":
        assert "from timm.utils import NativeScaler" in fixed or "NativeScaler" in fixed.split("def main")[0], fixed
    compile(fixed, "train.py", "exec")


def test_the_safe_run_leaves_it_and_says_why():
    source = _script("cuda autocast", "both", "apex first", False)
    result = migrate_source(source, filename="train.py")
    assert result.new_source == source
    reasons = {d.fix.why_unsafe for d in result.diagnostics if d.code == "AMP002" and d.fix is not None}
    assert any("`amp_scaler`" in reason for reason in reasons), result.diagnostics


@pytest.mark.parametrize(("change", "reason"), [
    (('opt_level="O1")', 'opt_level="O2")'), "asks for O2"),
    (('opt_level="O1")', 'opt_level="O1", loss_scale=128.0)'), "asks for other options"),
    (("        amp_autocast = torch.cuda.amp.autocast\n", "        pass\n"), "names bound to an autocast factory: none"),
    (("        loss_scaler = ApexScaler()\n", "        loss_scaler = ApexScaler()\n        meter = amp.state_dict()\n"),
     "calls apex's amp itself too"),
    (("        loss_scaler = ApexScaler()\n", "        if args.amp:\n            loss_scaler = ApexScaler()\n"), "not made beside"),
    (("        loss_scaler = ApexScaler()\n", "        loss_scaler = ApexScaler() if args.amp else None\n"), "not assigned on a line"),
])
def test_what_the_native_arm_cannot_stand_for_is_left(change, reason):
    source = _script("cuda autocast", "both", "apex first", False).replace(*change, 1)
    result = migrate_source(source, filename="train.py", unsafe_fixes=True)
    assert result.new_source == source
    messages = " ".join(d.message for d in result.diagnostics)
    assert "ApexScaler" in messages and reason in messages, messages


@pytest.mark.slow
@pytest.mark.parametrize(("factory", "helper"), [("partial, keywords", False), ("cuda autocast", True)])
def test_the_rewrite_trains_as_the_original(factory, helper, tmp_path):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    (tmp_path / "timm").mkdir()
    (tmp_path / "timm" / "__init__.py").write_text("")
    (tmp_path / "timm" / "utils.py").write_text(TIMM_UTILS)
    source = _script(factory, "both", "apex first", helper)
    (tmp_path / "original.py").write_text(source)
    (tmp_path / "rewritten.py").write_text(migrate_source(source, filename="train.py", unsafe_fixes=True).new_source)
    for args in ([], ["--amp", "native"], ["--amp", "none"]):
        comparison = compare(Target(str(tmp_path / "original.py")), Target(str(tmp_path / "rewritten.py")), args,
                             device="cpu", steps=30, parallel=True, timeout=240)
        assert comparison.verdict == SAME, " ".join(args) + "\n" + as_text(comparison)


def test_a_native_arm_that_tries_one_factory_then_another():
    # newer timm: `partial(torch.autocast, ...)` in a `try`, `torch.cuda.amp.autocast` where that fails,
    # and the apex arm asserting CUDA first
    source = _script("partial, keywords", "both", "apex first", True).replace(
        '        amp_autocast = partial(torch.autocast, device_type="cuda", dtype=torch.float16)\n',
        '        try:\n'
        '            amp_autocast = partial(torch.autocast, device_type="cuda", dtype=torch.float16)\n'
        '        except (AttributeError, TypeError):\n'
        '            amp_autocast = torch.cuda.amp.autocast\n', 1).replace(
        '    if args.amp == "apex":\n', '    if args.amp == "apex":\n        assert torch.cuda.is_available()\n', 1)
    assert "except (AttributeError, TypeError)" in source and "assert torch.cuda" in source
    fixed = migrate_source(source, filename="train.py", unsafe_fixes=True).new_source
    assert 'amp_autocast = partial(torch.autocast, "cuda", dtype=torch.float16)' in fixed, fixed
    assert "ApexScaler()" not in fixed and "amp.initialize" not in fixed, fixed
    compile(fixed, "train.py", "exec")
