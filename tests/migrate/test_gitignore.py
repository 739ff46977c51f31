"""A directory search leaves out what the git work tree's ignore files ignore, as git reads them."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from migrate.api import discover
from migrate.gitignore import ignored, parse


def _ignored(patterns: str, path: str, is_directory: bool = False) -> bool:
    return ignored(tuple(parse(patterns, "/repo")), f"/repo/{path}", is_directory)


@pytest.mark.parametrize(
    ("patterns", "path", "is_directory", "expected"),
    [
        ("*.py", "a/b/c.py", False, True),  # no slash: any level
        ("/top.py", "top.py", False, True),
        ("/top.py", "a/top.py", False, False),  # a leading slash anchors
        ("a/b.py", "x/a/b.py", False, False),  # so does a slash inside
        ("build/", "build", True, True),
        ("build/", "build", False, False),  # a trailing slash: directories only
        ("build/", "src/build", True, True),
        ("**/gen", "x/y/gen", True, True),
        ("a/**/z.py", "a/z.py", False, True),
        ("a/**/z.py", "a/b/c/z.py", False, True),
        ("a/**", "a/b/c.py", False, True),
        ("a/*.py", "a/b/c.py", False, False),  # "*" stays within one component
        ("te?t.py", "test.py", False, True),
        ("[abc].py", "b.py", False, True),
        ("[!abc].py", "b.py", False, False),
        ("[]x].py", "].py", False, True),
        ("[a-c].py", "b.py", False, True),
        ("[[].py", "[.py", False, True),
        ("*.py\n!keep.py", "keep.py", False, False),  # the last match decides
        ("!keep.py\n*.py", "keep.py", False, True),
        ("# comment.py\n", "# comment.py", False, False),
        ("\\#hash.py", "#hash.py", False, True),
        ("\\!bang.py", "!bang.py", False, True),
        ("trailing.py   ", "trailing.py", False, True),
        ("space\\ ", "space ", False, True),
        ("", "anything.py", False, False),
    ],
)
def test_patterns_read_as_git_reads_them(patterns, path, is_directory, expected):
    assert _ignored(patterns, path, is_directory) is expected


def _tree(tmp_path):
    (tmp_path / ".git").mkdir()
    for name in ("src/train.py", "src/gen/out.py", "src/keep/gen.py", "notes/scratch.py", "top.py", "sub/deep/x.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("notes/\n/top.py\n")
    (tmp_path / "src" / ".gitignore").write_text("gen*\n!keep\n!gen.py\n")
    (tmp_path / ".git" / "info").mkdir()
    (tmp_path / ".git" / "info" / "exclude").write_text("deep/\n")
    return tmp_path


def _names(found, root):
    return sorted(path.relative_to(root).as_posix() for path in found)


def test_a_folder_walk_leaves_out_ignored_files_and_folders(tmp_path):
    root = _tree(tmp_path)
    assert _names(discover([root]), root) == ["src/keep/gen.py", "src/train.py"]
    # the files above the folder searched still apply
    assert _names(discover([root / "src"]), root) == ["src/keep/gen.py", "src/train.py"]
    assert _names(discover([root], respect_gitignore=False), root) == [
        "notes/scratch.py", "src/gen/out.py", "src/keep/gen.py", "src/train.py", "sub/deep/x.py", "top.py",
    ]


def test_a_file_named_on_the_command_line_is_taken_even_if_ignored(tmp_path):
    root = _tree(tmp_path)
    assert _names(discover([root / "top.py", root / "notes" / "scratch.py"]), root) == ["notes/scratch.py", "top.py"]


def test_outside_a_work_tree_a_gitignore_means_nothing(tmp_path):
    root = _tree(tmp_path)
    shutil.rmtree(root / ".git")
    assert "top.py" in _names(discover([root]), root)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_same_files_as_git_leaves_out(tmp_path):
    root = _tree(tmp_path)
    shutil.rmtree(root / ".git")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".git" / "info").mkdir(exist_ok=True)
    (root / ".git" / "info" / "exclude").write_text("deep/\n")
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "--others", "--exclude-standard", "--", "*.py"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    assert _names(discover([root]), root) == sorted(listed)


def test_the_setting_turns_it_off(tmp_path):
    from click.testing import CliRunner

    from migrate.cli import main

    root = _tree(tmp_path)
    (root / "notes" / "scratch.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    (root / "pyproject.toml").write_text('[tool.ampmigrate]\nselect = ["AMP02"]\n')
    assert CliRunner().invoke(main, ["--check", str(root)]).exit_code == 0
    (root / "pyproject.toml").write_text('[tool.ampmigrate]\nselect = ["AMP02"]\nrespect-gitignore = false\n')
    assert CliRunner().invoke(main, ["--check", str(root)]).exit_code == 1
