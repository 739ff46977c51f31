"""apex's launcher: ``python -m apex.parallel.multiproc train.py args...``.

Starts one process per GPU (or ``--world-size N`` processes), each running
``python train.py args... --world-size N --rank i``. Rank 0 prints to the terminal; rank i > 0
writes to ``GPU_i.log`` in the current directory. Native replacement: ``torchrun``.
"""
import subprocess
import sys

__all__ = ["main"]


def _default_world_size():
    import torch  # only when the world size is not given on the command line

    return max(torch.cuda.device_count(), 1)


def _set_flag(argv, flag, value):
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]


def main(argv=None):
    """Run the script in ``argv`` once per rank and wait; return the first non-zero exit code.

    Example::

        $ python -m apex.parallel.multiproc main.py --epochs 3 --world-size 2

    Args:
        argv (list of str, optional): script and its arguments (default: ``sys.argv[1:]``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m apex.parallel.multiproc SCRIPT [ARGS...] [--world-size N]", file=sys.stderr)
        return 2
    if "--world-size" in argv:
        world_size = int(argv[argv.index("--world-size") + 1])
    else:
        world_size = _default_world_size()
        argv += ["--world-size", str(world_size)]
    workers = []
    for rank in range(world_size):
        _set_flag(argv, "--rank", str(rank))
        stdout = None if rank == 0 else open(f"GPU_{rank}.log", "w")
        print(argv)
        workers.append((subprocess.Popen([sys.executable] + argv, stdout=stdout), stdout))
    exit_code = 0
    for process, stdout in workers:
        code = process.wait()
        exit_code = exit_code or code
        if stdout is not None:
            stdout.close()
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
