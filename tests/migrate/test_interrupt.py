"""Ctrl-C on a parallel run: real SIGINTs sent to a real ``ampmigrate -j 2`` still working on a tree."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from migrate.api import migrate_source

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="POSIX signals")

# A real apex script the default run rewrites; 60 copies keep two workers busy for a while.
SOURCE = (Path(__file__).resolve().parents[2] / "fixtures" / "legacy" / "train_o1.py").read_text()
FILES = 60


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "tree").mkdir()
    for index in range(FILES):
        (tmp_path / "tree" / f"train_{index:02d}.py").write_text(SOURCE)
    return tmp_path / "tree"


# The command as the `ampmigrate` script runs it (`run`, which owns the process and its SIGINT
# handler), each file it plans leaving a mark beside the tree: the files are written only once
# every one is planned, so a mark is how the test knows the run is busy planning.
_COMMAND = """
import sys
from pathlib import Path
from migrate import file_run
planned = file_run.migrate_file
def marking(path, *args):
    result = planned(path, *args)
    (Path(sys.argv[-1]).parent / ("planned-" + path.name)).touch()
    return result
file_run.migrate_file = marking
from migrate.cli import run
run()
"""


def _start(tree: Path) -> subprocess.Popen:
    command = [sys.executable, "-c", _COMMAND, "-j", "2", str(tree)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_until_planning(process: subprocess.Popen, tree: Path) -> None:
    deadline = time.monotonic() + 60
    while not any(tree.parent.glob("planned-*")):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "ampmigrate planned nothing in a minute"
        time.sleep(0.05)


def _every_file_whole(tree: Path) -> int:
    """Each file is the original or the whole rewrite, no temporary file is left; returns how many were rewritten."""
    rewritten = migrate_source(SOURCE, unsafe_fixes=False).new_source
    assert rewritten != SOURCE
    texts = [path.read_text() for path in sorted(tree.glob("*.py"))]
    assert all(text in (SOURCE, rewritten) for text in texts)
    assert not [path.name for path in tree.iterdir() if path.name.endswith(".tmp")]
    return sum(text == rewritten for text in texts)


def test_one_ctrl_c_stops_a_parallel_run_promptly_and_says_what_was_written(tree):
    process = _start(tree)
    _wait_until_planning(process, tree)
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, stderr = process.communicate(timeout=60)
    stopped_after = time.monotonic() - sent

    assert process.returncode == 130, stderr
    assert stopped_after < 15, f"took {stopped_after:.1f} s to stop"
    rewritten = _every_file_whole(tree)
    assert 0 < rewritten < FILES, "the run went on to the end, or wrote none of the files it planned"
    assert f", {rewritten} of them rewritten; run again to finish." in stderr, stderr
    assert "Traceback" not in stderr


def test_a_second_ctrl_c_stops_at_once(tree):
    process = _start(tree)
    _wait_until_planning(process, tree)
    process.send_signal(signal.SIGINT)
    time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, stderr = process.communicate(timeout=60)

    assert process.returncode == 130, stderr
    assert time.monotonic() - sent < 10
    assert "Traceback" not in stderr
    _every_file_whole(tree)


def test_called_in_process_the_command_leaves_the_callers_signal_handlers_as_they_were(tmp_path):
    import signal

    from click.testing import CliRunner

    from migrate.cli import main

    (tmp_path / "train.py").write_text("from apex import amp\nmodel, opt = amp.initialize(model, opt)\n")
    before = signal.getsignal(signal.SIGINT)
    result = CliRunner().invoke(main, ["--check", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert signal.getsignal(signal.SIGINT) is before
