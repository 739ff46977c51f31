"""apex's amp handed out by a module of the project is reported where it is used.

A compatibility module (``utils/amp_compat.py``: ``from apex import amp``, in a ``try`` with a
stand-in for machines without apex) hands apex's amp to the training files, which do ``from
utils.amp_compat import amp`` and call ``amp.initialize``, ``amp.scale_loss`` and the cast
decorators through it. The codemod rewrites only an amp imported from apex, so each such use is
reported (AMP016) with the module handing it out, never passed over in silence. Generated projects
vary how the module binds apex's amp, how a file imports it from there, and what it calls; a
module whose ``amp`` is not apex's is never reported.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from migrate import amp_reexports
from migrate.api import migrate_paths

# How `pkg/utils/amp_compat.py` binds apex's amp, as `{name}`.
EXPORTERS = {
    "plain": ("amp", "from apex import amp\n"),
    "aliased": ("apex_amp", "from apex import amp as apex_amp\n"),
    "module_alias": ("amp", "import apex.amp as amp\n"),
    "try_stand_in": ("amp", "try:\n    from apex import amp\nexcept ImportError:\n    class _Amp:\n"
                            "        def initialize(self, model, optimizer=None, **kwargs):\n"
                            "            return model if optimizer is None else (model, optimizer)\n\n"
                            "    amp = _Amp()\n"),
    "if_flag": ("amp", "import os\n\nif os.environ.get('USE_APEX', '1') == '1':\n    from apex import amp\nelse:\n    amp = None\n"),
}
# How `pkg/train.py` reads it: {name} as the exporter binds it; the receiver the calls are made on.
IMPORTERS = {
    "absolute": ("from pkg.utils.amp_compat import {name}\n", "{name}"),
    "absolute_as": ("from pkg.utils.amp_compat import {name} as A\n", "A"),
    "relative": ("from .utils.amp_compat import {name}\n", "{name}"),
    "module_from": ("from pkg.utils import amp_compat\n", "amp_compat.{name}"),
    "module_relative": ("from .utils import amp_compat as compat\n", "compat.{name}"),
    "module_import": ("import pkg.utils.amp_compat\n", "pkg.utils.amp_compat.{name}"),
    "module_import_as": ("import pkg.utils.amp_compat as C\n", "C.{name}"),
    "in_try": ("try:\n    from pkg.utils.amp_compat import {name} as A\nexcept ImportError:\n    A = None\n", "A"),
    "through_package": ("from pkg.utils import {name}\n", "{name}"),  # utils/__init__.py re-exports it
    "through_package_star": ("from pkg.utils import {name} as A\n", "A"),  # utils/__init__.py: `from .amp_compat import *`
}
# What the training file does through it; each line holding `{r}` is one use.
USES = {
    "initialize": "def setup(model, optimizer):\n    return {r}.initialize(model, optimizer, opt_level='O1')\n",
    "scale_loss": "def step(loss, optimizer):\n    with {r}.scale_loss(loss, optimizer) as scaled:\n        scaled.backward()\n"
                  "    optimizer.step()\n",
    "decorator": "@{r}.float_function\ndef kernel(x):\n    return x\n",
    "register": "import torch\n\n{r}.register_half_function(torch, 'einsum')\n",
    "legacy_init": "handle = {r}.init(enabled=True)\n",
}


def _project(root: Path, exporter: str, importer: str, use: str) -> tuple[Path, list[int]]:
    """The generated project: the training file and the lines of its uses of apex's amp."""
    name, binding = EXPORTERS[exporter]
    head, receiver = IMPORTERS[importer]
    utils = root / "pkg" / "utils"
    utils.mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (utils / "__init__.py").write_text({"through_package": f"from .amp_compat import {name}\n",
                                        "through_package_star": "from .amp_compat import *\n"}.get(importer, ""))
    (utils / "amp_compat.py").write_text(binding)
    text = head.format(name=name) + "\n\n" + USES[use].format(r=receiver.format(name=name))
    train = root / "pkg" / "train.py"
    train.write_text(text)
    lines = [number for number, line in enumerate(text.splitlines(), 1) if receiver.format(name=name) + "." in line]
    return train, lines


