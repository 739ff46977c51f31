"""Where a project will still scale losses with apex amp, or keep its state, after a run, beside a
file that initializes it.

A file that calls both ``amp.initialize`` and ``amp.scale_loss`` is planned on its own; another
file it imports (or that imports it) may scale a loss too, for the optimizer it initialized
(``attack_pgd(model, X, y, opt)`` in ``utils.py``, under ``amp.scale_loss(loss, opt)``), or save
and load apex's loss-scaler state in its checkpoints (``save_checkpoint(..., optimizer)`` with
``amp.state_dict()``). Where that file stays on apex, not in the run, or in it but not rewritten
in this mode, removing this file's ``amp.initialize`` makes apex fail there ("Amp state has not
been initialized"; no loss scalers to save). So such a file is told (``SETTING``) where, and is
not rewritten: the two are migrated together.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from migrate import halves
from migrate.apex_kept import kept_places
from migrate.apex_plan.vocabulary import SCALE_LOSS_KEPT as SETTING
from migrate.files import project_root

__all__ = ["SETTING", "scaled_elsewhere"]

_INITIALIZES = re.compile(r"amp\s*\.\s*initialize\s*\(")
_CALLS = {halves.SCALE_LOSS: "`amp.scale_loss`", halves.STATE: "apex's `amp.state_dict`/`load_state_dict`"}


def scaled_elsewhere(texts: Mapping[Path, str], settings: Mapping, partners: Mapping[Path, object],
                     unsafe_fixes: bool) -> dict[Path, tuple[str, ...]]:
    """For each file in ``texts`` that calls ``amp.initialize`` and is no half of a pair (``partners``
    plans those), the places (``path:line``, relative to its project) of the scale halves it is
    linked to by an import that will keep calling apex's ``amp.scale_loss``."""
    found: dict[Path, tuple[str, ...]] = {}
    run = {path.resolve(): (text, partners.get(path)) for path, text in texts.items()}
    migrated: dict[Path, bool] = {}
    for path, text in texts.items():
        if path not in partners and _INITIALIZES.search(text):
            places = tuple(f"{_CALLS[half.role]} at {place}" for half in halves.linked_scale_halves(path, text)
                           for place in kept_places([(half.path, half.line)], project_root(path), run, settings, unsafe_fixes, migrated))
            if places:
                found[path] = places
    return found
