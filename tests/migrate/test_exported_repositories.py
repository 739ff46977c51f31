"""Repositories exported without their ``.git`` into a folder of other things (``~/code/repo``), and
an import that loads the script's own module: another repository's file is no half of this one.

- A repository whose top is a package (an ``__init__.py`` beside its README or licence) is its own
  project: the folder above it, holding no Python file of its own, is no project it belongs to.
- ``import utils`` beside the script's own ``utils.py`` loads that file, not a ``utils.py`` of the
  project that scales losses with apex in another folder.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from migrate import api, files

TRAIN = '''\
import torch
{import_line}
from apex import amp


def main():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x in [torch.randn(4, 2)]:
        loss = model(x).sum()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
'''
# a file that only scales losses with apex: a scale half, for whoever imports it
SCALE_HALF = '''\
from apex import amp


def backward(loss, optimizer):
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
'''
IMPORTS = {"module": ("import {name}", "{name}"), "names": ("from {name} import backward", "{name}")}
TOP_FILES = ["README.md", "README.rst", "LICENSE", "LICENCE.txt"]


def _results(root: Path) -> dict[str, api.FileResult]:
    return {Path(r.filename).name: r for r in api.migrate_paths([str(root)], write=False)}


def _folder_of_repositories(tmp_path: Path, top_file: str | None, import_line: str) -> Path:
    """``code/repo_a`` (a package at its top, importing ``helpers``) beside ``code/repo_b``,
    whose ``helpers.py`` scales losses."""
    repo_a, repo_b = tmp_path / "code" / "repo_a", tmp_path / "code" / "repo_b"
    for repo in (repo_a, repo_b):
        repo.mkdir(parents=True)
        (repo / "__init__.py").write_text("")
        if top_file is not None:
            (repo / top_file).write_text("")
    (repo_a / "train.py").write_text(TRAIN.format(import_line=import_line.format(name="helpers")))
    (repo_b / "helpers.py").write_text(SCALE_HALF)
    return repo_a


@pytest.mark.parametrize("top_file, spelling", list(itertools.product(TOP_FILES, IMPORTS)))
def test_a_repository_whose_top_is_a_package_is_its_own_project(tmp_path, top_file, spelling):
    repo_a = _folder_of_repositories(tmp_path, top_file, IMPORTS[spelling][0])
    assert files.project_root(repo_a / "train.py") == repo_a.resolve()
    result = _results(repo_a)["train.py"]
    assert result.changed and "amp" not in result.new_source.replace("torch.amp", ""), [
        d.message for d in result.diagnostics]


@pytest.mark.parametrize("shape", ["no_top_file", "script_above"])
def test_a_package_without_a_repositorys_top_belongs_to_the_folder_above(tmp_path, shape):
    """No README or licence (``src/`` of a project), or a script in the folder above that runs the
    package: the folder above is the project, and its other halves count."""
    repo_a = _folder_of_repositories(tmp_path, None if shape == "no_top_file" else "README.md", "import helpers")
    if shape == "script_above":
        (repo_a.parent / "run.py").write_text("import repo_a\n")
    assert files.project_root(repo_a / "train.py") == repo_a.parent.resolve()


@pytest.mark.parametrize("spelling, own", list(itertools.product(IMPORTS, ["module", "package"])))
def test_an_import_loads_the_scripts_own_module_not_a_half_elsewhere(tmp_path, spelling, own):
    """``import utils`` with the script's own ``utils`` beside it (a module, or a package) and a
    ``tools/utils.py`` that scales losses with apex: the script is no initialize half of that file
    and is rewritten; where its own ``utils`` is missing, the two are linked and it stays."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "train.py").write_text(TRAIN.format(import_line=IMPORTS[spelling][0].format(name="utils")))
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "utils.py").write_text(SCALE_HALF)
    assert not _results(tmp_path)["train.py"].changed  # linked: migrated together
    if own == "module":
        (tmp_path / "utils.py").write_text("def backward(loss, optimizer):\n    loss.backward()\n")
    else:
        (tmp_path / "utils").mkdir()
        (tmp_path / "utils" / "__init__.py").write_text("def backward(loss, optimizer):\n    loss.backward()\n")
    files.project_python_files.cache_clear()
    result = _results(tmp_path)["train.py"]
    assert result.changed, [d.message for d in result.diagnostics]


