"""Where a project loads an optimizer's saved state, for the ``FusedAdam`` rewrite (AMP012).

apex's ``FusedAdam`` keeps its step count in each parameter group; torch's ``Adam``/``AdamW``
keep it in each parameter's state, and loading a state saved by apex raises ``KeyError: 'step'``.
A run that starts afresh trains the same either way; one that resumes from a checkpoint saved
before the migration does not run. So a file whose ``FusedAdam`` is rewritten is told
(``SETTING``) where its project (``files.project_root``, searched on disk even when one file is
given) calls ``load_state_dict`` on something named as an optimizer (``optimizer``,
``self.loss_optimizer``, ``opt``: ``step_model.vocabulary.optimizer_like``), and the swap is then only reported. A load through a receiver
named otherwise (a trainer loading its own parts) is not seen.
"""
from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from migrate import disk_reads
from migrate.files import place, project_root, project_trees_saying
from migrate.step_model.vocabulary import optimizer_like

__all__ = ["SETTING", "loads"]

SETTING = "optimizer-state-loaded"  # the setting that hands a file these places (not a user setting)


def loads(texts: Mapping[Path, str]) -> dict[Path, tuple[str, ...]]:
    """For each file in ``texts`` that uses ``FusedAdam``, the places (``path:line``, relative to
    its project) where its project loads an optimizer's state."""
    found: dict[Path, tuple[str, ...]] = {}
    for path, text in texts.items():
        if "FusedAdam" in text:
            root = project_root(path)
            places = tuple(place(file, line, root)
                           for file, line in _loads(root))
            if places:
                found[path] = places
    return found


@disk_reads.cached(maxsize=64)
def _loads(root: Path) -> tuple[tuple[Path, int], ...]:
    places = []
    for file, tree in project_trees_saying(root, b"load_state_dict"):
        places += [(file, node.lineno) for node in ast.walk(tree) if isinstance(node, ast.Call)
                   and isinstance(node.func, ast.Attribute) and node.func.attr == "load_state_dict"
                   and optimizer_like(ast.unparse(node.func.value))]
    return tuple(places)
