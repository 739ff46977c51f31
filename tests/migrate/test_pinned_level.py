"""``initialize`` under a test that fixes its run-time opt level (``if c.level == "O1":``): the
rewrite needs no check against O2/O3 (it could never fire) and no ``level != "O0"`` beside the
test (it always holds there)."""
import pytest

from migrate.api import migrate_source

SCRIPT = '''\
import torch
from apex import amp


def train(model, optimizer, batches, c):
    if {test}:
        model, optimizer = amp.initialize(model, optimizer, opt_level={level})
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        if {test}:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
'''
TESTS = {
    "level first": ('c.amp_level == "O1"', "c.amp_level"),
    "level last": ("'O1' == c.amp_level", "c.amp_level"),
    "beside a flag": ('c.fp16 and c.amp_level == "O1"', "c.amp_level"),
    "parenthesized": ('c.fp16 and (c.amp_level == "O1")', "c.amp_level"),
}


@pytest.mark.parametrize("test", sorted(TESTS))
def test_a_pinned_level_needs_no_check_and_no_o0_test(test):
    condition, level = TESTS[test]
    result = migrate_source(SCRIPT.format(test=condition, level=level), filename="train.py")
    fixed = result.new_source
    assert "from apex" not in fixed and "amp.initialize" not in fixed, fixed
    assert "RuntimeError" not in fixed and '!= "O0"' not in fixed, fixed
    assert not any(d.fix and d.fix.why_unsafe for d in result.diagnostics), result.diagnostics


def test_a_level_pinned_to_o2_keeps_its_check():
    result = migrate_source(SCRIPT.format(test='c.amp_level == "O2"', level="c.amp_level"), filename="train.py")
    assert "amp.initialize" in result.new_source or "RuntimeError" in result.new_source or any(
        d.fix and d.fix.why_unsafe for d in result.diagnostics), result.new_source
