"""Where a migration's ``import torch`` goes in a file that opens with relative imports: above
them, as isort orders a file (libcst puts it after the last import, so a package's training script
read ``from .models import Net`` then ``import torch``). Over the ways a file opens: a docstring or
a licence comment or nothing, absolute imports above or none, a comment above the relative
imports, the spellings of a relative import, and apex's import before or after them."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

HEADERS = {"none": "", "docstring": '"""Train the model."""\n', "licence": "# Copyright the authors.\n"}
ABSOLUTE = {"none": "", "one": "import os\n", "groups": "import os\n\nimport numpy as np\n\n"}
COMMENTS = {"none": "", "comment": "# this package's modules\n"}
RELATIVE = ["from .models import Net\n", "from . import utils\n", "from ..pkg.models import Head, Net\n"]
APEX = {"after": "{relative}from apex import amp\n", "before": "from apex import amp\n{relative}"}
BODY = ("\n\ndef train(model, optimizer, loader):\n"
        '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
        "    for x, y in loader:\n"
        "        loss = model(x).sum()\n"
        "        optimizer.zero_grad()\n"
        "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "            scaled_loss.backward()\n"
        "        optimizer.step()\n")


def _source(header, absolute, comment, relative, apex):
    return HEADERS[header] + ABSOLUTE[absolute] + APEX[apex].format(relative=COMMENTS[comment] + relative) + BODY


@pytest.mark.parametrize("header, absolute, comment, relative, apex",
                         list(itertools.product(HEADERS, ABSOLUTE, COMMENTS, RELATIVE, APEX)))
def test_an_added_torch_import_goes_above_the_relative_imports(header, absolute, comment, relative, apex):
    new = migrate_source(_source(header, absolute, comment, relative, apex), "train.py").new_source
    assert new is not None
    lines = new.splitlines()
    torch_at, relative_at = lines.index("import torch"), lines.index(relative.strip())
    assert torch_at < relative_at, new
    if absolute != "none":  # with the absolute imports above it
        assert lines[torch_at - 1] == ABSOLUTE[absolute].strip().splitlines()[-1], new
    if comment != "none" and header != "docstring" and (absolute, apex) == ("none", "after"):
        # no statement above it: the file's opening comments, which stay first
        assert lines.index(COMMENTS[comment].strip()) < torch_at, new
    elif comment != "none":  # the comment stays on the relative import
        assert lines[relative_at - 1] == COMMENTS[comment].strip(), new
    if header != "none":
        assert lines[0] == HEADERS[header].strip(), new
    assert "\n\n\n\n" not in new and not new.startswith("\n"), new
    assert "from apex" not in new, new
    compile(new, "train.py", "exec")
    assert migrate_source(new, "train.py").new_source in (None, new), "not idempotent"


def test_an_import_already_above_the_relative_ones_stays_where_it_is():
    source = "import torch\nfrom .models import Net\nfrom apex import amp\n" + BODY
    new = migrate_source(source, "train.py").new_source
    assert new.startswith("import torch\nfrom .models import Net\n\n\ndef train"), new


def test_an_import_after_other_statements_is_left_where_libcst_put_it():
    # a relative import after code (sys.path set up first) is not the file's opening imports
    source = "import sys\nsys.path.insert(0, '.')\nfrom .models import Net\nfrom apex import amp\n" + BODY
    new = migrate_source(source, "train.py").new_source
    assert new is not None and "import torch" in new and "sys.path.insert" in new, new
    compile(new, "train.py", "exec")
