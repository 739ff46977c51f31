"""The comments of a ``with amp.scale_loss(...)`` block are kept by its rewrite, wherever they sit:
on the ``with`` line, above or after the backward, and after the block's last line (a
commented-out ``#loss.backward()``, which belongs to the block's footer). A body that is only the
backward still becomes one line (``scaler.scale(loss).backward()``)."""
from __future__ import annotations

import itertools
import re
import textwrap

import pytest

from migrate.api import migrate_source

SCRIPT = '''\
import torch
import torch.nn.functional as F
from apex import amp


def train(model, optimizer, batches):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
{block}
        optimizer.step()
        optimizer.zero_grad()
'''
# where the comments sit, as lines of the block (`{body}`: the body's statements)
PLACES = {
    "footer": "with amp.scale_loss(loss, optimizer) as scaled_loss:\n{body}\n    #loss.backward()",
    "footer_two_lines": "with amp.scale_loss(loss, optimizer) as scaled_loss:\n{body}\n    # old path:\n    # loss.backward()",
    "above": "with amp.scale_loss(loss, optimizer) as scaled_loss:\n    # the scaled pass\n{body}",
    "header": "with amp.scale_loss(loss, optimizer) as scaled_loss:  # apex\n{body}",
    "header_and_footer": "with amp.scale_loss(loss, optimizer) as scaled_loss:  # apex\n{body}\n    #loss.backward()",
}
BODIES = {"backward": "    scaled_loss.backward()",
          "two_lines": "    scaled_loss.backward()\n    print(float(scaled_loss))"}


@pytest.mark.parametrize("place, body", list(itertools.product(PLACES, BODIES)))
def test_every_comment_of_the_block_is_kept(place, body):
    block = PLACES[place].format(body=BODIES[body])
    source = SCRIPT.format(block=textwrap.indent(block, " " * 8))
    new = migrate_source(source, "train.py").new_source
    assert "amp.scale_loss" not in new, new
    for comment in re.findall(r"#.*", block):
        assert comment in new, (comment, new)
    if body == "backward":
        assert "scaler.scale(loss).backward()" in new, new
