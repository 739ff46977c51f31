"""The pre-commit hooks, run by the real pre-commit against this repository, as a user's project does.

pre-commit builds the hooks' environment itself (a virtualenv with this package pip-installed), so
this needs pre-commit and a package index that has libcst and click (a local one will do). It takes
about half a minute: one environment, built once for all the runs below.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRE_COMMIT = shutil.which("pre-commit")

pytestmark = [pytest.mark.skipif(PRE_COMMIT is None, reason="pre-commit is not installed"),
              pytest.mark.slow]
INTEGRATIONS = REPO / "docs" / "integrations.md"

APEX = """from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x, y in loader:
    loss = criterion(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""

NATIVE = """import torch

scaler = torch.amp.GradScaler("cuda")
for step, (x, y) in enumerate(loader):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    if step % 100 == 0:
        print(f"step {step}: loss {loss.item():.4f}")
"""


def _git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _this_repository_as_committed(target: Path) -> Path:
    """This working tree (tracked and new files, as they are now) committed into a fresh
    repository, so the hooks tested are the ones in front of us."""
    listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=REPO).split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    _git("init", "-q", cwd=target)
    _git("add", "-A", cwd=target)
    _git("-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q", "-m", "snapshot", cwd=target)
    return target


def _yaml_snippet(text: str, heading: str) -> str:
    """The first YAML block after ``heading``."""
    return re.search(r"```yaml\n(.*?)```", text[text.index(heading):], re.S).group(1)


def _remote_snippet(repository: Path) -> str:
    """The documented remote `.pre-commit-config.yaml`, with the repository's URL and commit filled in."""
    snippet = _yaml_snippet(INTEGRATIONS.read_text(), "### The hook from this repository")
    commit = _git("rev-parse", "HEAD", cwd=repository)
    snippet, urls = re.subn(r"<url of this repository>[^\n]*", str(repository), snippet)
    snippet, revs = re.subn(r"<a tag or full commit hash of it>", commit, snippet)
    assert urls == revs == 1, snippet
    return snippet


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A user's project whose configuration is the documented remote snippet, with both hooks."""
    repository = _this_repository_as_committed(tmp_path_factory.mktemp("ampshim"))
    project = tmp_path_factory.mktemp("project")
    _git("init", "-q", cwd=project)
    config = _remote_snippet(repository)
    config += "      - id: ampmigrate-check\n      - id: ampmigrate\n"  # the hooks running every rule, beside the snippet's
    (project / ".pre-commit-config.yaml").write_text(config)
    (project / "bad.py").write_text(APEX)
    (project / "good.py").write_text(NATIVE)
    _git("add", ".pre-commit-config.yaml", cwd=project)  # pre-commit wants its configuration staged
    home = tmp_path_factory.mktemp("pre-commit-home")
    return project, home


def _pre_commit(project, *args):
    project, home = project
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), "NO_COLOR": "1"}
    env.pop("AMPSHIM_AUTOLOAD", None)
    return subprocess.run([PRE_COMMIT, *args], cwd=project, env=env, capture_output=True, text=True, timeout=600)


def test_check_hook_fails_on_an_apex_file_and_passes_on_a_native_one(project):
    bad = _pre_commit(project, "run", "ampmigrate-check", "--files", "bad.py")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "Failed" in bad.stdout and "bad.py:3:" in bad.stdout and "AMP002" in bad.stdout
    good = _pre_commit(project, "run", "ampmigrate-check", "--files", "good.py")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Passed" in good.stdout
    assert (project[0] / "bad.py").read_text() == APEX


def test_rewrite_hook_rewrites_the_file_and_fails_the_commit_for_review(project):
    victim = project[0] / "rewrite_me.py"
    victim.write_text(APEX)
    result = _pre_commit(project, "run", "ampmigrate", "--files", "rewrite_me.py")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Failed" in result.stdout and "1 file changed" in result.stdout
    assert "from apex" not in victim.read_text() and "torch.amp.GradScaler" in victim.read_text()


