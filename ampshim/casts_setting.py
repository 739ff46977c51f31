"""Which cast lists O1 follows: ``AMPSHIM_CASTS``, read without importing torch.

``python -m ampshim compare`` sets it for the side it runs on ampshim, and its own process never
imports torch; so the setting lives here, apart from :mod:`ampshim.casting`.
"""
from __future__ import annotations

import os

__all__ = ["CASTS_ENV_VAR", "follows_apex_lists"]

CASTS_ENV_VAR = "AMPSHIM_CASTS"
_CASTS_CHOICES = ("apex", "native")


def follows_apex_lists(device_type: str) -> bool:
    """Whether O1 on ``device_type`` enforces apex's default lists where native autocast differs.

    ``AMPSHIM_CASTS=apex`` or ``native`` chooses on every device. Unset: native on CUDA, whose
    lists are apex's near enough (the differences are documented) and where wrappers would put
    Python on every call; apex's elsewhere, where the native lists differ widely. ``python -m
    ampshim compare`` runs the original with ``native``, so both sides share the device's
    autocast policy and only the rewrite is judged.
    """
    chosen = os.environ.get(CASTS_ENV_VAR, "").strip().lower()
    if not chosen:
        return device_type != "cuda"
    if chosen not in _CASTS_CHOICES:
        raise ValueError(
            f"{CASTS_ENV_VAR}={chosen!r}: use 'apex' (apex's cast lists, enforced where native "
            "autocast differs) or 'native' (native autocast's own policy), or unset it.")
    return chosen == "apex"
