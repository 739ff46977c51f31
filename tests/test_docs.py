"""The README as a front door, the changelog and the version in agreement, links that resolve."""
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from migrate.explain import TOOL_FINDINGS
from migrate.rules import all_rules

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _version_in_pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_changelog_starts_at_the_version_that_ampmigrate_prints():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog, re.M)
    assert released and released[0] == _version_in_pyproject()
    assert "## [Unreleased]" in changelog and "Keep a Changelog" in changelog
    printed = subprocess.run([sys.executable, "-m", "migrate", "--version"], capture_output=True,
                             text=True, cwd=ROOT, timeout=60)
    assert printed.stdout.strip() == f"ampmigrate, version {_version_in_pyproject()}"


def test_the_readme_is_short_and_tells_no_history():
    assert len(README.splitlines()) <= 300
    for phrase in ("this round", "a round earlier", "rounds earlier", "on a quiet day",
                   "at a busy moment", "/work/", "/tmp/", "/home/", "/root/"):
        assert phrase not in README, phrase


def test_the_readme_has_a_line_for_every_rule_with_its_page():
    codes = [rule.CODE for rule in all_rules()] + list(TOOL_FINDINGS)
    rows = re.findall(r"^\| \[(AMP\d{3})\]\(docs/rules/(AMP\d{3})\.md\) \|", README, re.M)
    assert [code for code, _ in rows] == codes
    assert all(code == page for code, page in rows)


def test_every_relative_link_of_the_readme_and_the_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in _LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken


@pytest.mark.slow
def test_the_migration_guide_runs_as_written(tmp_path):
    # docs/migrating.md, step by step, on the project it copies; what it quotes is what is printed.
    guide = (ROOT / "docs" / "migrating.md").read_text()
    shutil.copytree(ROOT / "fixtures" / "legacy" / "split_halves", tmp_path / "before")
    shutil.copytree(tmp_path / "before", tmp_path / "project")
    project = tmp_path / "project"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")

    def run(*command):
        return subprocess.run([sys.executable, *command], cwd=project, env=env, capture_output=True,
                              text=True, timeout=600)

    preview = run("-m", "migrate", "--diff", "--report", "plan.md", ".")
    assert "ampmigrate --diff --report plan.md ." in guide
    assert preview.returncode == 1 and (project / "plan.md").exists()
    assert (project / "engine.py").read_text() == (tmp_path / "before" / "engine.py").read_text()

    applied = run("-m", "migrate", ".")
    summary = re.search(r"\(`(Found \d+ findings \(\d+ fixed, \d+ remaining\))`\)", guide).group(1)
    assert summary in applied.stderr + applied.stdout
    quoted_scaler = re.search(r"^scaler = (.+)$", guide, re.M).group(1)
    assert quoted_scaler in (project / "engine.py").read_text()

    command = re.search(r"^(python -m ampshim compare .+)$", guide, re.M).group(1).split()
    compared = run(*command[1:])
    verdict = re.search(r"^(SAME: \d+ optimizer steps; every step taken;)", guide, re.M).group(1)
    assert compared.returncode == 0 and verdict in compared.stdout, compared.stdout + compared.stderr


def _shape(line: str) -> str:
    """A summary line with its counts and file names generalised."""
    line = re.sub(r"\d+", "N", line)
    line = re.sub(r"\bfiles\b", "file", line)
    line = re.sub(r"\bfixes\b", "fix", line)
    line = re.sub(r"\bfindings\b", "finding", line)
    return re.sub(r"apex: .+\.$", "apex: F.", line)


def test_the_summary_lines_the_reference_quotes_are_the_ones_printed(tmp_path):
    # One voice: each form the reference quotes is printed by a real run, and nothing else is.
    reference = (ROOT / "docs" / "codemod.md").read_text()
    block = reference[reference.index("The closing summary"):]
    quoted = re.search(r"```text\n(.*?)```", block, re.S).group(1).splitlines()
    (tmp_path / "native.py").write_text("import torch\n\nx = torch.ones(1)\n")
    (tmp_path / "o1.py").write_text(
        "from apex import amp\n\nmodel, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n"
        "for x in data:\n    loss = model(x)\n    with amp.scale_loss(loss, optimizer) as scaled:\n"
        "        scaled.backward()\n    optimizer.step()\n")
    (tmp_path / "per_loss.py").write_text(
        "from apex import amp\n\nmodel, optimizer = amp.initialize(model, optimizer, opt_level='O1', num_losses=2)\n"
        "for x in data:\n    a, b = model(x)\n    with amp.scale_loss(a, optimizer, loss_id=0) as s:\n"
        "        s.backward()\n    with amp.scale_loss(b, optimizer, loss_id=1) as s:\n        s.backward()\n"
        "    optimizer.step()\n")
    (tmp_path / "sparse.py").write_text("from apex.contrib.sparsity import ASP\n\nASP.prune_trained_model(model, optimizer)\n")

    def summary(*args):
        completed = subprocess.run([sys.executable, "-m", "migrate", "--color", "never", *args],
                                   cwd=tmp_path, capture_output=True, text=True, timeout=120,
                                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
        return completed.stderr.splitlines()

    printed = [*summary("--check", "native.py"), *summary("--check", "o1.py", "per_loss.py"),
               *summary("o1.py"), *summary("--diff", "sparse.py"), *summary("sparse.py")]
    printed_shapes = {_shape(line) for line in printed}
    assert {_shape(line) for line in quoted} <= printed_shapes, printed
    for line in quoted:
        assert "\x1b[" not in line
