"""Runs a script under ``torchrun --nproc_per_node 2`` on the CPU, as a user would launch it."""
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
    for _ in range(_TRIES):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                   "--master_port", str(free_port()), *launcher, str(script), *map(str, args)]
        completed = subprocess.run(command, env=environment, cwd=cwd, capture_output=True, text=True,
                                   timeout=timeout)
        if completed.returncode == 0 or _GLOO_TEARDOWN_ABORT not in completed.stderr:
            return completed
    return completed
