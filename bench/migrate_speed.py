"""How fast is ``ampmigrate --check`` on a tree, against merely parsing that tree with libcst?

Generates a tree of Python files (ordinary PyTorch code; a few files use apex, a few the
deprecated ``torch.cuda.amp`` spellings) in a temporary directory, then measures, as wall time:

1. ``ampmigrate --check TREE`` in a fresh process (interpreter start-up included);
2. ``libcst.parse_module`` over every file, in this one process (libcst's import excluded);
3. ``ampmigrate --check ONE_FILE`` in a fresh process, the pre-commit case (best of a few runs);
4. the same without bytecode: every ``migrate`` module compiled from source at each start.

ampmigrate runs as installed: ``pip install`` (and so pre-commit) compiles the package's
bytecode once, so the runs use a bytecode cache of their own (``PYTHONPYCACHEPREFIX``, filled
by a first run that is not counted), whatever ``PYTHONDONTWRITEBYTECODE`` says here. The last
measurement shows what compiling costs, as in a checkout run with ``PYTHONDONTWRITEBYTECODE=1``.

Goals: the check of a 1,000-file tree under 2 s on 2 cores, one file under 0.3 s.

Usage::

    python bench/migrate_speed.py [--files 2000] [--jobs N] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_MODULE = '''"""Model and data code for experiment {index}."""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block{index}(nn.Module):
    """A residual block with {width} hidden units."""

    def __init__(self, dim: int = {width}, dropout: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        x = self.norm(x)
        x = F.gelu(self.fc1(x))
        x = self.dropout(self.fc2(x))
        return (x + residual).clamp(-1e4, 1e4)


def build_model(depth: int = {depth}, dim: int = {width}) -> nn.Module:
    layers = [Block{index}(dim) for _ in range(depth)]
    return nn.Sequential(*layers)


def cosine_schedule(step: int, total: int, base_lr: float = 3e-4) -> float:
    if step < total // 10:
        return base_lr * step / max(1, total // 10)
    progress = (step - total // 10) / max(1, total - total // 10)
    return 0.5 * base_lr * (1.0 + math.cos(math.pi * progress))


def load_batch(root: str, index: int, batch_size: int = 32) -> dict:
    path = os.path.join(root, f"batch_{{index:05d}}.pt")
    if os.path.exists(path):
        return torch.load(path)
    return {{"x": torch.randn(batch_size, {width}), "y": torch.randint(0, 10, (batch_size,))}}


def evaluate(model: nn.Module, batches, device: str = "cpu") -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in batches:
            logits = model(batch["x"].to(device))
            correct += (logits.argmax(-1) == batch["y"].to(device)).sum().item()
            total += batch["y"].numel()
    return correct / max(1, total)
'''

_APEX = '''

from apex import amp


def train(model, optimizer, loader, args):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for batch in loader:
        loss = F.cross_entropy(model(batch["x"]), batch["y"])
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
'''

_CUDA_AMP = '''

def train(model, optimizer, loader):
    scaler = torch.cuda.amp.GradScaler()
    for batch in loader:
        with torch.cuda.amp.autocast():
            loss = F.cross_entropy(model(batch["x"]), batch["y"])
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
'''


def make_tree(root: Path, files: int) -> list[Path]:
    """``files`` modules in packages of 50; every 250th uses apex, every 250th (offset) torch.cuda.amp."""
    paths = []
    for index in range(files):
        package = root / f"pkg{index // 50:03d}"
        package.mkdir(exist_ok=True)
        text = _MODULE.format(index=index, width=64 + index % 7 * 32, depth=2 + index % 5)
        if index % 250 == 0:
            text += _APEX
        elif index % 250 == 125:
            text += _CUDA_AMP
        path = package / f"module_{index:05d}.py"
        path.write_text(text)
        paths.append(path)
    return paths


def _ampmigrate(*args: str, bytecode: str | None) -> tuple[float, int]:
    """One run in a fresh process; ``bytecode`` is the bytecode cache directory (None: compile from source)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if bytecode is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = bytecode
    command = [sys.executable, "-c", "import sys; from migrate.cli import main; sys.exit(main())", *args]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, env=env)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"ampmigrate failed ({done.returncode}):\n{done.stderr.decode()}")
    return elapsed, done.returncode


def _parse_all(paths: list[Path]) -> float:
    import libcst

    start = time.perf_counter()
    for path in paths:
        libcst.parse_module(path.read_bytes())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=None, help="-j for ampmigrate (default: its own)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the best is kept")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ampmigrate-bench-") as directory:
        root = Path(directory) / "tree"
        root.mkdir()
        bytecode = str(Path(directory) / "bytecode")
        paths = make_tree(root, options.files)
        one_file = next(p for p in paths if "from apex import amp" in p.read_text())
        _ampmigrate("--check", str(one_file), bytecode=bytecode)  # compiles the bytecode, as an install does
        jobs = ["-j", str(options.jobs)] if options.jobs else []
        check = min(_ampmigrate("--check", *jobs, str(root), bytecode=bytecode)[0] for _ in range(options.repeat))
        parse = min(_parse_all(paths) for _ in range(max(1, options.repeat - 1)))
        runs = max(5, options.repeat)
        single = min(_ampmigrate("--check", str(one_file), bytecode=bytecode)[0] for _ in range(runs))
        from_source = min(_ampmigrate("--check", str(one_file), bytecode=None)[0] for _ in range(runs))

    print(f"files: {options.files} ({sum(1 for i in range(options.files) if i % 125 == 0)} with apex or torch.cuda.amp)")
    print(f"ampmigrate --check tree, wall, fresh process: {check:.2f} s")
    print(f"libcst.parse_module of every file, one process: {parse:.2f} s")
    print(f"ratio check / parse: {check / parse:.2f}")
    print(f"ampmigrate --check one file, wall, fresh process: {single:.3f} s")
    print(f"the same, compiling migrate from source (no bytecode): {from_source:.3f} s")
    print(f"cores available: {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()}")


if __name__ == "__main__":
    main()
