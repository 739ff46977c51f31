"""A parameter list (or a call's arguments) written one a line with a comment on each: the
GradScaler's parameter and argument are added below the last, and every comment stays on the
line of the item it was written for (the last one's once moved down to the new line, and the one
before it was copied up)."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

SCRIPT = """import torch
from apex import amp


def train(
    model,  # the network
{before_last}    loader{default},  # the batches
{closing}):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        with amp.scale_loss(loss, OPTIMIZERS[0]) as scaled_loss:
            scaled_loss.backward()
        OPTIMIZERS[0].step()


OPTIMIZERS = []


def main(model, optimizer, loader):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    OPTIMIZERS.append(optimizer)
    train(
        model,  # what trains
{call_before_last}        loader,  # what it reads
{call_closing}    )
"""
BEFORE_LAST = {"nothing": "", "a comment line": "    # the data comes last\n"}
CLOSING = {"nothing": "", "a comment line": "    # no more\n"}
DEFAULTS = {"positional": "", "with a default": "=()"}


def _script(before: str, closing: str, default: str) -> str:
    return SCRIPT.format(before_last=BEFORE_LAST[before], closing=CLOSING[closing], default=DEFAULTS[default],
                         call_before_last=BEFORE_LAST[before].replace("    #", "        #"),
                         call_closing=CLOSING[closing].replace("    #", "        #"))


@pytest.mark.parametrize("before, closing, default", list(itertools.product(BEFORE_LAST, CLOSING, DEFAULTS)))
def test_each_comment_stays_with_its_item(before, closing, default):
    source = _script(before, closing, default)
    new = migrate_source(source, "train.py").new_source
    assert new is not None and "scaler=scaler" in new, new
    lines = new.splitlines()
    for item, comment in (("model,", "# the network"), (f"loader{DEFAULTS[default]},", "# the batches"),
                          ("model,", "# what trains"), ("loader,", "# what it reads")):
        assert any(line.strip().startswith(item) and line.rstrip().endswith(comment) for line in lines), (item, new)
    for comment in ("# the network", "# the batches", "# what trains", "# what it reads"):
        assert new.count(comment) == 1, new  # never copied
    for added in ("scaler: torch.amp.GradScaler", "scaler=scaler"):
        line = next(line for line in lines if added in line)
        assert "#" not in line, new  # the new item takes no one's comment
    if before != "nothing":
        assert new.count("# the data comes last") == 2, new  # the parameter's and the call's, once each
    if closing != "nothing":
        assert new.count("# no more") == 2, new
    compile(new, "train.py", "exec")
