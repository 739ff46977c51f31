"""The clip of ``amp.master_params`` sits in an ``if`` testing the flag the scaled backward runs
under (``if args.fp16: clip(amp.master_params(opt)) else: clip(model.parameters())``): its
``unscale_`` goes in that arm bare, not under a second ``if`` testing the same flag."""
import re

import pytest

from migrate.api import migrate_source

SCRIPT = '''\
import torch
from apex import amp


def train(model, optimizer, batches, {flag}):
{initialize}    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if {flag}:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
{between}        if {flag}:
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
'''
FLAGS = ["fp16", "use_amp"]
BETWEEN = {"nothing": "", "a log line": "        print(float(loss))\n"}
# initialized here, or in another file (this one scales only: an unsafe rewrite with a scaler of its own)
INITIALIZE = {"here": '    if {flag}:\n        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n',
              "elsewhere": ""}


@pytest.mark.parametrize("between", sorted(BETWEEN))
@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("initialize", sorted(INITIALIZE))
def test_the_unscale_in_the_flags_arm_is_not_guarded_again(flag, between, initialize):
    source = SCRIPT.format(flag=flag, between=BETWEEN[between], initialize=INITIALIZE[initialize].format(flag=flag))
    result = migrate_source(source, filename="train.py", unsafe_fixes=True)
    fixed = result.new_source
    assert "from apex" not in fixed and "scaler.unscale_(optimizer)" in fixed, fixed
    assert not re.search(rf"if {flag}:\n\s+if {flag}:", fixed), fixed
    assert re.search(rf"\n( +)if {flag}:\n\1    scaler\.unscale_\(optimizer\)\n\1    torch\.nn\.utils\.clip_grad_norm_\(", fixed), fixed
