"""Running both sides: each script in its own process (or ``torchrun`` group), recorded.

The original runs with the ``apex`` import name served by ampshim; the migrated script runs
with apex refused (or served too, under ``allow_apex``). Both get the same arguments, seed,
device mapping and working directory unless told otherwise.

With ``fork``, a side is a fork of this process rather than a new interpreter: torch is then
imported once, here, instead of once per side (seconds each), which is what comparing
thousands of small generated scripts needs. Fork before running anything on torch here.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import ampshim
from ampshim.casts_setting import CASTS_ENV_VAR
from ampshim.compare.trajectory import Trajectory, read_ranks

__all__ = ["Target", "SideRun", "run_sides", "SETTINGS_ENV_VAR"]

# The settings of a side's processes (JSON), read by ampshim.compare.probe in each of them.
SETTINGS_ENV_VAR = "AMPSHIM_COMPARE"

_ERROR_TAIL_LINES = 25


@dataclass(frozen=True)
class Target:
    """What one side runs: a script's path or a module's name, and where."""

    path: str | None = None
    module: str | None = None
    cwd: str | None = None  # the working directory; None: the current one

    def __post_init__(self):
        if (self.path is None) == (self.module is None):
            raise ValueError("a Target is a script path or a module name, not both or neither")

    @property
    def argv(self) -> list[str]:
        return ["-m", self.module] if self.module else [self.path]

    @property
    def label(self) -> str:
        return f"-m {self.module}" if self.module else self.path


@dataclass
class SideRun:
    """One side's run: its trajectories by rank, its exit, and what it printed."""

    target: Target
    command: list[str]
    returncode: int | None  # None: stopped at the time limit
    seconds: float
    ranks: dict[int, Trajectory] = field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""
    not_run: bool = False  # not run, or stopped, because the other side could not run

    @property
    def error_tail(self) -> str:
        """The errors the ranks recorded, then the last lines the side printed on stderr."""
        recorded = [f"rank {rank}: {t.end.error}" for rank, t in self.ranks.items()
                    if t.end is not None and t.end.error]
        tail = self.stderr.rstrip().splitlines()[-_ERROR_TAIL_LINES:]
        return "\n".join(recorded + (["..."] if recorded and tail else []) + tail)

    @property
    def started_training(self) -> bool:
        return any(trajectory.trained for trajectory in self.ranks.values())

    @property
    def failed_before_training(self) -> bool:
        return self.failed and not self.started_training

    @property
    def failed(self) -> bool:
        """Did a process fail? Judged by the records: a rank that reached its end cleanly is fine
        even where the launcher's exit code says otherwise (gloo's teardown may abort after it)."""
        if self.not_run:
            return False
        if self.returncode is None:
            return True
        if not self.ranks:
            return self.returncode != 0
        return any(trajectory.failed for trajectory in self.ranks.values())


def run_sides(original: Target, migrated: Target, args: list[str], *, steps: int, seed: int,
              device: str | None, allow_apex: bool, nproc_per_node: int, parallel: bool,
              record_dir: str | None, timeout: float | None,
              fork: bool = False) -> tuple[SideRun, SideRun]:
    """Run both sides (one after the other, or at once with ``parallel``); return their runs.

    A side that fails before its first backward pass decides the verdict alone: the other is
    then not run (one after the other, the migration goes first: an incomplete one fails at its
    imports) or stopped (at once).
    """
    if fork and (nproc_per_node > 1 or original.module or migrated.module):
        raise ValueError("fork runs one rank of a script path; use a new interpreter for "
                         "torchrun or -m targets")
    if fork:
        import torch  # noqa: F401  once, here: every forked side then has it

    root = Path(record_dir) if record_dir else Path(tempfile.mkdtemp(prefix="ampshim-compare-"))
    sides = []
    for name, target, apex in (("original", original, "serve"),
                               ("migrated", migrated, "serve" if allow_apex else "block")):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("rank*.jsonl"):
            old.unlink()
        settings = {"record": str(folder), "steps": steps, "seed": seed, "apex": apex}
        sides.append((target, folder, _command(target, args, nproc_per_node),
                      _environment(settings, device, serve_apex=apex == "serve"), fork))
    if parallel:
        runs = _finish_together([_start(*side) for side in sides], timeout)
    else:
        migrated_run = _finish(*_start(*sides[1]), timeout)
        if migrated_run.failed_before_training:
            target, _, command, _, _ = sides[0]
            original_run = SideRun(target, command, None, 0.0, not_run=True)
        else:
            original_run = _finish(*_start(*sides[0]), timeout)
        runs = [original_run, migrated_run]
    if not record_dir:
        shutil.rmtree(root, ignore_errors=True)
    return runs[0], runs[1]


