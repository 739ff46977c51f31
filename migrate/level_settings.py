"""Where a project sets apex's opt level to O2 or O3 outside the file that reads it.

A file that passes ``opt_level=args.amp_level`` keeps O0 and O1 natively and, where the level
comes at run time, stops O2/O3 runs with an error (no run silently trains differently). That is
a fair trade where O1 is what people run; not where the project's default, or every config it
ships, says O2 (``add_argument("--amp_level", default="O2")`` in ``configs/config.py``, ``"amp_level":
"O2"`` in a JSON config): there the migrated script would refuse the run people make most. So each
file that initializes apex amp is told (``SETTING``) which option names its project sets to O2 or
O3, and where (``files.project_root``, searched on disk even when one file is given); its plan reads
the name its ``opt_level`` reads.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

from migrate.files import project_files_saying, project_root

__all__ = ["SETTING", "set_elsewhere"]

SETTING = "apex-level-set-elsewhere"  # the setting that hands a file these places (not a user setting)

_INITIALIZES = re.compile(r"amp\s*\.\s*initialize\s*\(")
# `add_argument("--amp_level", type=str, default="O2")`, within one call
_ARGPARSE = re.compile(rb"""add_argument\(\s*["']-*([A-Za-z_][\w-]*)["'][^()]*?\bdefault\s*=\s*["'](O[23])["']""", re.S)
# `amp_level="O2"`, `"amp_level": "O2"`, `amp_level: O2` (a config file, a dataclass field, a dict)
_ASSIGNED = re.compile(rb"""^[^#\n]*?["']?\b([A-Za-z_][\w-]*)["']?\s*(?::\s*\w+\s*=|[:=])\s*["']?(O[23])\b["']?""", re.M)
_CONFIG_SUFFIXES = (".json", ".yaml", ".yml", ".toml", ".cfg", ".ini")
_MOST_CONFIGS = 2000  # a project's search looks at no more config files than this
_LARGEST_CONFIG = 1 << 20


def set_elsewhere(texts: Mapping[Path, str]) -> dict[Path, dict[str, str]]:
    """For each file in ``texts`` that calls ``amp.initialize``, the option names its project sets
    to O2 or O3 (dashes read as underscores), each with its first place (``path:line: O2``)."""
    found: dict[Path, dict[str, str]] = {}
    for path, text in texts.items():
        if _INITIALIZES.search(text):
            names = _names_under(project_root(path))
            if names:
                found[path] = dict(names)
    return found


@lru_cache(maxsize=8)
def _names_under(root: Path) -> tuple[tuple[str, str], ...]:
    names: dict[str, str] = {}
    sources = [(path, data) for path, data in project_files_saying(root, b"O2")]
    sources += [(path, data) for path, data in project_files_saying(root, b"O3") if b"O2" not in data]
    for path, data in [*sources, *_configs(root)]:
        for pattern in (_ARGPARSE, _ASSIGNED):
            for match in pattern.finditer(data):
                name = match.group(1).decode().replace("-", "_")
                line = data.count(b"\n", 0, match.start(2)) + 1
                place = f"{path.relative_to(root) if path.is_relative_to(root) else path}:{line}"
                names.setdefault(name, f"{place}: {match.group(2).decode()}")
    return tuple(sorted(names.items()))


def _configs(root: Path) -> list[tuple[Path, bytes]]:
    """The project's config files that mention O2 or O3, at most ``_MOST_CONFIGS`` looked at."""
    found, seen = [], 0
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if not name.startswith(".") and name not in ("node_modules", "__pycache__")]
        for name in files:
            if not name.endswith(_CONFIG_SUFFIXES):
                continue
            seen += 1
            if seen > _MOST_CONFIGS:
                return found
            path = Path(folder, name)
            try:
                if path.stat().st_size > _LARGEST_CONFIG:
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            if b"O2" in data or b"O3" in data:
                found.append((path.resolve(), data))
    return found
