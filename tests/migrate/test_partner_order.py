"""A trainer module scaling the loss for several scripts that each initialize apex (a
vision-language project's ``common/trainer.py`` and its ``spasen/train.py``, ``vrd/train.py``): the
trainer's partner, named in its reasons and markers, is the same whatever order the run read the
files in. The triage hands them back in the order its workers finish, and the marker used to cite
one script on one run and the other on the next.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from migrate import half_partners
from migrate.api import migrate_paths

TRAINER = """import torch
from apex import amp


def train(model, optimizer, batches):
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""
SCRIPT = """import torch
from apex import amp

from common.trainer import train


def main(batches):
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", keep_batchnorm_fp32=False)
    train(model, optimizer, batches)
"""
SCRIPTS = ("spasen", "vrd", "pretrain")


def _project(root: Path, scripts: tuple[str, ...]) -> dict[Path, str]:
    (root / "setup.py").write_text("")
    texts = {}
    for folder, text in (("common", TRAINER), *((name, SCRIPT) for name in scripts)):
        (root / folder).mkdir()
        (root / folder / "__init__.py").write_text("")
        path = root / folder / ("trainer.py" if folder == "common" else "train.py")
        path.write_text(text)
        texts[path] = text
    return texts


@pytest.mark.parametrize("count", [2, 3])
def test_the_trainers_partner_does_not_follow_the_order_of_the_texts(tmp_path, count):
    texts = _project(tmp_path, SCRIPTS[:count])
    trainer = tmp_path / "common" / "trainer.py"
    seen = set()
    for order in itertools.permutations(texts):
        found = half_partners.partners({path: texts[path] for path in order}, {})
        seen.add(found[trainer].file)
    assert len(seen) == 1, seen
    assert seen == {"pretrain/train.py"} if count == 3 else {"spasen/train.py"}


def test_the_trainers_marker_names_one_script_run_after_run(tmp_path):
    _project(tmp_path, SCRIPTS)
    trainer = tmp_path / "common" / "trainer.py"
    cited = set()
    for _ in range(3):
        [result] = [r for r in migrate_paths([tmp_path], write=False, unsafe_fixes=True) if r.filename == str(trainer)]
        cited.add(next((name for name in SCRIPTS if f"{name}/train.py:" in result.new_source), None))
    assert len(cited) == 1 and None not in cited, cited
