"""How fast is ``ampmigrate --check`` on real trees, on one apex file, and on one very large file?

Measured side by side, round after round (the medians are reported), each in a fresh process:

1. ``ampmigrate --check TREE`` (wall time, start-up included), against libcst merely parsing every
   ``.py`` file of TREE (``libcst.parse_module`` in one process; its import not counted). Goal: at
   most 0.3x.
2. ``ampmigrate --check FILE`` on one apex file, against ``python -c "import libcst"``. Goal: at
   most 1.3x.
3. ``ampmigrate --check`` on one generated apex file of a growing size (an apex training module of
   this benchmark's own, repeated): wall time and peak memory (maximum resident set), to see both
   grow linearly; the largest is ``--big-mb``. Beside each, libcst alone parsing the file whole
   (its import included); ampmigrate parses a file that large in pieces (``migrate/parsing.py``).
   Every repetition holds an apex training function, which every rule reads. The same sizes of
   model code (the module's block and evaluation loop, repeated) around one apex training function
   at the end show the usual large module: code that no rule reads stays text (``migrate/unread.py``).
4. The same for a script whose top level repeats one training cell, reusing its names (a notebook
   exported as a script), up to ``--cells-kb``: every site shares one scope, where a question
   asked per site of the whole scope, or a link from each use of a name to each assignment of it
   (libcst's scope analysis), makes the time grow with the square of the size.
5. With ``--joined DIR``: real code as one large module, the ``.py`` files of DIR (in path order,
   those Python parses, their ``from __future__`` imports left out) joined up to ``--joined-mb``,
   a quarter, a half and all of it. A folder of training scripts makes the hardest large module:
   training code throughout, every part of it read, one top level calling everything.

ampmigrate runs as installed: ``pip install`` (and so pre-commit) compiles bytecode once, so the runs
share a bytecode cache of their own (``PYTHONPYCACHEPREFIX``), filled by a first run not counted.

Real trees are not in this repository; export one outside it, for example::

    git --git-dir=<bare clone of NVIDIA/DeepLearningExamples> archive HEAD | tar -x -C /work/trees/dle

Usage::

    python bench/migrate_speed.py --tree /work/trees/dle/PyTorch --tree /work/trees/fairseq \\
        --file fixtures/legacy/train_o1.py --rounds 5 --big-mb 5
    python bench/migrate_speed.py --rounds 1 --big-mb 0 --cells-kb 0 --joined /work/devcorpus --joined-mb 4.66

Figures measured with these commands are in the README's Performance section.
"""
from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_PARSE_TREE = """
import sys, time
from pathlib import Path
import libcst
files = sorted(p for p in Path(sys.argv[1]).rglob("*.py") if p.is_file() and not p.is_symlink())
start = time.perf_counter()
for path in files:
    try:
        libcst.parse_module(path.read_bytes())
    except Exception:
        pass
print(time.perf_counter() - start, len(files))
"""

_MODULE = '''

class Block{index}(nn.Module):
    """A residual block: layer norm, two linear layers, dropout."""

    def __init__(self, dim: int = 256, dropout: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        x = F.gelu(self.fc1(self.norm(x)))
        return self.dropout(self.fc2(x)) + residual


def evaluate_{index}(model, batches, device="cuda"):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in batches:
            logits = model(x.to(device))
            correct += (logits.argmax(-1) == y.to(device)).sum().item()
            total += y.numel()
    return correct / max(1, total)


def train_{index}(model, optimizer, loader, epochs=1):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for _ in range(epochs):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
'''


_CELL = '''
# In[{index}]:
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for epoch in range(2):
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        print(loss.item())
'''

_PARSE_FILE = "import sys, libcst; libcst.parse_module(open(sys.argv[1], encoding='utf-8').read())"


_MODEL_CODE = _MODULE[:_MODULE.index("\n\ndef train_")]  # the block and the evaluation loop
_TRAINING = _MODULE[_MODULE.index("\n\ndef train_"):]


def big_file(path: Path, megabytes: float, repeated: str = _MODULE, last: str = "") -> Path:
    """An apex module of about ``megabytes`` MB: ``repeated`` (``_MODULE``, ``_CELL``) again and
    again, then ``last`` once."""
    parts = ["import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nfrom apex import amp\n"]
    size, index = len(parts[0]), 0
    while size < megabytes * 1_000_000:
        parts.append(repeated.format(index=index))
        size += len(parts[-1])
        index += 1
    parts.append(last.format(index=index))
    path.write_text("".join(parts))
    return path


def joined_file(path: Path, source: Path, megabytes: float) -> Path:
    """The ``.py`` files under ``source`` that Python parses, in path order, joined into one module
    of about ``megabytes`` MB (all of them if they are fewer); their ``from __future__`` imports,
    which only a module's first statements may make, are left out."""
    parts, size = [], 0
    for file in sorted(source.rglob("*.py")):
        try:
            text = file.read_text(encoding="utf-8")
            with warnings.catch_warnings():  # `"\d"` in someone's code: not this benchmark's to print
                warnings.simplefilter("ignore")
                tree = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        for statement in tree.body:
            if isinstance(statement, ast.ImportFrom) and statement.module == "__future__":
                lines[statement.lineno - 1:statement.end_lineno] = ["\n"] * (statement.end_lineno - statement.lineno + 1)
        parts.append("".join(lines).rstrip("\n") + "\n\n\n")
        size += len(parts[-1])
        if size >= megabytes * 1_000_000:
            break
    path.write_text("".join(parts), encoding="utf-8")
    return path


