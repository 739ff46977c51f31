"""A reason that is about one ``amp.initialize`` of several (its O2 or O3 level) is marked at that
call, not at the file's first: two functions setting up at O1 and at O2 (davidtvs/pytorch-lr-finder's
example notebook) had the O2 review above the O1 call, and the O2 call said only what to run."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source

SETUP = """def setup_{name}(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="{level}")
    return model, opt
"""
TRAIN = """def train(model, opt, loader):
    for x in loader:
        loss = model(x).sum()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
"""


@pytest.mark.parametrize("levels", [("O1", "O2"), ("O2", "O1"), ("O1", "O3")])
@pytest.mark.parametrize("trains", [True, False])
def test_the_level_review_stands_above_its_own_call(levels, trains):
    parts = [SETUP.format(name=f"s{i}", level=level) for i, level in enumerate(levels)] + ([TRAIN] if trains else [])
    source = "import torch\nfrom apex import amp\n\n\n" + "\n\n".join(parts)
    new = migrate_source(source, "train.py", unsafe_fixes=True).new_source
    assert new is not None and "amp.initialize(" not in new, new
    odd = next(level for level in levels if level != "O1")
    functions = new.split("\ndef ")
    holder = next(text for text in functions if text.startswith(f"setup_s{levels.index(odd)}"))
    other = next(text for text in functions if text.startswith(f"setup_s{levels.index('O1')}"))
    assert f"{odd} keeps fp16 weights" in " ".join(holder.replace("#", " ").split()), new
    assert f"{odd} keeps fp16 weights" not in " ".join(other.replace("#", " ").split()), new
