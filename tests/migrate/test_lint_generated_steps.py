"""AMP100 on generated training loops: every framework's step, every loop spelling, every way of
reading a value on the host. A read is reported exactly when what it reads is a step tensor
(computed from the model's output, the loss, the parameters or their gradients), wherever and
however it is written; indices, shapes, CPU-made tensors and batch values never are."""
from __future__ import annotations

import itertools
import textwrap

import pytest

from migrate.engine import run_rules
from migrate.rules import all_rules

_FAMILY = [rule for rule in all_rules() if rule.CODE.startswith("AMP1")]

# Each framework's step, in the loop's body: `x`, `y` are the batch; `loss` and `outputs` result.
STEPS = {
    "native GradScaler": """\
        with torch.autocast("cuda"):
            outputs = model(x)
            loss = criterion(outputs, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        """,
    "timm NativeScaler": """\
        with torch.autocast("cuda"):
            outputs = model(x)
            loss = criterion(outputs, y)
        loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters())
        optimizer.zero_grad()
        """,
    "Accelerate": """\
        with accelerator.autocast():
            outputs = model(x)
            loss = criterion(outputs, y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        """,
    "Fabric": """\
        outputs = model(x)
        loss = criterion(outputs, y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        """,
    "DeepSpeed": """\
        outputs = model_engine(x)
        loss = criterion(outputs, y)
        model_engine.backward(loss)
        model_engine.step()
        """,
    "factory scaler": """\
        with torch.autocast("cuda"):
            outputs = net(x)
            loss = criterion(outputs, y)
        gs.scale(loss).backward()
        gs.step(optimizer)
        gs.update()
        """,
    "backbone with another name": """\
        with torch.autocast("cuda"):
            outputs = self_backbone(x)
            loss = criterion(outputs, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        """,
}

# (read, whether it reads a step tensor); each runs after the step, in the same iteration.
READS = [
    ("print(loss.item())", True),
    ("total += float(loss)", True),
    ('print(f"loss {loss:.3f}")', True),
    ("correct += (outputs.argmax(1) == y).sum().item()", True),
    ("acc = accuracy(outputs, y)\nmeter.update(acc.item())", True),
    ("log = {k: v.item() for k, v in {'loss': loss}.items()}", True),
    ("history.append(loss.detach().cpu().numpy())", True),
    ("norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()", True),
    ("schedule = torch.linspace(0, 1, 100)\nt = torch.randint(0, 100, (1,))\nindex = (schedule == t).nonzero().item()", False),
    ("count = torch.tensor([len(x)])\nseen += count.item()", False),
    ("seen += torch.tensor([len(x)]).item()", False),
    ("first = y[0].item()", False),
    ("print(f'batch of {x.shape[0]} at lr {optimizer.param_groups[0][\"lr\"]}')", False),
    ("loss_value = loss.item()\nprint(f'loss {loss_value:.3f}')", True),
    ('print("loss %.4f" % loss)', True),
    ('print("step %d loss %.4f" % (step, loss))', True),
    ('pbar.set_description(("%8s" + "%10.4g" * 2) % ("train", loss, (loss)))', True),
    ('print("loss {:.4f}".format(loss))', True),
    ('print("lr %.2e, batch %d" % (optimizer.param_groups[0]["lr"], x.shape[0]))', False),
    ('print("{} samples".format(seen))', False),
]

LOOPS = {
    "for": ("for x, y in loader:\n", ""),
    "enumerate": ("for step, (x, y) in enumerate(loader):\n", ""),
    "while": ("while step < max_steps:\n", "    x, y = next(batches)\n    step += 1\n"),
}

RETRY = """\
while True:
    try:
{step}        break
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
"""


def _script(step: str, loop: str, read: str, *, retry: bool = False, guard: str | None = None,
            setup: str = "") -> tuple[str, int]:
    """A training function; returns its source and the line of the read's last statement."""
    head, prelude = LOOPS[loop]
    body = textwrap.dedent(step)
    if retry:
        body = RETRY.format(step=textwrap.indent(body, " " * 8))
    read_lines = read.split("\n")
    if guard:
        read_lines = [guard] + ["    " + line for line in read_lines]
    lines = [
        "import torch",
        "",
        "def train(model, model_engine, net, self_backbone, criterion, optimizer, loader, scaler, loss_scaler,",
        "          accelerator, fabric, accuracy, meter, history, batches, max_steps, get_grad_scaler, pbar, rank):",
        "    gs = get_grad_scaler()",
        "    step = total = correct = seen = 0",
        *(["    " + setup] if setup else []),
        "    " + head.rstrip("\n"),
        *("    " + line for line in prelude.rstrip("\n").split("\n") if prelude),
        *("        " + line for line in body.rstrip("\n").split("\n")),
        *("        " + line for line in read_lines),
    ]
    return "\n".join(lines) + "\n", len(lines)


