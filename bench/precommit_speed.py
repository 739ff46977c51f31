"""How long the pre-commit hook takes on one staged file: wall time of its command line, interpreter
start included, as pre-commit runs it.

The hook's command is read from ``.pre-commit-hooks.yaml`` (``entry`` plus the file name) and run
with the ``ampmigrate`` installed beside this Python (``pip install .`` first, as pre-commit's
environment has it), in a fresh git repository where the file is the one staged change. One
warm-up run writes the bytecode caches that an installed package has; each figure is the median
of ``--runs`` runs, the files measured in turn, beside the interpreter starting alone
(``python -c pass``, the floor on this machine at this load) and importing libcst alone (the floor
for a file the hook must parse). The goal is under 0.3 s of wall
time; the CPU time each run used (user + system) is printed beside it, as on a busy machine it
says what an idle one would show better than the wall time does.

    python bench/precommit_speed.py [--hook ampmigrate-check] [--runs 21] [FILE ...]

Without FILE: a native training loop written here (what most commits hold) and the bundled
apex script ``fixtures/legacy/train_o1.py`` (a file the hook parses and reports).
"""
import argparse
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NATIVE_LOOP = '''import torch
import torch.nn.functional as F


def train(model, optimizer, loader, epochs, log_every=100):
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.cross_entropy(model(x.cuda()), y.cuda())
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if step % log_every == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f}")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict()}, "last.pt")
'''


def hook_entry(hook_id: str) -> list[str]:
    """The ``entry`` of ``hook_id`` in ``.pre-commit-hooks.yaml``, split as pre-commit splits it."""
    text = (ROOT / ".pre-commit-hooks.yaml").read_text()
    block = re.search(rf"^- id: {re.escape(hook_id)}\n(.*?)(?=^- id: |\Z)", text, re.M | re.S)
    if block is None:
        sys.exit(f"no hook {hook_id!r} in .pre-commit-hooks.yaml")
    return shlex.split(re.search(r"^\s+entry: (.+)$", block.group(1), re.M).group(1))


def staged_repository(folder: Path, source: Path) -> Path:
    subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
    target = folder / source.name
    shutil.copyfile(source, target)
    subprocess.run(["git", "add", target.name], cwd=folder, check=True)
    return target


def wall_time(command: list[str], cwd: Path) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and exit status of one run of ``command``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    completed = subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, completed.returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--hook", default="ampmigrate-check")
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    entry = hook_entry(args.hook)
    executable = Path(sys.executable).parent / entry[0]
    if not executable.exists():
        executable = shutil.which(entry[0])
        if executable is None:
            sys.exit(f"{entry[0]} is not installed beside {sys.executable}: pip install . first")
    env_note = "AMPSHIM_AUTOLOAD" in os.environ and f" (AMPSHIM_AUTOLOAD={os.environ['AMPSHIM_AUTOLOAD']})" or ""
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        sources = args.files
        if not sources:
            native = Path(scratch) / "train_native.py"
            native.write_text(NATIVE_LOOP)
            sources = [native, ROOT / "fixtures" / "legacy" / "train_o1.py"]
        cases = []
        for index, source in enumerate(sources):
            folder = Path(scratch) / f"repository{index}"
            folder.mkdir()
            staged = staged_repository(folder, source.resolve())
            command = [str(executable), *entry[1:], staged.name]
            wall_time(command, folder)  # warm-up: bytecode caches
            cases.append((source, command, folder, []))
        cases.append((Path("python -c pass"), [sys.executable, "-c", "pass"], Path(scratch), []))
        cases.append((Path("import libcst"), [sys.executable, "-c", "import libcst"], Path(scratch), []))
        for _ in range(args.runs):
            for _source, command, folder, times in cases:
                times.append(wall_time(command, folder))
    print(f"hook {args.hook}: {shlex.join([entry[0], *entry[1:]])} FILE{env_note}; python {sys.version.split()[0]}; "
          f"median of {args.runs} runs, goal < 0.300 s")
    print(f"load average before: {load[0]:.2f}, after: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    for source, _command, _folder, times in cases:
        seconds = [wall for wall, _, _ in times]
        cpu = statistics.median(cpu for _, cpu, _ in times)
        codes = sorted({code for _, _, code in times})
        print(f"  {source.name:<20} {statistics.median(seconds):.3f} s wall (min {min(seconds):.3f}, "
              f"max {max(seconds):.3f}), {cpu:.3f} s CPU; exit {', '.join(map(str, codes))}")


if __name__ == "__main__":
    main()
