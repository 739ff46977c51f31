"""AMP105 leaves alone a scaler made by a function that runs a whole training, called once per
run or seed, where its loop over epochs iterates a name bound to the epochs
(``train_iterator = trange(start, int(args.num_train_epochs))``, then ``for _ in train_iterator:``):
each run rightly starts a fresh scaler, as apex's ``initialize`` did. The loop's head alone did
not say "epoch" (allenai/EmbeddingRecycling's ``run_squad.py``, on the rewrite's own scaler). A
name bound to the batches of one epoch still counts as a loop inside the training."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

SCRIPT = """\
import torch
from tqdm import trange


def train(args, model, optimizer, loader):
    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)
    {iterator} = {made}
    for _ in {iterator}:
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.float16, enabled=args.fp16):
                loss = torch.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()


def main(args, make):
    {runs}
        model, optimizer, loader = make()
        train(args, model, optimizer, loader)
"""
ITERATORS = ["train_iterator", "passes"]
EPOCHS = {
    "trange": "trange(0, int(args.num_train_epochs), desc='Epoch')",
    "range": "range(args.epochs)",
    "tqdm": "__import__('tqdm').tqdm(range(n_epochs))",
}
RUNS = {"while": "run = 0\n    while run < args.runs:\n        run += 1", "for": "for seed in args.seeds:"}


def _amp105(source: str) -> list[str]:
    return [d.message for d in migrate_source(source, "train.py", select=["AMP105"], fix=False).diagnostics]


@pytest.mark.parametrize("iterator, epochs, runs", list(itertools.product(ITERATORS, EPOCHS, RUNS)))
def test_a_scaler_per_whole_training_run_is_not_reported(iterator, epochs, runs):
    source = SCRIPT.format(iterator=iterator, made=EPOCHS[epochs].replace("n_epochs", "args.n_epochs"), runs=RUNS[runs])
    compile(source, "train.py", "exec")
    assert _amp105(source) == [], source


@pytest.mark.parametrize("iterator, runs", list(itertools.product(ITERATORS, RUNS)))
def test_a_scaler_per_pass_of_batches_is_still_reported(iterator, runs):
    # the caller loops over epochs and the function's outer loop iterates something else
    source = SCRIPT.format(iterator=iterator, made="range(args.repeats)", runs=RUNS[runs].replace("args.runs", "args.epochs")
                           .replace("seed in args.seeds", "epoch in range(args.epochs)"))
    compile(source, "train.py", "exec")
    assert len(_amp105(source)) == 1, source
