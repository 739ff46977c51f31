"""What the small training scripts of the rewrite tests share: their head, and their comparison
with a rewrite of them by ``python -m ampshim compare`` on the CPU."""
from __future__ import annotations

from pathlib import Path


# one half of a pair: a module whose loop scales losses for an optimizer `amp.initialize`d elsewhere
SCALE_HALF = """import torch
from apex import amp


def train_epoch(model, optimizer, loader):
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""


def script_head(arguments: str = "", imports: tuple[str, ...] = ()) -> str:
    """argparse's ``--steps`` (and the ``add_argument`` lines ``arguments``), torch, apex's amp (and
    ``imports``), a fixed seed, ``device = "cuda"`` (compare runs it on the CPU)."""
    extra = "".join(f"import {name}\n" for name in imports)
    return (f"import argparse\n{extra}\nimport torch\nimport torch.nn.functional as F\nfrom apex import amp\n\n"
            "parser = argparse.ArgumentParser()\n"
            'parser.add_argument("--steps", type=int, default=30)\n'
            f"{arguments}"
            "args = parser.parse_args()\n\n"
            "torch.manual_seed(0)\n"
            'device = "cuda"\n')


def compared(folder: Path, original: str, rewritten: str, name: str, *, steps: int = 30, args: tuple[str, ...] = ()):
    """compare's result for the script ``original`` against ``rewritten``, both written in ``folder``."""
    from ampshim.compare import Target, compare

    (folder / "original.py").write_text(original)
    (folder / f"{name}.py").write_text(rewritten)
    return compare(Target(str(folder / "original.py")), Target(str(folder / f"{name}.py")), list(args), device="cpu",
                   steps=steps, parallel=True, timeout=600)