def _amp100(source: str) -> list[int]:
    result = run_rules(source, "train.py", _FAMILY)
    assert result.error is None, result.error
    return sorted(d.location.row for d in result.diagnostics if d.code == "AMP100")


CASES = [
    pytest.param(step, loop, read, holds, id=f"{step}-{loop}-{index}")
    for (step, loop), (index, (read, holds)) in itertools.product(itertools.product(STEPS, LOOPS), enumerate(READS))
]


@pytest.mark.parametrize(("step", "loop", "read", "holds"), CASES)
def test_a_host_read_is_reported_exactly_when_it_reads_a_step_tensor(step, loop, read, holds):
    source, line = _script(STEPS[step], loop, read)
    found = _amp100(source)
    assert bool(found) == holds, source
    if holds:  # once, on a line of the read
        assert len(found) == 1 and line - read.count("\n") <= found[0] <= line, source


GUARDS = ["if step % 100 == 0:", "if step == 0:", "if rank == 0 and step == len(loader) - 1:"]


@pytest.mark.parametrize("guard", GUARDS)
@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("read", [read for read, holds in READS if holds][:4] + ['print("loss %.4f" % loss)'])
def test_a_read_under_a_logging_guard_is_not_reported(step, read, guard):
    source, _ = _script(STEPS[step], "enumerate", read, guard=guard)
    assert _amp100(source) == [], source


@pytest.mark.parametrize("guard", ["if rank == 0:", "if step > 0:", "if step == 0 or rank == 0:"])
@pytest.mark.parametrize("step", list(STEPS))
def test_a_test_that_holds_on_most_steps_is_no_logging_guard(step, guard):
    source, line = _script(STEPS[step], "enumerate", 'print("loss %.4f" % loss)', guard=guard)
    assert _amp100(source) == [line], source


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("loop", list(LOOPS))
def test_an_out_of_memory_retry_loop_is_part_of_the_iteration_around_it(step, loop):
    source, line = _script(STEPS[step], loop, "print(loss.item())", retry=True)
    assert _amp100(source) == [line], source
    result = run_rules(source, "train.py", _FAMILY)
    assert not [d for d in result.diagnostics if d.code == "AMP103"], source


# Which binding a read sees is the one that reaches it through the loop's control flow
# (`flow.reaching`), on every way: a binding on either arm of an `if` or of a `try`, the last
# step's binding round the loop; not a binding on the other arm.
READ_FORMS = ["print({v}.item())", "total += float({v})", 'print(f"{{{v}:.3f}}")']
REACHING = {  # (lines after the step, with {read}; the binding before the loop; whether a step tensor reaches)
    "either arm": ("if x.shape[0] > 1:\n    shown = loss.detach()\nelse:\n    shown = torch.zeros(())\n{read}", "", True),
    "try or except": ("try:\n    shown = loss.detach()\nexcept RuntimeError:\n    shown = torch.zeros(())\n{read}", "", True),
    "the last step's": ("if shown is not None:\n    {read}\nshown = loss.detach()", "shown = None", True),
    "the other arm": ("shown = torch.tensor([len(x)])\nif x.shape[0] > 1:\n    shown = loss.detach()\nelse:\n    {read}", "", False),
    "rebound by a walrus": ("shown = loss.detach()\nif (shown := len(x)) > 0:\n    {read}", "", False),
}


@pytest.mark.parametrize("form", READ_FORMS)
@pytest.mark.parametrize("shape", list(REACHING))
@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("step", list(STEPS))
def test_a_read_sees_the_bindings_that_reach_it(step, loop, shape, form):
    lines, setup, holds = REACHING[shape]
    source, _ = _script(STEPS[step], loop, lines.format(read=form.format(v="shown")), setup=setup)
    assert bool(_amp100(source)) == holds, source