@pytest.mark.parametrize("shape", ["marker", "dotted_import", "package", "lone_folder"])
def test_a_project_is_known_where_a_marker_an_import_or_a_package_says_how_far_it_reaches(tmp_path, shape):
    folder = tmp_path / "code" / "train"
    folder.mkdir(parents=True)
    script = folder / "train.py"
    script.write_text("from utils.io import save\n" if shape == "dotted_import" else "import torch\n")
    if shape == "marker":
        (tmp_path / "code" / "setup.cfg").write_text("")
    elif shape == "dotted_import":
        (tmp_path / "code" / "utils").mkdir()
        (tmp_path / "code" / "utils" / "io.py").write_text("")
    elif shape == "package":
        (folder / "__init__.py").write_text("")
    known = files.known_project_root(script)
    # a lone folder may be files gathered from many projects: its extent is unknown
    assert known == (None if shape == "lone_folder" else (tmp_path / "code").resolve())
    assert files.project_root(script) == (known or folder.resolve())


SETUP_SCRIPTS = {  # a `setup.py` beside the package's `__init__.py`, and whether it marks a project
    "setuptools": ("from setuptools import setup, find_packages\n\nsetup(name='p', packages=find_packages())\n", True),
    "import_setuptools": ("import setuptools\n\nsetuptools.setup(name='p')\n", True),
    "distutils": ("from distutils.core import setup\n\nsetup(name='p')\n", True),
    "extension": ("import torch\nfrom torch.utils.cpp_extension import BuildExtension\nfrom setuptools import setup\n", True),
    # a module of the package named `setup.py`: its default argument parser and logging set-up
    "package_module": ("import argparse\n\nfrom pkg.utils import setup_logger\n\n\ndef default_setup(cfg, args):\n"
                       "    setup_logger(cfg)\n", False),
    "empty": ("", False),
}


@pytest.mark.parametrize("script", sorted(SETUP_SCRIPTS))
@pytest.mark.parametrize("in_package", [True, False])
def test_a_setup_py_marks_a_project_where_it_packages_something_or_no_package_holds_it(tmp_path, script, in_package):
    text, packages = SETUP_SCRIPTS[script]
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    engine = tmp_path / "pkg" / "engine"
    engine.mkdir(parents=True)
    if in_package:
        for folder in (engine, engine.parent):
            (folder / "__init__.py").write_text("")
    (engine / "setup.py").write_text(text)
    (engine / "runner.py").write_text("import torch\n")
    marks = packages or not in_package  # outside a package any `setup.py` marks one, as before
    assert files.known_project_root(engine / "runner.py") == (engine if marks else tmp_path).resolve()


def test_apex_state_read_in_the_package_keeps_the_trainer_beside_a_setup_module(tmp_path):
    (tmp_path / "setup.py").write_text("from setuptools import setup\n\nsetup(name='pkg')\n")
    for folder in ("pkg", "pkg/engine", "pkg/utils"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "pkg" / "engine" / "setup.py").write_text(SETUP_SCRIPTS["package_module"][0])
    (tmp_path / "pkg" / "utils" / "casts.py").write_text(
        "from apex import amp\n\n\ndef is_amp_training():\n    try:\n        return hasattr(amp._amp_state, 'loss_scalers')\n"
        "    except Exception:\n        return False\n")
    (tmp_path / "pkg" / "engine" / "runner.py").write_text(TRAIN.format(import_line="import os"))
    files.project_python_files.cache_clear()
    result = _results(tmp_path)["runner.py"]
    [finding] = [d for d in result.diagnostics if d.code == "AMP002" and "internal state" in d.message]
    assert "pkg/utils/casts.py:6" in finding.message, finding.message
    assert not result.changed
