"""``python -m ampshim script.py args...``: run a legacy apex script, unchanged.

Like ``python -m coverage run``: the script runs as ``__main__`` with its own ``sys.argv`` and its
directory first on ``sys.path``, with the ``apex`` import name served by ampshim, in its
multiprocessing children too.
"""
import os
import sys

import ampshim  # noqa: F401  (importing it serves the apex import name)
from ampshim._launch import run_module, run_script

_USAGE = "usage: python -m ampshim SCRIPT.py [ARGS...]  |  python -m ampshim -m MODULE [ARGS...]"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
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
