"""The imports a round of fixes removes: without libcst's scope analysis where nothing reads the
name any more (most of a fixing run's time went to it), and the same text as with it."""
from __future__ import annotations

import libcst as cst
import pytest
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import RemoveImportsVisitor

from migrate import import_changes
from migrate.import_changes import _schedule
from migrate.types import ImportChange

AMP = ImportChange("apex", "amp", None)
UNREAD = [
    "from apex import amp\nimport torch\n\nx = torch.ones(1)\n",
    "import torch\nfrom apex import amp, optimizers\n\nopt = optimizers.FusedAdam\n",
    "import torch\nfrom apex import (\n    optimizers,\n    amp,\n)\n\nopt = optimizers.FusedAdam\n",
    "# the mixed-precision library\nfrom apex import amp  # for fp16\n\n\ndef f(model):\n    return model.amp\n",
    "import torch\ntry:\n    from apex import amp\n    has_apex = True\nexcept ImportError:\n    has_apex = False\n",
    "import torch\n\nif fp16:\n    from apex import amp\ny = 1\n",
]


def _with_libcst(source: str, removes: list[ImportChange]) -> str:
    context = CodemodContext(filename="train.py")
    for imp in removes:
        RemoveImportsVisitor.remove_unused_import(context, imp.module, imp.obj, imp.asname)
    module = import_changes._comments_kept(RemoveImportsVisitor)(context).transform_module(cst.parse_module(source))
    before = import_changes._empty_ifs(cst.parse_module(source))
    if import_changes._empty_ifs(module) - before:
        module = module.visit(import_changes._DropEmptyIfs(before))
    return module.code


@pytest.mark.parametrize("source", UNREAD)
def test_an_unread_name_goes_without_the_scope_analysis_and_as_libcst_removes_it(source, monkeypatch):
    expected = _with_libcst(source, [AMP])

    def refuse(*args, **kwargs):
        raise AssertionError("libcst's scope analysis ran for a name nothing reads")

    monkeypatch.setattr(RemoveImportsVisitor, "transform_module", refuse)
    assert _schedule(cst.parse_module(source), [], [AMP], "train.py").code == expected
    assert "import amp" not in expected and "amp, " not in expected


@pytest.mark.parametrize("source", [
    "from apex import amp\n\n\ndef train(amp=None):\n    return amp\n",  # a parameter of that name: the scope decides
    "from apex import amp\n\nprint(amp)\n",  # still read: kept
])
def test_a_name_still_spelled_somewhere_is_left_to_libcst(source):
    assert _schedule(cst.parse_module(source), [], [AMP], "train.py").code == _with_libcst(source, [AMP])


def test_the_check_for_reads_skips_attributes_and_imports():
    module = cst.parse_module("from apex import amp\nimport amp_utils\n\nx = model.amp\n")
    assert import_changes._unread_names(module, {"amp"}) == {"amp"}
    assert import_changes._unread_names(cst.parse_module("from apex import amp\namp.init()\n"), {"amp"}) == set()
