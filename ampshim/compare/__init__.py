"""``python -m ampshim compare``: does a migrated script still train like the apex original?

Both run, each in its own process, from the same seed: the original on ampshim, the migration on
native ``torch.amp`` with apex unavailable. Every optimizer step of both is recorded as it
happens (loss, its dtype, loss scale, skipped or taken, gradient norm, the forward's precision),
and the two trajectories are compared step by step.
"""
from ampshim.compare.comparison import COULD_NOT_RUN, DIFFERS, SAME, Comparison, compare
from ampshim.compare.runner import Target
from ampshim.compare.verdict import Difference

__all__ = ["compare", "Comparison", "Difference", "Target", "SAME", "DIFFERS", "COULD_NOT_RUN"]
