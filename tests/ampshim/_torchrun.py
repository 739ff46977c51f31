"""Runs a script under ``torchrun --nproc_per_node 2`` on the CPU, as a user would launch it, and
any command whose processes talk over gloo."""
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# A rank that ends with std::terminate while the interpreter shuts gloo's threads down, after
# its work and destroy_process_group(): a race in torch's teardown (pytorch/pytorch#190489,
# #179291), about one run in ten here. Such a run is tried again; any other failure is final.
_GLOO_TEARDOWN_ABORT = "terminate called without an active exception"
_TRIES = 3


def torchrun(script, *args, launcher=(), env=None, cwd=None, timeout=120):
    """``python -m torch.distributed.run --nproc_per_node 2 [launcher...] script args...``.

    Returns the CompletedProcess; ``launcher`` (e.g. ``("-m", "ampshim")``) comes before the script.
    """
    environment = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    environment.update(env or {})
    return run_past_gloo_teardown_aborts(
        lambda: [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                 "--master_port", str(free_port()), *launcher, str(script), *map(str, args)],
        env=environment, cwd=cwd, timeout=timeout)


def run_past_gloo_teardown_aborts(command, **options) -> subprocess.CompletedProcess:
    """``subprocess.run(command(), capture_output=True, text=True, **options)``, run again while a
    process it started aborted in gloo's teardown (``_GLOO_TEARDOWN_ABORT``), at most ``_TRIES`` times."""
    for _ in range(_TRIES):
        completed = subprocess.run(command(), capture_output=True, text=True, **options)
        if completed.returncode == 0 or _GLOO_TEARDOWN_ABORT not in completed.stderr:
            return completed
    return completed


def spawn_past_gloo_teardown_aborts(worker, directory: Path, nprocs: int = 2) -> None:
    """``torch.multiprocessing.spawn(worker, (init_file,), nprocs)``, each worker given a gloo
    rendezvous file in ``directory``; spawned again, with a fresh file, while a worker died of
    SIGABRT (gloo's teardown, as above: a failed check in a worker raises instead), at most ``_TRIES`` times."""
    import torch.multiprocessing as mp

    for attempt in range(1, _TRIES + 1):
        try:
            mp.spawn(worker, args=(str(directory / f"init{attempt}"),), nprocs=nprocs, join=True)
            return
        except mp.ProcessExitedException as died:
            if died.signal_name != "SIGABRT" or attempt == _TRIES:
                raise
