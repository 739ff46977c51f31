"""apex's current loss scale read through its internals (``amp._amp_state.loss_scalers[0]._loss_scale``,
``.loss_scale()``) becomes the GradScaler's ``get_scale()``.

After the step, both are the scale the next iteration starts from. Before it, they differ on a
step whose backward pass overflowed (apex lowered the scale as ``scale_loss`` closed, GradScaler
lowers it at ``update()``): there the rewrite is unsafe, and its marker sits on the read.
Generated scripts vary how the internals are reached, how the read is written and used, and
where it sits against the step.
"""
from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migrate.engine import run_rules
from migrate.rules import all_rules

RULES = all_rules()

# how the file reaches apex's state: its import lines, and the expression naming `loss_scalers`
REACHED = {
    "module": ("from apex import amp\n", "amp._amp_state.loss_scalers"),
    "state": ("from apex import amp\nfrom apex.amp import _amp_state\n", "_amp_state.loss_scalers"),
    "package": ("import apex\nfrom apex import amp\n", "apex.amp._amp_state.loss_scalers"),
}
READS = {"attribute": "{scalers}[0]._loss_scale", "method": "{scalers}[0].loss_scale()"}
# how the read is used ({read}), one statement or block in the loop's body
USES = {
    "logged": '        log("loss scale", {read})\n',
    "assigned": "        current = {read}\n        log(current)\n",
    "if_exp": "        current = {read} if use_fp16 else 32768.0\n        log(current)\n",
    "every_n": "        if index % 2 == 0:\n            log({read}, index)\n",
}


def _script(reached: str, read: str, use: str, before_step: bool) -> str:
    imports, scalers = REACHED[reached]
    line = USES[use].format(read=READS[read].format(scalers=scalers))
    step = "        optimizer.step()\n"
    return (
        "import torch\n" + imports + "\n\n"
        "def train(model, optimizer, batches, log, use_fp16=True):\n"
        '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
        "    for index, (x, y) in enumerate(batches):\n"
        "        loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "        optimizer.zero_grad()\n"
        "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "            scaled_loss.backward()\n"
        + (line + step if before_step else step + line)
    )


def _fixed(source: str, unsafe: bool) -> str:
    result = run_rules(source, "train.py", RULES, unsafe_fixes=unsafe)
    assert result.error is None, result.error
    return result.source


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reached=st.sampled_from(sorted(REACHED)), read=st.sampled_from(sorted(READS)), use=st.sampled_from(sorted(USES)))
def test_a_read_after_the_step_is_the_scalers_scale(reached, read, use):
    source = _script(reached, read, use, before_step=False)
    fixed = _fixed(source, unsafe=False)
    assert "apex" not in fixed and "_amp_state" not in fixed, fixed
    assert "scaler.get_scale()" in fixed and "TODO(ampmigrate)" not in fixed, fixed
    compile(fixed, "train.py", "exec")
    assert _fixed(fixed, unsafe=False) == fixed


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reached=st.sampled_from(sorted(REACHED)), read=st.sampled_from(sorted(READS)), use=st.sampled_from(sorted(USES)))
def test_a_read_before_the_step_is_unsafe_and_marked_on_the_read(reached, read, use):
    source = _script(reached, read, use, before_step=True)
    assert _fixed(source, unsafe=False) == source
    fixed = _fixed(source, unsafe=True)
    lines = fixed.splitlines()
    at = next(i for i, text in enumerate(lines) if "scaler.get_scale()" in text)
    above = lines[at - 1] if use != "every_n" else lines[at - 2]
    assert "TODO(ampmigrate)" in "\n".join(lines[max(0, at - 5):at]) and above.lstrip().startswith("#"), fixed


@pytest.mark.parametrize("read", ["amp._amp_state.loss_scalers[1]._loss_scale", "amp._amp_state.loss_scalers[0]._unskipped",
                                  "len(amp._amp_state.loss_scalers)"])
def test_other_reads_of_apex_state_keep_the_file_on_apex(read):
    source = _script("module", "attribute", "logged", before_step=False).replace(
        "amp._amp_state.loss_scalers[0]._loss_scale", read)
    assert _fixed(source, unsafe=True) == source


def test_a_scale_poked_and_read_is_planned_too():
    source = _script("module", "attribute", "logged", before_step=False).replace(
        '    for index', '    amp._amp_state.loss_scalers[0]._loss_scale = 2.0**10\n    for index')
    fixed = _fixed(source, unsafe=False)
    assert "init_scale=2.0**10" in fixed and "scaler.get_scale()" in fixed, fixed


@pytest.mark.slow
def test_a_script_logging_the_scale_trains_the_same(tmp_path):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    body = _script("module", "method", "if_exp", before_step=False)
    script = body + (
        "\n\nif __name__ == '__main__':\n"
        "    torch.manual_seed(0)\n"
        "    device = 'cuda'\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)\n"
        "    batches = [(torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)) for _ in range(12)]\n"
        "    seen = []\n"
        "    train(model, optimizer, batches, lambda *values: seen.append(values))\n"
        "    assert len(seen) == 12 and all(value[0] > 0 for value in seen), seen\n"
    )
    (tmp_path / "original").mkdir()
    (tmp_path / "original" / "train.py").write_text(script)
    shutil.copytree(tmp_path / "original", tmp_path / "migrated")
    (tmp_path / "migrated" / "train.py").write_text(_fixed(script, unsafe=False))
    assert "get_scale()" in (tmp_path / "migrated" / "train.py").read_text()
    result = compare(Target(str(tmp_path / "original" / "train.py")), Target(str(tmp_path / "migrated" / "train.py")), [],
                     device="cpu", steps=12, parallel=False, timeout=600)
    assert result.verdict == SAME, as_text(result)
