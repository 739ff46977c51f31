"""A computed opt level (``opt_level=args.amp_level``) whose O2 default or shipped configs are in
another file of the project: the run-time check the safe rewrite adds would stop the run people
make most, so the rewrite is unsafe and says where the project sets it."""
from __future__ import annotations

from pathlib import Path

import pytest

from migrate import api
from migrate.level_settings import set_elsewhere

TRAIN = """\
import torch
from apex import amp

from config import parse_args


def main():
    args = parse_args()
    model = torch.nn.Linear(4, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level=args.amp_level)
    for _ in range(3):
        loss = model(torch.randn(2, 4, device="cuda")).sum()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
"""
SETTINGS = {
    "argparse": ("config.py", 'import argparse\n\n\ndef parse_args():\n    p = argparse.ArgumentParser()\n'
                 '    p.add_argument("--amp_level", type=str,\n                   default="{level}", help="apex level")\n'
                 '    return p.parse_args()\n'),
    "argparse_dashes": ("config.py", 'import argparse\n\n\ndef parse_args():\n    p = argparse.ArgumentParser()\n'
                        "    p.add_argument('--amp-level', default='{level}')\n    return p.parse_args()\n"),
    "json": ("configs/base.json", '{{\n  "fp16": 1,\n  "amp_level": "{level}"\n}}\n'),
    "yaml": ("configs/base.yaml", "train:\n  amp_level: {level}\n"),
    "dataclass": ("config.py", "from dataclasses import dataclass\n\n\n@dataclass\nclass Options:\n    amp_level: str = \"{level}\"\n\n\n"
                  "def parse_args():\n    return Options()\n"),
    # the option on the command line the project ships: a script, continued lines, a README's block
    "shell": ("scripts/train.sh", "#!/bin/sh\npython train.py \\\n    --batch-size 8 \\\n    --amp-level {level} \\\n    --epochs 3\n"),
    "shell_equals": ("run.sh", "python -m torch.distributed.launch --nproc_per_node 2 train.py --amp_level='{level}'\n"),
    "readme": ("README.md", "# p\n\n## Training\n\n```bash\npython train.py --data ./data --amp_level \"{level}\"\n```\n"),
}


def _project(tmp_path: Path, setting: str, level: str) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "train.py").write_text(TRAIN)
    if SETTINGS[setting][0] != "config.py":
        (tmp_path / "config.py").write_text("import argparse\n\n\ndef parse_args():\n    return argparse.Namespace(amp_level='O1')\n")
    name, text = SETTINGS[setting]
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text.format(level=level))
    return tmp_path / "train.py"


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_an_o2_set_in_another_file_makes_the_computed_level_unsafe(tmp_path, setting):
    train = _project(tmp_path, setting, "O2")
    assert set_elsewhere({train: TRAIN})[train]["amp_level"].endswith(": O2")
    [result] = [r for r in api.migrate_paths([str(train)], write=False) if r.filename.endswith("train.py")]
    assert not result.changed
    said = " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix is not None)
    assert "the project sets `amp_level` to O2 (at " in said, said
    [unsafe] = [r for r in api.migrate_paths([str(tmp_path)], write=False, unsafe_fixes=True) if r.filename.endswith("train.py")]
    assert "TODO(ampmigrate)" in unsafe.new_source
    assert "amp_level` to O2" in " ".join(unsafe.new_source.replace("#", " ").split())  # however the comment wraps


@pytest.mark.parametrize("setting", ["argparse", "json", "shell", "readme", "unimported_module", "other_option", "nested_project"])
def test_a_project_setting_only_o1_keeps_the_run_time_check_safe(tmp_path, setting):
    """O1 everywhere; or O2 in a module the file does not import (another script's own option), for
    another option on a command line, or in the docs of a project of its own inside this one (a
    vendored apex's README)."""
    if setting == "unimported_module":
        train = _project(tmp_path, "json", "O1")
        (tmp_path / "other.py").write_text('import argparse\n\np = argparse.ArgumentParser()\np.add_argument("--amp_level", default="O2")\n')
    elif setting == "other_option":
        train = _project(tmp_path, "shell", "O1")
        (tmp_path / "eval.sh").write_text("python eval.py --amp_level_eval O2 --level O3\necho O2\n")
    elif setting == "nested_project":
        train = _project(tmp_path, "shell", "O1")
        (tmp_path / "third_party" / "apex").mkdir(parents=True)
        (tmp_path / "third_party" / "apex" / "setup.py").write_text("from setuptools import setup\n\nsetup(name='apex')\n")
        (tmp_path / "third_party" / "apex" / "README.md").write_text("```\npython main_amp.py --amp-level O2 ./\n```\n")
    else:
        train = _project(tmp_path, setting, "O1")
    [result] = [r for r in api.migrate_paths([str(train)], write=False) if r.filename.endswith("train.py")]
    assert result.changed and "native torch.amp has no O2/O3" in result.new_source


def test_another_scripts_own_literal_level_is_no_setting(tmp_path):
    """``amp.initialize(model, opt, opt_level="O2")`` in another script is that script's choice:
    the option this file reads is not set by it (a folder of unrelated scripts stays safe)."""
    train = _project(tmp_path, "json", "O1")
    (tmp_path / "other.py").write_text("from apex import amp\n\n\ndef setup(model, opt):\n"
                                       "    return amp.initialize(model, opt,\n                          opt_level=\"O2\")\n")
    [result] = [r for r in api.migrate_paths([str(train)], write=False) if r.filename.endswith("train.py")]
    assert result.changed and "native torch.amp has no O2/O3" in result.new_source


TRAIN_WITH_A_DEFAULT = TRAIN.replace("from config import parse_args\n", "import argparse\n").replace(
    "    args = parse_args()\n",
    '    parser = argparse.ArgumentParser()\n    parser.add_argument("--amp_level", default="O1")\n    args = parser.parse_args()\n')


@pytest.mark.parametrize("setting, unsafe", [("shell", True), ("readme", True), ("json", False), ("commented_shell", False)])
def test_a_shipped_command_line_overrides_the_files_own_default(tmp_path, setting, unsafe):
    """``default="O1"`` in the script: a config's O2 is not what it runs, but a command line the
    project ships (``train.sh``, a README's block) that passes ``--amp_level O2`` is, unless it is
    commented out."""
    train = _project(tmp_path, "json" if setting == "commented_shell" else setting, "O2" if setting != "commented_shell" else "O1")
    if setting == "commented_shell":
        (tmp_path / "train.sh").write_text("python train.py \\\n    --epochs 3 \\\n    #--amp_level O2 \\\n  # --amp-level=O3\n")
    train.write_text(TRAIN_WITH_A_DEFAULT)
    [result] = [r for r in api.migrate_paths([str(train)], write=False) if r.filename.endswith("train.py")]
    said = " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix is not None)
    if unsafe:
        assert not result.changed and "the project sets `amp_level` to O2 (at " in said, said
    else:
        assert result.changed and "native torch.amp has no O2/O3" in result.new_source, said
