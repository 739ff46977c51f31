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
from migrate.apex_plan.vocabulary import INITIALIZED_ELSEWHERE as INITIALIZED_SETTING
from migrate.apex_plan.vocabulary import SCALE_LOSS_KEPT as SETTING
from migrate.files import project_root

__all__ = ["INITIALIZED_SETTING", "SETTING", "initialized_elsewhere", "scaled_elsewhere"]

_INITIALIZES = re.compile(r"amp\s*\.\s*initialize\s*\(")
_CALLS = {halves.SCALE_LOSS: "`amp.scale_loss`", halves.STATE: "apex's `amp.state_dict`/`load_state_dict`"}


def scaled_elsewhere(texts: Mapping[Path, str], settings: Mapping, partners: Mapping[Path, object],
                     unsafe_fixes: bool, migrated: Mapping[Path, bool] | None = None) -> dict[Path, tuple[str, ...]]:
    """For each file in ``texts`` that calls ``amp.initialize`` and is no half of a pair (``partners``
    plans those), the places (``path:line``, relative to its project) of the scale halves it is
    linked to by an import that will keep calling apex's ``amp.scale_loss``; ``migrated``: files
    (resolved) already known to migrate or not."""
    found: dict[Path, tuple[str, ...]] = {}
    run = {path.resolve(): (text, partners.get(path)) for path, text in texts.items()}
    migrated = dict(migrated or {})
    for path, text in texts.items():
        if path not in partners and _INITIALIZES.search(text):
            root = project_root(path)
            # a file that only initializes is a half, which ``halves`` pairs or names; one it cannot
            # (its loop shared by scripts initializing differently) is told here too
            linked = halves.linked_scale_halves(path, text)
            places = tuple(f"{_CALLS[half.role]} at {place}" for half in linked
                           for place in kept_places([(half.path, half.line)], root, run, settings, unsafe_fixes, migrated))
            # a file that also initializes for itself stays on apex, left alone for this one (below)
            places += tuple(f"{_CALLS[half.role]} at {_relative(half.path, root)}:{half.line}"
                            for half in halves.linked_trainers(path, text))
            if places:
                found[path] = places
    return found


def initialized_elsewhere(texts: Mapping[Path, str]) -> dict[Path, tuple[str, ...]]:
    """For each file in ``texts`` that initializes apex amp and scales its own losses, the places
    (``path:line``, relative to its project) of the other files that initialize apex themselves and
    call what scales its losses (``tune.py``: ``amp.initialize(model, opt)``, then the file's
    ``train(model, ...)``). Those runs never make the file's GradScaler, migrated or not: the file is
    left alone (``INITIALIZED_SETTING``), in either mode."""
    found: dict[Path, tuple[str, ...]] = {}
    for path, text in texts.items():
        root = project_root(path)
        places = tuple(f"{_relative(half.path, root)}:{half.line}" for half in halves.linked_initializers(path, text))
        if places:
            found[path] = places
    return found


def _relative(path: Path, root: Path) -> Path:
    return path.relative_to(root) if path.is_relative_to(root) else path