def _amp016(train: Path) -> list:
    """AMP016's findings in ``train``, its project checked."""
    [result] = [r for r in migrate_paths([train.parent.parent], write=False, fix=False) if r.filename == str(train)]
    return sorted((d for d in result.diagnostics if d.code == "AMP016"), key=lambda d: d.location.row)


# every exporter with every importer scaling a loss, and every use with a spread of importers;
# `init` is a name too common to make a file worth reading alone: only through a name spelled `amp`
CASES = sorted(case for case in {*itertools.product(EXPORTERS, IMPORTERS, ["scale_loss"]),
                                 *itertools.product(EXPORTERS, ["absolute", "module_from", "in_try", "through_package_star"], USES)}
               if case[2] != "legacy_init" or IMPORTERS[case[1]][1].format(name=EXPORTERS[case[0]][0]).split(".")[-1] == "amp")


@pytest.mark.parametrize(("exporter", "importer", "use"), CASES)
def test_each_use_of_a_reexported_amp_is_reported(tmp_path: Path, exporter: str, importer: str, use: str) -> None:
    train, lines = _project(tmp_path, exporter, importer, use)
    found = _amp016(train)
    assert [d.location.row for d in found] == lines, (train.read_text(), found)
    module = "pkg/utils/__init__.py" if importer.startswith("through_package") else "pkg/utils/amp_compat.py"
    assert all(f"handed out by `{module}`" in d.message for d in found)


NOT_APEX = {
    "own_object": "class _Amp:\n    def initialize(self, model, **kwargs):\n        return model\n\namp = _Amp()\n",
    "torch_amp": "from torch.cuda import amp\n",
    "inside_a_function": "def load():\n    from apex import amp\n    return amp\n\namp = None\n",
    "private_star": "from .other import *\n",  # other.py binds it as `_amp`, which a star import does not take
}


@pytest.mark.parametrize("exporter", sorted(NOT_APEX))
def test_an_amp_that_is_not_apexs_is_not_reported(tmp_path: Path, exporter: str) -> None:
    utils = tmp_path / "pkg" / "utils"
    utils.mkdir(parents=True)
    for init in (tmp_path / "pkg" / "__init__.py", utils / "__init__.py"):
        init.write_text("")
    (utils / "amp_compat.py").write_text(NOT_APEX[exporter])
    (utils / "other.py").write_text("from apex import amp as _amp\n")
    train = tmp_path / "pkg" / "train.py"
    train.write_text("from pkg.utils.amp_compat import amp\n\n\n" + USES["scale_loss"].format(r="amp"))
    assert _amp016(train) == []


def test_a_file_importing_amp_from_apex_itself_is_left_to_the_rewrite(tmp_path: Path) -> None:
    """A file of a project with a compatibility module, but importing amp from apex itself, gets
    the rewrite, not the report."""
    train, _ = _project(tmp_path, "plain", "absolute", "scale_loss")
    train.write_text(train.read_text().replace("from pkg.utils.amp_compat import amp", "from apex import amp"))
    assert amp_reexports.reexported({train: train.read_text()}) == {}
    assert _amp016(train) == []


def test_a_chain_of_modules_is_followed_to_apex(tmp_path: Path) -> None:
    """``a.py`` imports apex's amp, ``b.py`` re-exports it from ``a``, ``c.py`` from ``b``."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from apex import amp\n")
    (pkg / "b.py").write_text("from .a import amp\n")
    (pkg / "c.py").write_text("from .b import amp as shared_amp\n")
    train = pkg / "train.py"
    train.write_text("from pkg.c import shared_amp\n\nshared_amp.init()\n")
    assert amp_reexports.reexported({train: train.read_text()}) == {train: (("pkg.c.shared_amp", "pkg/c.py"),)}
