"""A block whose first statement a fix removes does not open on a blank line.

``if is_fp16 and not APEX_AVAILABLE: is_fp16 = False`` first in a function, then a blank line and
the rest: the fallback goes (native amp needs no install), and the blank line that stood after
it used to open the function's body. So did the one after ``from apex import amp`` first in an
``if args.fp16:`` arm or a function. Generated holders (a function, a method, an ``if`` arm, a
loop), blank lines (one or two) and a comment before the next statement vary; the comment stays,
and a blank line the file itself opened a block with stays too.
"""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

IMPORT = "import torch\n\ntry:\n    from apex import amp\n    APEX_AVAILABLE = True\nexcept ImportError:\n    APEX_AVAILABLE = False\n\n\n"
FALLBACK = "if is_fp16 and not APEX_AVAILABLE:\n    is_fp16 = False\n"
REST = "model = torch.nn.Linear(2, 2)\nprint(model, is_fp16)\n"
TRAIN = ("\n\ndef train(model, optimizer, x, y):\n"
         "    model, optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n"
         "    loss = torch.nn.functional.mse_loss(model(x), y)\n"
         "    with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
         "        scaled_loss.backward()\n"
         "    optimizer.step()\n")
# what holds the fallback, and the indentation of its body
HOLDERS = {
    "function": ("def build(is_fp16=True):\n", "    "),
    "method": ("class Builder:\n    def build(self, is_fp16=True):\n", "        "),
    "if_arm": ("is_fp16 = True\nif __name__ == \"__main__\":\n", "    "),
    "loop": ("for is_fp16 in (True, False):\n", "    "),
}
GAPS = {"one_blank": "\n", "two_blanks": "\n\n", "blank_then_comment": "\n# the model\n"}


def _indented(text: str, indent: str) -> str:
    return "".join(indent + line if line.strip() else line for line in text.splitlines(keepends=True))


@pytest.mark.parametrize(("holder", "gap"), list(itertools.product(sorted(HOLDERS), sorted(GAPS))))
def test_the_body_opens_on_its_first_statement(holder, gap):
    header, indent = HOLDERS[holder]
    source = IMPORT + header + _indented(FALLBACK + GAPS[gap] + REST, indent) + TRAIN
    new = migrate_source(source, "build.py").new_source
    assert "APEX_AVAILABLE" not in new, new
    lines = new.splitlines()
    opened = lines.index(header.splitlines()[-1]) + 1
    assert lines[opened].strip(), new
    if "comment" in gap:
        assert lines[opened].strip() == "# the model", new


def test_a_blank_line_the_file_opened_a_block_with_stays():
    source = IMPORT + "def build(is_fp16=True):\n\n    model = torch.nn.Linear(2, 2)\n" + _indented(FALLBACK, "    ") + "    return model\n" + TRAIN
    new = migrate_source(source, "build.py").new_source
    assert "APEX_AVAILABLE" not in new and "def build(is_fp16=True):\n\n    model" in new, new


# a local import of apex first in its block, then a blank line (or a comment), then its use
LOCAL_HOLDERS = {
    "if_arm": ("def infer(model, fp16=True):\n    if fp16:\n", "        ", "    return model\n"),
    "function": ("def infer(model):\n", "    ", "    return model\n"),
}
USE = 'model, _ = amp.initialize(model, [], opt_level="O1")\n'


@pytest.mark.parametrize(("holder", "gap"), list(itertools.product(sorted(LOCAL_HOLDERS), sorted(GAPS))))
def test_a_block_opening_with_apex_s_import_opens_on_what_follows_it(holder, gap):
    header, indent, tail = LOCAL_HOLDERS[holder]
    source = "import torch\n\n\n" + header + _indented("from apex import amp\n" + GAPS[gap] + USE, indent) + tail
    new = migrate_source(source, "infer.py", unsafe_fixes=True).new_source
    assert "from apex" not in new, new
    lines = new.splitlines()
    opened = lines.index(header.splitlines()[-1]) + 1
    assert lines[opened].strip(), new
