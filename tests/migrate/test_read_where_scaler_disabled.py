"""AMP101 on a gradient read where the GradScaler is off: the scaler made with
``enabled=<flag>`` (``args.fp16``, ``bool(args.fp16)``, ``args.fp16 and args.level != "O0"``) and
the read in an arm where that flag fails (``else:`` of ``if args.fp16:``, ``if not args.fp16:``).
A disabled scaler's ``scale(loss)`` is the loss itself, so the gradients there are true ones and
nothing is reported; the rewrite writes such arms (``if args.fp16: scaler.unscale_(optimizer);
clip(...) else: clip(...)``), and its own lint flagged them (CLUENER2020, the HF example scripts)."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

LOOP = """\
import torch


def train(args, model, optimizer, loader):
    scaler = torch.amp.GradScaler("cuda", enabled={enabled})
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
{read}
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""
CLASS = """\
import torch


class Trainer:
    def __init__(self, args, model, optimizer):
        self.args, self.model, self.optimizer = args, model, optimizer
        self.scaler = torch.amp.GradScaler("cuda", enabled={enabled})

    def step(self, x, y):
        args, model, optimizer, scaler = self.args, self.model, self.optimizer, self.scaler
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler.is_enabled()):
            loss = torch.nn.functional.mse_loss(model(x), y)
        self.scaler.scale(loss).backward()
{read}
        self.scaler.step(optimizer)
        self.scaler.update()
"""
ENABLED = {  # the scaler's `enabled=`, and whether it is off where `args.fp16` fails
    "flag": ("args.fp16", True),
    "bool": ("bool(args.fp16)", True),
    "and_level": ('args.fp16 and args.level != "O0"', True),
    "level_and": ('args.level != "O0" and args.fp16', True),
    "bool_and_level": ('bool(args.fp16) and args.level != "O0"', True),
    "bool_of_and": ('bool(args.fp16 and args.level != "O0")', True),
    "other_flag": ("args.amp", False),
    "or_level": ('args.fp16 or args.level != "O0"', False),
}
READS = {
    "clip": "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    "norm": "norm = sum(float(p.grad.norm()) for p in model.parameters())",
}
ARMS = {  # where the read runs, and whether `args.fp16` fails there
    "else": ("if args.fp16:\n    {unscale}.unscale_(optimizer)\n    {read}\nelse:\n    {read}", True),
    "not": ("if not args.fp16:\n    {read}", True),
    "flag": ("if args.fp16:\n    {read}", False),
}
HOLDERS = {"local": (LOOP, "scaler"), "attribute": (CLASS, "self.scaler")}


@pytest.mark.parametrize("enabled, read, arm, holder", list(itertools.product(ENABLED, READS, ARMS, HOLDERS)))
def test_a_read_where_the_scaler_is_off_is_not_reported(enabled, read, arm, holder):
    template, scaler = HOLDERS[holder]
    expression, off_where_flag_fails = ENABLED[enabled]
    arm_text, flag_fails = ARMS[arm]
    body = arm_text.format(unscale=scaler, read=READS[read])
    source = template.format(enabled=expression, read="\n".join(" " * 8 + line for line in body.splitlines()))
    compile(source, "train.py", "exec")
    reported = "AMP101" in {d.code for d in migrate_source(source, filename="train.py", fix=False).diagnostics}
    assert reported == (not (off_where_flag_fails and flag_fails)), source
