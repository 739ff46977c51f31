"""A marker asking for the forward pass under autocast names the opt level the file ran apex at."""
import pytest

from migrate.api import migrate_source

SOURCE = '''\
import torch
from apex import amp


def setup(model, optimizer):
    return amp.initialize(model, optimizer, opt_level="{level}")


def backward(loss, optimizer):
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
'''


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_the_marker_names_the_files_level(level):
    fixed = migrate_source(SOURCE.format(level=level), "train.py", unsafe_fixes=True).new_source
    assert "(the forward pass) under" in fixed, fixed
    assert f"apex {level} cast it" in " ".join(line.strip("# ") for line in fixed.splitlines()), fixed
