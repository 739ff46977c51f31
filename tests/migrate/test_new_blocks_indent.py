"""The blocks a rewrite writes are indented as the code around them. libcst takes a file's default
indentation from its first block, so a file whose first helper is indented by three spaces (or two,
or a tab) and whose training function by four got three-space bodies inside a four-space function."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_paths

HELPER = "def seed_all(seed):\n{u}torch.manual_seed(seed)\n{u}if seed:\n{u}{u}torch.cuda.manual_seed(seed)\n\n\n"

# the training function, written with "    " and re-indented with the variant's unit
TRAIN = '''def train(model, optimizer, loader, args):
    model, optimizer = amp.initialize(model, optimizer, opt_level={level})
    for x, y in loader:
        optimizer.zero_grad()
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
{backward}        optimizer.step()
'''
BACKWARDS = {
    "plain": "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n            scaled_loss.backward()\n",
    "flag": ("        if args.fp16:\n            with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
             "                scaled_loss.backward()\n        else:\n            loss.backward()\n"),
}
LEVELS = ('"O1"', "args.opt_level")
HELPER_UNITS = ("   ", "  ", "\t")
TRAIN_UNITS = ("    ", "  ")


def _reindented(text: str, unit: str) -> str:
    lines = []
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip(" ")
        lines.append(unit * ((len(line) - len(stripped)) // 4) + stripped)
    return "".join(lines)


def _indents(text: str) -> set[str]:
    return {line[: len(line) - len(line.lstrip())] for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")}


@pytest.mark.parametrize("helper_unit, train_unit, level, backward",
                         [case for case in itertools.product(HELPER_UNITS, TRAIN_UNITS, LEVELS, BACKWARDS) if case[0] != case[1]])
def test_new_blocks_take_the_indentation_of_the_function_they_are_written_in(tmp_path, helper_unit, train_unit, level, backward):
    train = _reindented(TRAIN.format(level=level, backward=BACKWARDS[backward]), train_unit)
    path = tmp_path / "train.py"
    path.write_text("import torch\nfrom apex import amp\n\n\n" + HELPER.format(u=helper_unit) + train)
    result, = migrate_paths([path], unsafe_fixes=True)
    assert result.changed
    text = path.read_text()
    compile(text, str(path), "exec")
    rewritten = text[text.index("def train("):]
    assert "torch.autocast(" in rewritten
    # every line of the training function is indented by whole units of its own
    assert all(indent == train_unit * (len(indent) // len(train_unit)) for indent in _indents(rewritten)), rewritten
    assert text[: text.index("def train(")].count(helper_unit) >= 3  # the helper keeps its own
