"""The README's main jobs, as a user runs them right after installing: ``ampmigrate`` rewrites the
bundled legacy example in place, and the result trains under plain PyTorch with no apex at all."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # an end-to-end run: `-m slow`, and in CI

ROOT = Path(__file__).resolve().parents[1]


def ampmigrate(*args, cwd):
    command = shutil.which("ampmigrate")
    prefix = [command] if command else [sys.executable, "-c", "from migrate.cli import main; main()"]
    return subprocess.run(prefix + list(args), cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_ampmigrate_rewrites_the_bundled_example_into_a_native_script_that_runs(tmp_path):
    script = tmp_path / "simple_o1.py"
    shutil.copy(ROOT / "fixtures" / "legacy" / "simple_o1.py", script)

    diff = ampmigrate("--diff", str(script), cwd=tmp_path)
    assert diff.returncode == 1, diff.stderr
    assert "+    scaler = torch.amp.GradScaler(\"cuda\")" in diff.stdout
    assert script.read_text() == (ROOT / "fixtures" / "legacy" / "simple_o1.py").read_text()

    rewrite = ampmigrate(str(script), cwd=tmp_path)
    assert rewrite.returncode == 1, rewrite.stderr
    assert "from apex" not in script.read_text()
    assert ampmigrate("--check", str(script), cwd=tmp_path).returncode == 0  # nothing left

    completed = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                               text=True, timeout=300,
                               env=dict(os.environ, AMPSHIM_AUTOLOAD="0", PYTHONWARNINGS="ignore"))
    assert completed.returncode == 0, completed.stderr
    losses = json.loads(completed.stdout.splitlines()[-1])["losses"]
    assert losses[-1] < 0.9 * losses[0]

    # ... and trains as the original did on ampshim, step for step.
    compared = subprocess.run(
        [sys.executable, "-m", "ampshim", "compare", "--device", "cpu",
         str(ROOT / "fixtures" / "legacy" / "simple_o1.py"), str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "SAME: 20 optimizer steps" in compared.stdout


def _quick_start_commands() -> list[str]:
    """The command lines of the README's quick-start blocks, in order, comments dropped."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quick start"):]
    section = section[: section.index("\n## ", 1)]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        commands += [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    return commands


def test_every_quick_start_command_runs_on_an_apex_script(tmp_path):
    # The README's commands as written, `train.py` an apex script that takes --opt-level and
    # `path/` its folder; in order, so the migration commands meet the script as the user has it.
    commands = _quick_start_commands()
    assert len(commands) == 6, commands
    shutil.copy(ROOT / "fixtures" / "legacy" / "train_o1.py", tmp_path / "train.py")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for command in commands:
        argv = shlex.split(command.replace("path/", "."))
        if argv[0] == "python":
            argv[0] = sys.executable
        completed = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                                   timeout=300)
        expected = (0, 1) if argv[0] == "ampmigrate" else (0,)  # 1: ampmigrate changed something
        assert completed.returncode in expected, (command, completed.stdout[-2000:], completed.stderr[-2000:])
    assert not re.search(r"^\s*(from|import) apex\b", (tmp_path / "train.py").read_text(), re.M)


def _bash_block_after(heading: str) -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme[readme.index(heading):], re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_install_commands_install_into_a_fresh_environment(tmp_path):
    # The README's install lines and the contributor's install line, as written, run in a copy of
    # the repository with a new virtual environment (torch's CPU build put there first, as the
    # README advises). Its test command is the one CI runs on the whole suite.
    commands = _bash_block_after("## Install") + _bash_block_after("Contributors install")[:1]
    assert len(commands) == 4 and commands[-1] == 'pip install ".[torch,test]"', commands
    copy = tmp_path / "ampshim"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(
        ".git", ".ci-venv", ".venv", "dist", "build", "site", "__pycache__", "*.egg-info"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    torch_version = __import__("torch").__version__.split("+")[0]
    for command in [f"pip install --quiet torch=={torch_version}", *commands]:
        completed = subprocess.run(["bash", "-c", command], cwd=copy, env=env, capture_output=True,
                                   text=True, timeout=900)
        assert completed.returncode == 0, (command, completed.stdout[-2000:], completed.stderr[-2000:])
    checked = subprocess.run(["bash", "-c", "cd / && ampmigrate --version && python -c 'from apex import amp; import pytest, xdist'"],
                             env=env, capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0 and "ampmigrate, version" in checked.stdout, checked.stderr[-2000:]
