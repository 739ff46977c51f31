"""Where the autocast region starts: at the model's forward pass, or at a network the loss is
computed from before it (a teacher); not at lines that only move the batch (``Variable``,
``.cuda()``), however they are spelled."""
import itertools

import pytest

from migrate.api import migrate_source

MOVES = ["inputs = Variable(inputs.cuda())", "inputs, labels = Variable(inputs.cuda()), Variable(labels.cuda())",
         "inputs = inputs.cuda(non_blocking=True)", "inputs = Variable(inputs).cuda()"]
BETWEEN = ["", "optimizer.zero_grad()"]


@pytest.mark.parametrize("move,between", list(itertools.product(MOVES, BETWEEN)))
def test_moving_the_batch_stays_outside_the_region(move, between):
    lines = [move, between, "outputs = model(inputs)", "loss = criterion(outputs, labels)"]
    body = "".join(f"        {line}\n" for line in lines if line)
    source = ("import torch\nfrom torch.autograd import Variable\nfrom apex import amp\n\n\n"
              "def train(model, optimizer, criterion, loader):\n"
              "    model, optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n"
              "    for inputs, labels in loader:\n" + body +
              "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n            scaled_loss.backward()\n"
              "        optimizer.step()\n")
    new = migrate_source(source, filename="train.py").new_source
    region = new.index("with torch.autocast(")
    assert new.index(move) < region < new.index("outputs = model(inputs)"), new
    if between:
        assert new.index(between) < region
