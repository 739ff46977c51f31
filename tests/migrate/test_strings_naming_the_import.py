"""A string that is code naming apex's import counts as a use of it (``__all__ = ["amp"]``,
``eval("amp.scale_loss(...)")``); a string that only contains the name does not: a command-line
option (``"--use-amp"`` parses as ``-(-use - amp)``) or a file's path or name (``"ckpt/amp.pt"``
is a division, ``"amp.pth"`` an attribute). An unused ``from apex import amp`` beside those is
removed, as beside any other string."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source

SCRIPT = '''\
import argparse
import os
from apex import amp

parser = argparse.ArgumentParser()
{line}
args = parser.parse_args()
'''
# (the line, whether it names the import as code)
LINES = {
    "option": ('parser.add_argument("--use-amp", action="store_true")', False),
    "short_option": ("parser.add_argument('-amp', type=int)", False),
    "option_value": ('parser.add_argument("--scaler", default="-amp")', False),
    "file_name": ('state = os.path.join("out", "amp.pth")', False),
    "json_name": ('state = "amp_state.json"', False),
    "path": ('state = "checkpoints/amp.pt"', False),
    "windows_path": (r'state = "checkpoints\\amp.ckpt"', False),
    "nested_path": ('state = os.path.expanduser("~/runs/amp/last.pt")', False),
    "exported": ('__all__ = ["amp"]', True),
    "evaluated": ('scaled = eval("amp.scale_loss")', True),
    "annotation": ('handle: "amp" = None', True),
}


@pytest.mark.parametrize("case", LINES)
def test_only_a_string_that_is_code_naming_the_import_keeps_it(case):
    line, names_it = LINES[case]
    result = migrate_source(SCRIPT.format(line=line), filename="train.py")
    assert ("from apex import amp" in result.new_source) == names_it, [d.message for d in result.diagnostics]
