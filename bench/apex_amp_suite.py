"""apex's own amp tests (``tests/L0/run_amp``) run against ampshim; one line per test.

apex's suite is the fullest statement of what ``apex.amp`` did. This script copies that folder
out of an apex checkout into a temporary directory, runs it with ``python -m ampshim ... -m
pytest`` (so ``from apex import amp`` gets ampshim; apex itself is never imported) and prints
each test's outcome and the totals. Nothing of apex is kept or copied into this project.

On the CPU (``--device cpu``, the default) the suite runs under ``python -m ampshim --device
cpu`` with ``AMPSHIM_DTYPE=float16``, and the only change made to the copy is that the suite's
CUDA type strings (``'torch.cuda.HalfTensor'``) read as the CPU's (``'torch.HalfTensor'``).
On CUDA it runs as written.

    git clone https://github.com/NVIDIA/apex && git -C apex checkout e13873de   # last with amp
    python bench/apex_amp_suite.py apex                  # the CPU
    python bench/apex_amp_suite.py apex --device cuda    # a GPU
    python bench/apex_amp_suite.py apex.git --commit e13873de   # straight from a (bare) git copy

Tests that need apex's compiled kernels (``amp_C``) skip themselves; the rest are "runnable".
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

SUITE = "tests/L0/run_amp"
_CUDA_TYPE_STRING = re.compile(r"""(["'])torch\.cuda\.(\w+Tensor)\1""")


def copy_suite(checkout: Path, commit: str | None, destination: Path) -> Path:
    """Put apex's run_amp folder from ``checkout`` (a work tree, or a git dir with ``commit``)
    under ``destination``; return the copy's path."""
    if commit is None:
        source = checkout / SUITE
        if not source.is_dir():
            sys.exit(f"apex_amp_suite: no {SUITE} in {checkout} (pass --commit for a git dir)")
        return Path(shutil.copytree(source, destination / SUITE))
    archive = subprocess.run(["git", f"--git-dir={_git_dir(checkout)}", "archive", commit, SUITE],
                             capture_output=True)
    if archive.returncode != 0:
        sys.exit(f"apex_amp_suite: could not read {SUITE}: {archive.stderr.decode().strip()}")
    with tempfile.TemporaryFile() as tar_file:
        tar_file.write(archive.stdout)
        tar_file.seek(0)
        with tarfile.open(fileobj=tar_file) as tar:
            tar.extractall(destination, filter="data")
    return destination / SUITE


def _git_dir(checkout: Path) -> Path:
    return checkout / ".git" if (checkout / ".git").exists() else checkout


def read_cuda_type_strings_as_cpu(folder: Path) -> int:
    """Rewrite ``'torch.cuda.XTensor'`` string literals to ``'torch.XTensor'``; return how many."""
    changed = 0
    for path in sorted(folder.glob("*.py")):
        text = path.read_text()
        new_text, count = _CUDA_TYPE_STRING.subn(r"\1torch.\2\1", text)
        if count:
            path.write_text(new_text)
            changed += count
    return changed


def run_suite(folder: Path, device: str, report: Path, log: Path, timeout: float) -> int:
    """Run the copied suite under ampshim, writing a JUnit report and pytest's output to ``log``;
    return pytest's exit code."""
    env = dict(os.environ)
    env.pop("AMPSHIM_DEVICE", None)
    ampshim_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ampshim_root, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "ampshim"]
    if device == "cpu":
        env["AMPSHIM_DTYPE"] = "float16"  # apex's tests ask for torch.half by name
        command += ["--device", "cpu"]
    command += ["-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", "."]
    # The suite imports its helpers as `from utils import ...`: it runs from its own folder.
    with log.open("w") as output:
        return subprocess.run(command, cwd=folder, env=env, stdout=output,
                              stderr=subprocess.STDOUT, timeout=timeout).returncode


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """test id -> (passed | failed | skipped, first line of the reason) from a JUnit report."""
    results = {}
    for case in ElementTree.parse(report).iter("testcase"):
        module, _, cls = case.get("classname", "").rpartition(".")
        test = f"{module}.py::{cls}::{case.get('name')}"
        outcome, reason = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, reason = "failed", child.get("message", "")
            elif child.tag == "skipped":
                outcome, reason = "skipped", child.get("message", "")
        results[test] = (outcome, reason.strip().splitlines()[0][:100] if reason.strip() else "")
    return results


def summary(results: dict[str, tuple[str, str]]) -> str:
    counts = Counter(outcome for outcome, _reason in results.values())
    runnable = counts["passed"] + counts["failed"]
    return (f"{runnable} runnable: {counts['passed']} passed, {counts['failed']} failed; "
            f"{counts['skipped']} skipped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("apex", type=Path, help="an apex checkout (work tree or git dir)")
    parser.add_argument("--commit", help="read the suite from this commit of a git dir")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds (default 1800)")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="apex-amp-suite-") as scratch:
        folder = copy_suite(options.apex, options.commit, Path(scratch))
        if options.device == "cpu":
            mapped = read_cuda_type_strings_as_cpu(folder)
            print(f"{mapped} CUDA type strings read as the CPU's", file=sys.stderr)
        report, log = Path(scratch) / "report.xml", Path(scratch) / "pytest.log"
        run_suite(folder, options.device, report, log, options.timeout)
        if not report.exists():
            print(log.read_text()[-3000:], file=sys.stderr)
            print("apex_amp_suite: pytest wrote no report", file=sys.stderr)
            return 1
        results = outcomes(report)
    width = max(map(len, results), default=0)
    for test, (outcome, reason) in sorted(results.items()):
        print(f"{test:<{width}}  {outcome:<7}  {reason}".rstrip())
    print(f"ampshim on {options.device}: {summary(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
