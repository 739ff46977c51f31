"""``python -m ampshim script.py args...``: run a legacy apex script, unchanged, on ampshim.

Like ``python -m coverage run``: the script runs as ``__main__`` with its own ``sys.argv``
and its directory first on ``sys.path``, with the ``apex`` import name served by ampshim.
"""
import os
import runpy
import sys

import ampshim  # importing it serves the apex import name

_USAGE = "usage: python -m ampshim SCRIPT.py [ARGS...]  |  python -m ampshim -m MODULE [ARGS...]"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    if argv[0] == "-m":
        if len(argv) < 2:
            print(_USAGE, file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = argv[0]
    if not os.path.exists(script):
        print(f"ampshim: can't open file {script!r}: no such file", file=sys.stderr)
        return 2
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
