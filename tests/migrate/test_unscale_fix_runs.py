"""AMP101's ``scaler.unscale_(optimizer)`` fix, judged by running it: on each way control can go
between the gradient read and ``scaler.step`` (a loop over the parameters with its own
``continue``, a ``try`` whose handler lets the loop go on with or without ``update()``,
raises again, or a ``finally`` alone; a ``continue`` of the training loop), the fix is offered safe exactly where no run can
call ``unscale_`` twice before ``update()`` (which raises), unsafe where only an exception can,
and not at all where a plain run can. Each run trains a small model with a CPU GradScaler and
an exception thrown at one chosen place and iteration, as an out-of-memory error would be."""
from __future__ import annotations

import itertools
import textwrap

import pytest

from migrate.api import migrate_source
from migrate.types import Safety

torch = pytest.importorskip("torch")

# The lines between the clip and the step; `fail(i, "where")` raises where a run chooses.
BETWEEN = {
    "nothing": [],
    "a loop over the parameters that skips some": [
        "for p in model.parameters():",
        "    if not p.requires_grad:",
        "        continue",
        "    fail(i, 'loop')",
    ],
    "a loop over the parameters that stops early": [
        "for p in model.parameters():",
        "    if p.grad is None:",
        "        break",
    ],
}

# How the clip and the step are held in the loop's body: `{read}` is the clip and what follows it.
AROUND = {
    "plainly": (["{read}", "scaler.step(optimizer)", "scaler.update()"], Safety.SAFE),
    "in a try whose handler goes on": (
        ["try:", "    {read}", "    scaler.step(optimizer)", "    scaler.update()", "except OutOfMemory:",
         "    optimizer.zero_grad()"], Safety.UNSAFE),
    "in a try whose handler goes on to the update": (
        ["try:", "    {read}", "    scaler.step(optimizer)", "except OutOfMemory:", "    optimizer.zero_grad()",
         "scaler.update()"], Safety.SAFE),
    "in a try whose handler raises again": (
        ["try:", "    {read}", "    scaler.step(optimizer)", "except OutOfMemory:", "    optimizer.zero_grad()",
         "    raise", "scaler.update()"], Safety.SAFE),
    "in a try with a finally alone": (
        ["try:", "    {read}", "    scaler.step(optimizer)", "finally:", "    optimizer.zero_grad()",
         "scaler.update()"], Safety.SAFE),
    "after a continue of the training loop": (
        ["{read}", "if i % 3 == 2:", "    continue", "scaler.step(optimizer)", "scaler.update()"], None),
}


def _script(between: list[str], around: list[str]) -> str:
    read = ["torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)", "fail(i, 'clip')", *between]
    body = []
    for line in around:
        indent = line[: len(line) - len(line.lstrip())]
        body += [indent + part for part in read] if line.strip() == "{read}" else [line]
    return (
        "import torch\n\n\nclass OutOfMemory(Exception):\n    pass\n\n\n"
        "def train(model, optimizer, batches, scaler, fail):\n"
        "    for i, (x, y) in enumerate(batches):\n"
        "        optimizer.zero_grad()\n"
        "        loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "        scaler.scale(loss).backward()\n"
        + textwrap.indent("\n".join(body), " " * 8) + "\n"
    )


def _raises_twice(source: str) -> bool:
    """Whether some run of ``train`` (an exception thrown at one place and iteration, caught
    outside the loop) ends in GradScaler's error for a second ``unscale_`` before ``update()``."""
    namespace: dict = {}
    exec(compile(source, "train.py", "exec"), namespace)
    for where, at in itertools.product(("clip", "loop", None), range(3)):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(6)]

        def fail(i, place, where=where, at=at):
            if place == where and i == at:
                raise namespace["OutOfMemory"]("thrown by the test")

        try:
            namespace["train"](model, optimizer, batches, torch.amp.GradScaler("cpu"), fail)
        except RuntimeError as error:
            if "unscale_() has already been called" in str(error):
                return True
        except namespace["OutOfMemory"]:
            pass  # it ended the run
    return False


@pytest.mark.parametrize("between", BETWEEN, ids=str)
@pytest.mark.parametrize("around", AROUND, ids=str)
def test_the_unscale_fix_is_offered_as_safe_as_running_it_is(between, around):
    lines, expected = AROUND[around]
    source = _script(BETWEEN[between], lines)
    checked = migrate_source(source, "train.py", select=["AMP101"], fix=False)
    fixes = [d for d in checked.diagnostics if d.code == "AMP101"]
    assert len(fixes) == 1, source
    offered = fixes[0].fix.applicability if fixes[0].fix is not None else None
    assert offered == expected, source
    if expected is None:
        return
    fixed = migrate_source(source, "train.py", select=["AMP101"], unsafe_fixes=True).new_source
    assert "scaler.unscale_(optimizer)" in fixed
    assert _raises_twice(fixed) == (expected is Safety.UNSAFE), fixed


_APEX_LOOP = """\
from apex import amp
import torch


def train(model, optimizer, batches):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        try:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        except torch.cuda.OutOfMemoryError:
{handler}
"""


@pytest.mark.parametrize("handler, unscales", [("            optimizer.zero_grad()", False),
                                               ("            raise", True)])
def test_the_migration_asks_the_same_of_a_clip_in_an_out_of_memory_retry_loop(handler, unscales):
    """The codemod plans the clip on the same graph: where a handler in the loop may take an
    exception between an ``unscale_`` and the update, the clip works on the scaled gradients
    (its threshold times the scale) and nothing is unscaled; where the handler raises again,
    ``unscale_`` goes before the clip."""
    source = _APEX_LOOP.format(handler=handler)
    migrated = migrate_source(source, "train.py").new_source
    assert migrated != source and "apex" not in migrated
    assert ("scaler.unscale_(optimizer)" in migrated) is unscales, migrated
    assert ("scaler.get_scale()" in migrated) is not unscales, migrated
