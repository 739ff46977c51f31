"""``--plot FILE.png``: the two loss curves overlaid, skipped steps and the first difference marked."""
from __future__ import annotations

from ampshim.compare.comparison import Comparison

__all__ = ["MissingMatplotlib", "plot"]


class MissingMatplotlib(RuntimeError):
    pass


def plot(result: Comparison, path: str) -> None:
    """Draw the loss of every step of both runs (rank 0) into ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingMatplotlib(
            "--plot needs matplotlib, which is not installed: pip install matplotlib "
            "(or the ampshim distribution's 'plot' extra)") from None
    rank = min(result.original.ranks) if result.original.ranks else 0
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    for name, run, style in (("original (apex on ampshim)", result.original, "-"),
                             ("migrated (native torch.amp)", result.migrated, "--")):
        trajectory = run.ranks.get(rank)
        if trajectory is None:
            continue
        points = [(step.number, step.backwards[-1].loss) for step in trajectory.steps
                  if step.backwards and step.backwards[-1].loss is not None]
        if points:
            line, = axes.plot(*zip(*points), style, marker=".", label=name)
            skipped = [(step.number, step.backwards[-1].loss) for step in trajectory.steps
                       if not step.taken and step.backwards and step.backwards[-1].loss is not None]
            if skipped:
                axes.plot(*zip(*skipped), "x", color=line.get_color(), markersize=10,
                          label=f"{name.split()[0]}: step skipped")
    difference = result.difference
    if difference is not None and difference.step is not None:
        axes.axvline(difference.step, color="red", alpha=0.4, linestyle=":")
        axes.annotate(f"step {difference.step}: {difference.cause}", (difference.step, 0.0),
                      xycoords=("data", "axes fraction"), xytext=(4, 6),
                      textcoords="offset points", color="red", fontsize=9)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("loss")
    axes.set_title(f"ampshim compare: {result.verdict}", loc="left")
    axes.set_xlim(left=0)
    axes.legend(loc="upper right", fontsize=9)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
