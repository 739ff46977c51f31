"""What the ``.pth`` hook adds to interpreter start-up: ``python -c pass`` with and without it.

Needs a normal install of the package (``pip install .``), so that ``ampshim-autoload.pth`` sits
in site-packages; ``AMPSHIM_AUTOLOAD=0`` switches the hook off for the comparison. Runs alternate
between the two settings, and each figure is the median of many runs.

    python bench/startup.py [--runs 200]
"""
import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path


def start_time(env):
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    hook = Path(sysconfig.get_paths()["purelib"]) / "ampshim-autoload.pth"
    if not hook.exists():
        sys.exit(f"{hook} is missing: install the package first (pip install .)")
    on = dict(os.environ)
    on.pop("AMPSHIM_AUTOLOAD", None)
    off = dict(os.environ, AMPSHIM_AUTOLOAD="0")
    check = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules, "
                            "any(type(f).__name__ == 'ApexFinder' for f in sys.meta_path))"],
                           env=on, capture_output=True, text=True, check=True).stdout.split()
    times = {"hook on": [], "hook off": []}
    for _ in range(args.runs):
        times["hook on"].append(start_time(on))
        times["hook off"].append(start_time(off))
    median_on, median_off = (statistics.median(times[k]) for k in ("hook on", "hook off"))
    print(f"python {sys.version.split()[0]}, {args.runs} runs each, alternating")
    print(f"torch imported at start: {check[0]}; apex finder installed: {check[1]}")
    print(f"python -c pass, hook off: {median_off * 1e3:.2f} ms (median)")
    print(f"python -c pass, hook on:  {median_on * 1e3:.2f} ms (median)")
    print(f"added by the hook: {(median_on - median_off) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
