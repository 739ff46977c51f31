"""A file that initializes apex amp and scales its own losses, beside a module it imports (or that
imports it) which scales a loss too with apex's ``amp.scale_loss`` (an adversarial attack's
gradient step on the training optimizer). Where that module stays on apex, removing the file's
``amp.initialize`` would make apex raise "Amp state has not been initialized" there: the file is
left alone, in either mode, and says where; rewritten once nothing linked keeps apex."""
from __future__ import annotations

import pytest

from migrate import api
from migrate.scale_kept import scaled_elsewhere

TRAIN = """\
import torch
from apex import amp

{import_line}


def main(model, opt, loader, check):
    model, opt = amp.initialize(model, opt, opt_level="O1")
    for epoch, (x, y) in enumerate(loader):
        if check and epoch:
            perturbation(model, x, y, opt)
        with amp.scale_loss(torch.nn.functional.cross_entropy(model(x), y), opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad()
"""
ATTACKS = """\
import torch
from apex import amp


def perturbation(model, x, y, opt):
    delta = torch.zeros_like(x, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(model(x + delta), y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    return delta.grad.sign()


def evaluate(model, x, y, opt):
    return perturbation(model, x, y, opt).abs().mean()


def clamp(x, low, high):
    return torch.max(torch.min(x, high), low)
"""
IMPORTS = {"from_import": "from attacks import perturbation", "package_relative": "from .attacks import perturbation",
           "a_caller_of_it": "from attacks import clamp, evaluate as perturbation", "the_module": "import attacks"}


def _project(tmp_path, import_line: str, linked: bool = True):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    package = tmp_path / "pkg" if "from ." in import_line else tmp_path
    package.mkdir(exist_ok=True)
    if package != tmp_path:
        (package / "__init__.py").write_text("")
    body = TRAIN.format(import_line=import_line if linked else "from torch import nn")
    if not linked:
        body = body.replace("            perturbation(model, x, y, opt)\n", "            print(epoch)\n")
    (package / "train.py").write_text(body)
    (package / "attacks.py").write_text(ATTACKS)
    return package / "train.py"


@pytest.mark.parametrize("import_form", sorted(IMPORTS))
@pytest.mark.parametrize("given", ["the_project", "train_only"])
@pytest.mark.parametrize("unsafe_fixes", [False, True])
def test_initialize_stays_where_a_linked_module_keeps_apex_scale_loss(tmp_path, import_form, given, unsafe_fixes):
    train = _project(tmp_path, IMPORTS[import_form])
    paths = [str(train)] if given == "train_only" else [str(tmp_path)]
    [result] = [r for r in api.migrate_paths(paths, write=False, unsafe_fixes=unsafe_fixes) if r.filename.endswith("train.py")]
    assert result.new_source == train.read_text()
    said = " ".join(d.message for d in result.diagnostics)
    assert "attacks.py:8 stays on apex amp" in said, said


def test_a_name_imported_that_scales_nothing_is_no_link(tmp_path):
    """``from attacks import clamp``: nothing imported reaches the module's ``amp.scale_loss``."""
    train = _project(tmp_path, "from attacks import clamp")
    train.write_text(train.read_text().replace("perturbation(model, x, y, opt)", "clamp(x, x, x)"))
    [result] = [r for r in api.migrate_paths([str(tmp_path)], write=False, unsafe_fixes=True) if r.filename.endswith("train.py")]
    assert "amp.initialize" not in result.new_source, result.new_source


def test_a_module_that_is_not_linked_leaves_the_file_to_its_own_plan(tmp_path):
    train = _project(tmp_path, "", linked=False)
    [result] = [r for r in api.migrate_paths([str(tmp_path)], write=False, unsafe_fixes=True) if r.filename.endswith("train.py")]
    assert "amp.initialize" not in result.new_source and "GradScaler" in result.new_source, result.new_source
    assert scaled_elsewhere({train: train.read_text()}, {}, {}, unsafe_fixes=True) == {}