def _env(bytecode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONPYCACHEPREFIX": bytecode}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _timed(command: list[str], env: dict) -> tuple[float, float, str]:
    """Wall seconds, peak resident memory (MB, of the process and its workers) and stdout of one fresh process."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        start = time.perf_counter()
        process = subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        if process.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{stderr.read().decode()[-2000:]}")
        return elapsed, usage.ru_maxrss / 1024, stdout.read().decode()


def _ampmigrate(*args: str) -> list[str]:
    return [sys.executable, "-m", "migrate", *args]  # the command as installed: `migrate.cli.run`


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="a real source tree (repeatable)")
    parser.add_argument("--file", default=str(REPO / "fixtures" / "legacy" / "train_o1.py"), help="one apex file")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--big-mb", type=float, default=5.0, help="largest generated file, in MB (0: skip)")
    parser.add_argument("--cells-kb", type=float, default=400.0, help="largest script of repeated cells, in KB (0: skip)")
    parser.add_argument("--joined", help="a folder of real code to join into one module")
    parser.add_argument("--joined-mb", type=float, default=5.0, help="largest module joined from --joined, in MB")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ampmigrate-bench-") as directory:
        env = _env(str(Path(directory) / "bytecode"))
        _timed(_ampmigrate("--check", options.file), env)  # compiles the bytecode, as an install does
        tree_rows = {tree: ([], []) for tree in options.tree}
        one, imports = [], []
        for _ in range(options.rounds):
            for tree in options.tree:
                check = _timed(_ampmigrate("--check", tree), env)[0]
                parse = float(_timed([sys.executable, "-c", _PARSE_TREE, tree], env)[2].split()[0])
                tree_rows[tree][0].append(check)
                tree_rows[tree][1].append(parse)
            one.append(_timed(_ampmigrate("--check", options.file), env)[0])
            imports.append(_timed([sys.executable, "-c", "import libcst"], env)[0])

        print(f"cores: {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()}; "
              f"rounds: {options.rounds} (medians)")
        for tree, (checks, parses) in tree_rows.items():
            files = sum(1 for p in Path(tree).rglob("*.py") if p.is_file() and not p.is_symlink())
            ratio = statistics.median(c / p for c, p in zip(checks, parses))
            print(f"{tree} ({files} files): --check {statistics.median(checks):.2f} s, "
                  f"libcst parse {statistics.median(parses):.2f} s, ratio {ratio:.2f} (goal <= 0.3)")
        ratio = statistics.median(o / i for o, i in zip(one, imports))
        print(f"{options.file}: --check {statistics.median(one):.3f} s, import libcst "
              f"{statistics.median(imports):.3f} s, ratio {ratio:.2f} (goal <= 1.3)")

        if options.big_mb:
            sizes = [options.big_mb / 8, options.big_mb / 4, options.big_mb / 2, options.big_mb]
            for megabytes in sizes:
                path = big_file(Path(directory) / f"big_{megabytes:g}.py", megabytes)
                elapsed, peak, _ = _timed(_ampmigrate("--check", str(path)), env)
                parse, parse_peak, _ = _timed([sys.executable, "-c", _PARSE_FILE, str(path)], env)
                print(f"generated apex file, {path.stat().st_size / 1e6:.2f} MB: --check {elapsed:.1f} s, "
                      f"peak memory {peak:.0f} MB; libcst parse alone {parse:.1f} s, {parse_peak:.0f} MB")
            for megabytes in sizes:
                path = big_file(Path(directory) / f"model_{megabytes:g}.py", megabytes, _MODEL_CODE, _TRAINING)
                elapsed, peak, _ = _timed(_ampmigrate("--check", str(path)), env)
                parse, parse_peak, _ = _timed([sys.executable, "-c", _PARSE_FILE, str(path)], env)
                print(f"model code around one apex training function, {path.stat().st_size / 1e6:.2f} MB: "
                      f"--check {elapsed:.1f} s, peak memory {peak:.0f} MB; libcst parse alone {parse:.1f} s, "
                      f"{parse_peak:.0f} MB")

        if options.cells_kb:
            for kilobytes in (options.cells_kb / 4, options.cells_kb / 2, options.cells_kb):
                path = big_file(Path(directory) / f"cells_{kilobytes:g}.py", kilobytes / 1000, _CELL)
                elapsed, peak, _ = _timed(_ampmigrate("--check", str(path)), env)
                parse, parse_peak, _ = _timed([sys.executable, "-c", _PARSE_FILE, str(path)], env)
                print(f"repeated top-level cells, {path.stat().st_size / 1e3:.0f} KB: --check {elapsed:.1f} s, "
                      f"peak memory {peak:.0f} MB; libcst parse alone {parse:.1f} s, {parse_peak:.0f} MB")

        if options.joined:
            for megabytes in (options.joined_mb / 4, options.joined_mb / 2, options.joined_mb):
                path = joined_file(Path(directory) / f"joined_{megabytes:g}.py", Path(options.joined), megabytes)
                elapsed, peak, _ = _timed(_ampmigrate("--check", str(path)), env)
                parse, parse_peak, _ = _timed([sys.executable, "-c", _PARSE_FILE, str(path)], env)
                print(f"{options.joined} joined, {path.stat().st_size / 1e6:.2f} MB: --check {elapsed:.1f} s, "
                      f"peak memory {peak:.0f} MB; libcst parse alone {parse:.1f} s, {parse_peak:.0f} MB")


if __name__ == "__main__":
    main()
