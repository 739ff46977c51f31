"""``python -m ampshim [--device cpu] script.py args...``: run a legacy apex script, unchanged.

``python -m ampshim compare ORIGINAL MIGRATED``: see :mod:`ampshim.compare`.

Like ``python -m coverage run``: the script runs as ``__main__`` with its own ``sys.argv`` and its
directory first on ``sys.path``, with the ``apex`` import name served by ampshim, in its
multiprocessing children too.
"""
import os
import sys

import ampshim  # noqa: F401  (importing it serves the apex import name)
from ampshim._device_hook import DEVICE_ENV_VAR
from ampshim._launch import run_module, run_script

_USAGE = ("usage: python -m ampshim [--device cpu] SCRIPT.py [ARGS...]  |  "
          "python -m ampshim [--device cpu] -m MODULE [ARGS...]\n"
          "       python -m ampshim compare [--device cpu] ORIGINAL.py MIGRATED.py [-- ARGS...]"
          "  (see compare --help)\n"
          "  --device cpu  run a script written for CUDA on the CPU (also: AMPSHIM_DEVICE=cpu)\n"
          "  --device cuda run it as written (the default)")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    if argv[0] == "compare":  # a script named `compare` runs as ./compare
        from ampshim.compare.cli import main as compare

        return compare(argv[1:])
    if argv[0] == "--device" or argv[0].startswith("--device="):
        device, argv = (argv[1:2], argv[2:]) if argv[0] == "--device" else ([argv[0][9:]], argv[1:])
        if device not in (["cpu"], ["cuda"]):
            print(f"ampshim: --device {' '.join(device)!r}: use --device cpu (a script written for "
                  "CUDA, run on the CPU) or --device cuda (as written)", file=sys.stderr)
            return 2
        os.environ[DEVICE_ENV_VAR] = device[0]  # for its child processes too
        if device == ["cpu"]:
            from ampshim import cuda_on_cpu

            cuda_on_cpu.enable()
        if not argv:
            print(_USAGE, file=sys.stderr)
            return 2
    if argv[0] == "-m":
        if len(argv) < 2:
            print(_USAGE, file=sys.stderr)
            return 2
        run_module(argv[1], argv[2:])
        return 0
    script = argv[0]
    if not os.path.exists(script):
        print(f"ampshim: can't open file {script!r}: no such file", file=sys.stderr)
        return 2
    run_script(script, argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
