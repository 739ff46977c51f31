"""The GradScaler handed down more than one call (``main`` makes it, ``train`` calls
``train_epoch``, which calls ``train_step``, which scales): every plain function on the way takes
it and passes it on, as a person would write it, instead of a module global assigned through
``global scaler``. The statement making it, or unpacking it from a builder, may sit in ``with``
blocks (``with Timer("building"):``), which always run their body. Over chain depths, where the
scaler is made, and the blocks around it; and the shapes where a function on the way could be
reached another way keep the global."""
from __future__ import annotations

import itertools
import re

import pytest

from migrate.api import migrate_source

APEX_IMPORT = re.compile(r"^\s*(from|import) apex\b", re.M)
STEP = ("    loss = model(x).sum()\n    optimizer.zero_grad()\n"
        "    with amp.scale_loss(loss, optimizer) as scaled_loss:\n        scaled_loss.backward()\n"
        "    optimizer.step()\n    return loss\n")
INITIALIZE = "model, optimizer = amp.initialize(model, optimizer, opt_level='O1')"
MADE_IN = ["main", "builder"]  # main initializes, or a builder returning model, optimizer does
WITHS = [0, 1, 2]  # `with` blocks around the statement making (or unpacking) the scaler


def _chain(depth: int) -> str:
    """``train_step`` scales; ``level1`` .. ``level{depth-1}`` call down to it."""
    text = f"def train_step(model, optimizer, x):\n{STEP}\n\n"
    below = "train_step(model, optimizer, x)"
    for level in range(1, depth):
        text += f"def level{level}(model, optimizer, loader, epoch=0):\n    for x in loader:\n        {below}\n\n\n"
        below = f"level{level}(model, optimizer, [x], epoch)"
    top = below.replace("[x], epoch", "loader").replace("(model, optimizer, x)", "(model, optimizer, next(iter(loader)))")
    return text, top


def _source(depth: int, made_in: str, withs: int) -> str:
    chain, top = _chain(depth)
    indent = "    " * (withs + 1)
    opening = "".join("    " * (i + 1) + f"with Timer('part {i}'):\n" for i in range(withs))
    if made_in == "main":
        builder = ""
        made = f"{opening}{indent}model, optimizer = Net(), None\n{indent}{INITIALIZE}\n"
    else:
        builder = ("def build(args):\n    model = Net()\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                   f"    {INITIALIZE}\n    return model, optimizer\n\n\n")
        made = f"{opening}{indent}model, optimizer = build(args)\n"
    return ("import torch.nn\nfrom apex import amp\n\n\n" + builder + chain
            + f"def main(args, loader):\n{made}    {top}\n\n\nif __name__ == '__main__':\n    main(parse(), loader())\n")


@pytest.mark.parametrize("depth, made_in, withs", list(itertools.product([1, 2, 3], MADE_IN, WITHS)))
def test_every_function_on_the_way_takes_the_scaler_and_passes_it_on(depth, made_in, withs):
    source = _source(depth, made_in, withs)
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert new is not None and not APEX_IMPORT.search(new), new
    compile(new, "train.py", "exec")
    assert "global scaler" not in new and "import torch\n" not in new, new  # `import torch.nn` binds torch
    assert "def train_step(model, optimizer, x, scaler: torch.amp.GradScaler):" in new, new
    for level in range(1, depth):
        assert f"def level{level}(model, optimizer, loader, epoch=0, *, scaler: torch.amp.GradScaler):" in new, new
    calls = re.findall(r"(?<!def )\b(?:train_step|level\d)\((.*)\)", new)
    assert calls and all(args.endswith("scaler=scaler") for args in calls), calls


KEEPS_THE_GLOBAL = {
    # a function on the way is also handed on as a value: its other callers are not seen
    "stored": "    callbacks = [level1]\n",
    # ... or called at module level, where no scaler is made
    "module_level": None,
    # ... or called by a method, which no call of the file hands the scaler
    "method": "\n\nclass Runner:\n    def run(self, model, optimizer, loader):\n        level1(model, optimizer, loader)\n",
}


@pytest.mark.parametrize("case", sorted(KEEPS_THE_GLOBAL))
def test_where_a_function_on_the_way_could_be_reached_another_way_the_global_stays(case):
    source = _source(3, "main", 0)
    if KEEPS_THE_GLOBAL[case] is None:
        source = source.replace("if __name__ == '__main__':\n", "level2(Net(), None, [])\n\nif __name__ == '__main__':\n")
    else:
        source = source.replace("    level2(model, optimizer, loader)\n", "    level2(model, optimizer, loader)\n" + KEEPS_THE_GLOBAL[case])
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert new is not None and not APEX_IMPORT.search(new), new
    compile(new, "train.py", "exec")
    assert "global scaler" in new and "scaler: torch.amp.GradScaler" not in new, new



# how another file of the project reaches a function on the way (None: it does not)
IMPORTERS = {
    "none": "import json\n",
    "by_name": "from train import {name}\n\n{name}(None, None, [])\n",
    "as_attribute": "import train\n\ntrain.{name}(None, None, [])\n",
    "star": "from train import *\n",
}


@pytest.mark.parametrize("importer, name, made_in", list(itertools.product(IMPORTERS, ["train_step", "level1", "level2", "build"],
                                                                             MADE_IN)))
def test_a_function_another_file_imports_keeps_its_signature(tmp_path, importer, name, made_in):
    """Its calls there would lack the scaler the rewrite adds (or the builder's third value)."""
    from migrate.api import migrate_paths

    if name == "build" and made_in == "main":
        return  # no builder
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "train.py").write_text(_source(3, made_in, 1))
    (tmp_path / "run.py").write_text(IMPORTERS[importer].format(name=name))
    migrate_paths([tmp_path])
    new = (tmp_path / "train.py").read_text()
    assert not APEX_IMPORT.search(new), new
    compile(new, "train.py", "exec")
    assert ("global scaler" in new) is (importer != "none"), new
