"""A script that initializes apex in a block at its top level (``if args.use_apex:`` holding more
than the call) and imports more further down (``import math`` after the block, a gaze-estimation
trainer's). The disabled GradScaler standing in until the block has run went after the last
import, below the block: it replaced the enabled scaler the block had made, and every run with
the flag on trained in float32 with no loss scale. It goes before the block now.
"""
from __future__ import annotations

import shutil
import textwrap

import pytest

from migrate.api import migrate_paths, migrate_source

pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

SCRIPT = """import argparse

import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--amp", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1).to("cuda")
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
if args.amp:
{block}
{late_import}


def train():
    for _ in range(12):
        x, y = torch.randn(4, 8, device="cuda"), torch.randn(4, 1, device="cuda")
        loss = torch.nn.functional.mse_loss(model(x), y) * math.sqrt(1.0)
        optimizer.zero_grad()
        if args.amp:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()


train()
"""
# a block that sets what the call reads: the scaler cannot be made before the `if` (a stand-in is)
BLOCKS = {
    "level_set_first": 'level = "O1"\nmodel, optimizer = amp.initialize(model, optimizer, opt_level=level, verbosity=0)',
    "levels_table": 'levels = {"amp": "O1"}\nmodel, optimizer = amp.initialize(model, optimizer, opt_level=levels["amp"], verbosity=0)',
}
LATE_IMPORTS = {"import": "import math", "from": "from math import sqrt\nimport math", "aliased": "import math as math"}


def _script(block: str, late: str) -> str:
    return SCRIPT.format(block=textwrap.indent(BLOCKS[block], "    "), late_import="\n" + LATE_IMPORTS[late])


@pytest.mark.parametrize("block", sorted(BLOCKS))
@pytest.mark.parametrize("late", sorted(LATE_IMPORTS))
def test_the_disabled_scaler_goes_before_the_block(block, late):
    source = _script(block, late)
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert "from apex import" not in new, new
    disabled = new.index('scaler = torch.amp.GradScaler("cuda", enabled=False)')
    block = new.index("if args.amp:")
    assert disabled < block and new.find('scaler = torch.amp.GradScaler("cuda"', block) > block, new
    assert new.count("enabled=False)") == 1, new


@pytest.mark.slow
def test_the_rewrite_trains_with_the_flag_on_as_apex_did(tmp_path):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = tmp_path / "original"
    original.mkdir()
    (original / "train.py").write_text(_script("level_set_first", "import"))
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    for argv in ([], ["--amp"]):
        result = compare(Target(str(original / "train.py")), Target(str(migrated / "train.py")), argv, device="cpu",
                         steps=12, parallel=True, timeout=600)
        assert result.verdict == SAME, (argv, as_text(result))
