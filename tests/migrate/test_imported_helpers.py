"""AMP100 through the helpers of a project's other files: found from the file's imports, on disk."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from migrate.api import migrate_source

_LOOP = """\
{imports}

def train_one_epoch(model, optimizer, loader, scaler, args):
{setup}
    for step, (samples, targets) in enumerate(loader):
        with torch.autocast("cuda"):
            outputs = model(samples)
            loss = criterion(outputs, targets)
            loss_dict = {{"loss": loss, "acc": (outputs.argmax(1) == targets).float().mean()}}
{call}
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
"""

_LOGGER = """\
import torch


class MetricLogger:
    def __init__(self, delimiter="  "):
        self.meters = {}

    def update(self, **kwargs):
        for name, value in kwargs.items():
            if isinstance(value, torch.Tensor):
                value = value.item()
            self.meters.setdefault(name, []).append(value)

    def log_every(self, iterable, print_freq):
        yield from iterable
"""

_MISC = """\
import math


def check_nan_losses(loss):
    if math.isnan(loss):
        raise RuntimeError("ERROR: got NaN losses")


def log_sometimes(step, loss, every=100):
    if step % every == 0:
        print(float(loss))


def keep(loss, store):
    store.append(loss)
"""

# (the import line, the lines before the loop, the call in the loop, whether it waits)
_SPELLINGS = [
    ("from project.common.logger import MetricLogger", "    metric_logger = MetricLogger()",
     "        metric_logger.update(**loss_dict)", True),
    ("from project.common.logger import MetricLogger as Logger", "    meters = Logger(delimiter=' ')",
     "        meters.update(loss=loss)", True),
    ("from project.utils import misc", "", "        misc.check_nan_losses(loss)", True),
    ("import project.utils.misc as misc", "", "        misc.check_nan_losses(loss)", True),
    ("from project.utils.misc import check_nan_losses", "", "        check_nan_losses(loss)", True),
    ("from ..utils import misc", "", "        misc.check_nan_losses(loss)", True),
    ("from ..utils.misc import check_nan_losses as check", "", "        check(loss)", True),
    ("from project.utils import misc", "", "        misc.log_sometimes(step, loss)", False),  # every 100 calls
    ("from project.utils import misc", "", "        misc.keep(loss, history)", False),  # no read
    ("from project.utils import missing", "", "        missing.check_nan_losses(loss)", False),  # no such file
    ("from project.common.logger import MetricLogger", "    metric_logger = MetricLogger()",
     "        metric_logger.update(lr=optimizer.param_groups[0]['lr'])", False),  # a host value
]


def _project(root: Path) -> Path:
    (root / "project" / "common").mkdir(parents=True)
    (root / "project" / "utils").mkdir()
    (root / "project" / "engine").mkdir()
    for folder in ("project", "project/common", "project/utils", "project/engine"):
        (root / folder / "__init__.py").write_text("")
    (root / "project" / "common" / "logger.py").write_text(_LOGGER)
    (root / "project" / "utils" / "misc.py").write_text(_MISC)
    return root / "project" / "engine" / "train.py"


@pytest.mark.parametrize(("imports", "setup", "call", "waits"), _SPELLINGS,
                         ids=[spelling[2].strip() + (" / " + spelling[0]) for spelling in _SPELLINGS])
def test_a_read_in_a_helper_of_another_file_is_reported_at_the_call(tmp_path, imports, setup, call, waits):
    train = _project(tmp_path)
    source = _LOOP.format(imports=f"import torch\n{imports}", setup=setup or "    history = []", call=call)
    train.write_text(source)
    result = migrate_source(source, str(train), select=["AMP100"])
    assert result.error is None
    rows = [d.location.row for d in result.diagnostics]
    call_row = source.splitlines().index(call) + 1
    assert rows == ([call_row] if waits else [])
    if waits:
        message = result.diagnostics[0].message
        assert "in every iteration of the loop at line" in message
        assert ("logger.py:" in message) if "update" in call else ("misc.py:" in message)


def test_without_the_files_name_nothing_is_looked_for(tmp_path):
    """Standard input with no --stdin-filename: no project to read."""
    source = _LOOP.format(imports="import torch\nfrom project.utils import misc", setup="", call="        misc.check_nan_losses(loss)")
    assert migrate_source(source, "<stdin>", select=["AMP100"]).diagnostics == ()


def test_the_cli_names_the_helpers_line(tmp_path):
    from click.testing import CliRunner

    from migrate.cli import main

    train = _project(tmp_path)
    train.write_text(_LOOP.format(imports="import torch\nfrom project.utils import misc", setup="",
                                  call="        misc.check_nan_losses(loss)"))
    result = CliRunner().invoke(main, ["--check", "--select", "AMP100", "-q", str(train)])
    assert "`misc.check_nan_losses(loss)` reads a training-step tensor on the host in `check_nan_losses` " \
           "(project/utils/misc.py:5)" in textwrap.dedent(result.output)


_BACKWARD_HELPER = """\
def contrastive_step(model, batch, scaler):
    loss = model(batch).mean()
    scaler.scale(loss).backward()
    return loss.detach()
"""


@pytest.mark.parametrize(("inside", "reported"), [(True, True), (False, False)])
def test_a_backward_pass_in_a_helper_of_another_file_under_the_callers_autocast(tmp_path, inside, reported):
    (tmp_path / ".git").mkdir()
    (tmp_path / "steps.py").write_text(_BACKWARD_HELPER)
    call = "contrastive_step(model, batch, scaler)"
    body = (f"        with torch.autocast('cuda'):\n            loss = {call}\n" if inside else
            f"        loss = {call}\n")
    source = ("import torch\nfrom steps import contrastive_step\n\n\n"
              "def train(model, optimizer, loader, scaler):\n    for batch in loader:\n" + body +
              "        scaler.step(optimizer)\n        scaler.update()\n")
    (tmp_path / "train.py").write_text(source)
    found = migrate_source(source, str(tmp_path / "train.py"), select=["AMP104"]).diagnostics
    assert [d.message.split(" runs")[0] for d in found] == ([f"`{call}`"] if reported else [])
    if reported:
        assert "(`contrastive_step`, " in found[0].message and "steps.py:3)" in found[0].message