def test_both_hooks_pass_with_no_files_and_touch_nothing(project):
    # nothing staged but the configuration: the hooks have no file, and must not go looking
    result = _pre_commit(project, "run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("(no files to check)Skipped") == 4
    assert (project[0] / "bad.py").read_text() == APEX


def test_hooks_told_to_always_run_with_no_files_check_nothing(project):
    # always_run hands the hooks an empty file list: ampmigrate must not fall back to the
    # current directory, where it would rewrite files nobody staged
    folder = project[0]
    config = folder / ".pre-commit-config.yaml"
    original = config.read_text()
    try:
        config.write_text(original.replace("      - id: ampmigrate-check", "      - id: ampmigrate-check\n        always_run: true")
                          .replace("      - id: ampmigrate\n", "      - id: ampmigrate\n        always_run: true\n"))
        _git("add", ".pre-commit-config.yaml", cwd=folder)
        result = _pre_commit(project, "run")
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.count("Passed") == 2  # the two told to: the others skip
        assert (folder / "bad.py").read_text() == APEX
    finally:
        config.write_text(original)
        _git("add", ".pre-commit-config.yaml", cwd=folder)


def test_hook_environment_has_libcst_and_click_and_never_torch(project):
    _pre_commit(project, "run", "ampmigrate-check", "--files", "good.py")  # the environment exists
    [site] = list(project[1].glob("repo*/py_env-*/lib/python*/site-packages"))
    installed = {path.name.split("-")[0].lower() for path in site.iterdir() if path.name.endswith(".dist-info")}
    assert {"libcst", "click", "ampshim"} <= installed
    assert not any(name.startswith(("torch", "nvidia")) for name in installed), sorted(installed)


def test_the_local_hook_runs_the_installed_ampmigrate(tmp_path):
    # The README's snippet (docs/integrations.md has the same): `language: system`, nothing to
    # download, the ampmigrate installed beside this interpreter.
    readme_snippet = _yaml_snippet((REPO / "README.md").read_text(), "**3. Keep it migrated")
    assert readme_snippet == _yaml_snippet(INTEGRATIONS.read_text(), "### The hook from the project's own environment")
    project = tmp_path / "project"
    project.mkdir()
    _git("init", "-q", cwd=project)
    (project / ".pre-commit-config.yaml").write_text(readme_snippet)
    (project / "bad.py").write_text(APEX)
    (project / "good.py").write_text(NATIVE)
    _git("add", ".pre-commit-config.yaml", cwd=project)
    ampmigrate = shutil.which("ampmigrate")
    assert ampmigrate is not None, "ampmigrate is not installed"
    env_path = os.pathsep.join([str(Path(ampmigrate).parent), os.environ.get("PATH", "")])
    runs = (project, tmp_path / "home")
    def run(*args):
        env = {**os.environ, "PRE_COMMIT_HOME": str(runs[1]), "NO_COLOR": "1", "PATH": env_path}
        return subprocess.run([PRE_COMMIT, *args], cwd=project, env=env, capture_output=True,
                              text=True, timeout=600)
    bad = run("run", "ampmigrate", "--files", "bad.py")
    assert bad.returncode == 1 and "AMP002" in bad.stdout, bad.stdout + bad.stderr
    good = run("run", "ampmigrate", "--files", "good.py")
    assert good.returncode == 0 and "Passed" in good.stdout, good.stdout + good.stderr
    assert (project / "bad.py").read_text() == APEX  # --check changes nothing


MIGRATED_WITH_ADVICE = NATIVE.replace('    if step % 100 == 0:\n        print(f"step {step}: loss {loss.item():.4f}")\n',
                                      '    print(f"step {step}: loss {loss.item():.4f}")\n')
CLIPS_SCALED = NATIVE.replace("    scaler.step(optimizer)\n",
                              "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    scaler.step(optimizer)\n")


def test_the_split_hooks_keep_a_migrated_repository_green_and_still_catch_mistakes(project):
    folder = project[0]
    (folder / "advice.py").write_text(MIGRATED_WITH_ADVICE)  # an every-step loss.item(): AMP100 only
    (folder / "mistake.py").write_text(CLIPS_SCALED)  # a clip of scaled gradients: AMP101
    migrate = _pre_commit(project, "run", "ampmigrate-migrate", "--files", "advice.py", "mistake.py")
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr  # nothing of apex: nothing to do
    lint = _pre_commit(project, "run", "ampmigrate-lint", "--files", "advice.py")
    assert lint.returncode == 0, lint.stdout + lint.stderr  # AMP100 is opt-in
    caught = _pre_commit(project, "run", "ampmigrate-lint", "--files", "mistake.py")
    assert caught.returncode == 1 and "AMP101" in caught.stdout, caught.stdout
    assert (folder / "mistake.py").read_text() == CLIPS_SCALED  # the lint hook writes nothing
    rewrite = _pre_commit(project, "run", "ampmigrate-migrate", "--files", "bad.py")
    assert rewrite.returncode == 1 and "1 file changed" in rewrite.stdout
    (folder / "bad.py").write_text(APEX)