def _command(target: Target, args: list[str], nproc_per_node: int) -> list[str]:
    probe = ["-m", "ampshim.compare.probe", *target.argv, *args]
    if nproc_per_node > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc_per_node}", *probe]
    return [sys.executable, *probe]


def _environment(settings: dict, device: str | None, *, serve_apex: bool) -> dict:
    env = dict(os.environ)
    env[SETTINGS_ENV_VAR] = json.dumps(settings)
    # The probe imports ampshim: make sure the child finds this copy of it.
    package_root = str(Path(ampshim.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env["PYTHONHASHSEED"] = str(settings["seed"])
    if serve_apex:
        env.pop("AMPSHIM_AUTOLOAD", None)
        # Both sides under the device's own autocast policy: the rewrite is judged, not the lists.
        env.setdefault(CASTS_ENV_VAR, "native")
    else:
        env["AMPSHIM_AUTOLOAD"] = "0"  # its child processes get no apex from the start-up hook
    if device is not None:
        env["AMPSHIM_DEVICE"] = device
    return env


def _start(target: Target, folder: Path, command: list[str], env: dict, fork: bool):
    stdout = open(folder / "stdout.txt", "w+", encoding="utf-8", errors="replace")
    stderr = open(folder / "stderr.txt", "w+", encoding="utf-8", errors="replace")
    if fork:
        process = _ForkedSide(target, command, env, stdout, stderr)
    else:
        # A session of its own: stopping it stops torchrun's ranks and DataLoader workers too.
        process = subprocess.Popen(command, cwd=target.cwd, env=env, stdin=subprocess.DEVNULL,
                                   stdout=stdout, stderr=stderr, start_new_session=True)
    return target, folder, command, process, stdout, stderr, time.perf_counter()


class _ForkedSide:
    """A side run in a fork of this process: what ``subprocess.Popen`` offers the runner."""

    def __init__(self, target: Target, command: list[str], env: dict, stdout, stderr) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child writes this process's pending output again
        self.pid = os.fork()
        if self.pid == 0:
            os._exit(_run_forked_side(target, command, env, stdout, stderr))
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.perf_counter() + timeout
        while self.poll() is None:
            if deadline is not None and time.perf_counter() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)
        return self.returncode


def _run_forked_side(target: Target, command: list[str], env: dict, stdout, stderr) -> int:
    """In the child: become what ``command`` would have started, run the probe, return its code."""
    code = 1
    try:
        os.setsid()  # as start_new_session: stopping the side stops its DataLoader workers too
        devnull = os.open(os.devnull, os.O_RDONLY)
        for source, descriptor in ((devnull, 0), (stdout.fileno(), 1), (stderr.fileno(), 2)):
            os.dup2(source, descriptor)
        if target.cwd:
            os.chdir(target.cwd)
        os.environ.clear()
        os.environ.update(env)
        # What the start-up hook does in a new interpreter, under this side's environment.
        from ampshim import _alias, _device_hook
        from ampshim.compare import probe

        for name in [name for name in sys.modules if name == "apex" or name.startswith("apex.")]:
            del sys.modules[name]  # as in a new interpreter, which has imported no apex yet
        _alias.install()
        _device_hook.install()
        code = probe.main(command[command.index("ampshim.compare.probe") + 1:])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, (int, type(None))):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001  reported as the interpreter would, then exit 1
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001  a closed stream: nothing left to write
                pass
    return code


def _finish_together(started: list, timeout: float | None) -> list[SideRun]:
    """Wait for both; when one fails before training, stop the other (its run is not needed)."""
    runs: list[SideRun | None] = [None, None]
    while None in runs:
        for index, run in enumerate(started):
            if runs[index] is not None:
                continue
            process, began = run[3], run[6]
            if process.poll() is None and (timeout is None or time.perf_counter() - began < timeout):
                continue
            runs[index] = _finish(*run, timeout)
            other = 1 - index
            if runs[index].failed_before_training and runs[other] is None:
                _stop(started[other][3])
                runs[other] = _finish(*started[other], timeout)
                runs[other].not_run = True
        time.sleep(0.02)
    return runs


def _stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _finish(target, folder, command, process, stdout, stderr, started, timeout):
    remaining = None if timeout is None else max(0.0, timeout - (time.perf_counter() - started))
    try:
        returncode = process.wait(timeout=remaining)
    except subprocess.TimeoutExpired:
        _stop(process)
        returncode = None
    seconds = time.perf_counter() - started
    texts = []
    for stream in (stdout, stderr):
        stream.seek(0)
        texts.append(stream.read())
        stream.close()
    if returncode is None:
        texts[1] += f"\nampshim compare: stopped after {timeout:g} s (--timeout)\n"
    return SideRun(target, command, returncode, seconds, read_ranks(folder), *texts)
