"""A repository of sibling experiments, each folder with a ``utils.py`` of its own: ``CIFAR/utils.py``
scales a loss with apex (an attack's backward), ``ImageNet/lib/utils.py`` calls no apex and is put on
``sys.path`` by the ImageNet script. ``from utils import *`` in ``ImageNet/main.py`` loads the module
of that name nearest it in the tree, not the sibling experiment's: the ImageNet script is no half
of the CIFAR one, and migrates on its own."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from migrate import api

MAIN = '''\
import sys

import torch
{import_line}
from apex import amp

sys.path.insert(0, "lib")


def main():
    net = torch.nn.Linear(3, 1)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    net, sgd = amp.initialize(net, sgd, opt_level="O1")
    batches = [torch.randn(4, 3), torch.randn(2, 3)]
    while batches:
        out = net(batches.pop()).mean()
        with amp.scale_loss(out, sgd) as scaled:
            scaled.backward()
        sgd.step()
        sgd.zero_grad(set_to_none=True)
'''
ATTACK = '''\
from apex import amp


def perturb(net, batch, opt=None):
    batch.requires_grad_(True)
    loss = net(batch).sum()
    if opt is not None:
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
    else:
        loss.backward()
    return batch.grad.sign()
'''
IMPORTS = ["from utils import *", "import utils", "from utils import accuracy"]
# where the ImageNet script's own `utils` lies, below its folder
OWN_UTILS = ["lib/utils.py", "tools/common/utils.py", "lib/utils/__init__.py"]


def _experiments(root: Path, import_line: str, own: str | None) -> Path:
    (root / ".git").mkdir(parents=True)
    (root / "CIFAR").mkdir()
    (root / "CIFAR" / "utils.py").write_text(ATTACK)
    (root / "CIFAR" / "train.py").write_text("from utils import perturb\n")
    imagenet = root / "ImageNet"
    imagenet.mkdir()
    (imagenet / "main.py").write_text(MAIN.format(import_line=import_line))
    if own is not None:
        (imagenet / own).parent.mkdir(parents=True, exist_ok=True)
        (imagenet / own).write_text("def accuracy(output, target):\n    return (output == target).float().mean()\n")
    return imagenet / "main.py"


@pytest.mark.parametrize("import_line, own", list(itertools.product(IMPORTS, OWN_UTILS)))
def test_a_sibling_experiments_utils_is_no_half_of_the_script(tmp_path, import_line, own):
    main = _experiments(tmp_path, import_line, own)
    result = api.migrate_paths([str(main)], write=False)[0]
    assert result.changed and "apex" not in result.new_source, [d.message for d in result.diagnostics]


@pytest.mark.parametrize("import_line", IMPORTS[:2])
def test_without_a_nearer_module_the_only_one_of_that_name_is_the_half(tmp_path, import_line):
    """No ``utils`` of the script's own: the sibling's may be the one on the path, and all of it
    is imported; left alone (``from utils import accuracy`` takes nothing that scales a loss)."""
    main = _experiments(tmp_path, import_line, None)
    result = api.migrate_paths([str(main)], write=False)[0]
    assert not result.changed
    assert any("CIFAR/utils.py" in d.message for d in result.diagnostics), [d.message for d in result.diagnostics]
