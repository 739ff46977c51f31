"""Where a project sets apex's opt level to O2 or O3 outside the file that reads it.

A file that passes ``opt_level=args.amp_level`` keeps O0 and O1 natively and, where the level
comes at run time, stops O2/O3 runs with an error (no run silently trains differently). That is
a fair trade where O1 is what people run; not where the project's default, or every config it
ships, says O2 (``add_argument("--amp_level", default="O2")`` in ``configs/config.py``, ``"amp_level":
"O2"`` in a JSON config, ``--amp-level O2`` in a shell script or a README's command): there the
migrated script would refuse the run people make most. So each
file that initializes apex amp is told (``SETTING``) which option names its project sets to O2 or
O3, and where (``files.project_root``, searched on disk even when one file is given); its plan reads
the name its ``opt_level`` reads.
"""
from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

from migrate import disk_reads
from migrate.files import in_project, project_root, project_trees_saying

__all__ = ["SETTING", "on_a_command_line", "set_elsewhere"]

SETTING = "apex-level-set-elsewhere"  # the setting that hands a file these places (not a user setting)

_INITIALIZES = re.compile(r"amp\s*\.\s*initialize\s*\(")
# a config file's `amp_level: O2`, `"amp_level": "O2",`, `amp_level = "O2"` on a line of its own
_CONFIG_LINE = re.compile(rb"""^\s*["']?([A-Za-z_][\w-]*)["']?\s*[:=]\s*["']?(O[23])\b["']?\s*,?\s*$""", re.M)
_CONFIG_SUFFIXES = (".json", ".yaml", ".yml", ".toml", ".cfg", ".ini")
# a command line's `--amp-level O2`, `--opt_level='O2'`, `--amp_level=O3` in a script or the docs
_COMMAND_OPTION = re.compile(rb"""(?<![\w-])--([A-Za-z_][\w-]*)(?:=|[ \t]+)["']?(O[23])\b""")
_COMMAND_SUFFIXES = (".sh", ".bash", ".md", ".rst")
_MOST_TEXTS = 2000  # a project's search looks at no more config, script and doc files than this
_LARGEST_CONFIG = 1 << 20
_LEVELS = ("O2", "O3")
_IMPORTED = re.compile(r"^\s*(?:from|import)\s+(?:[\w.]*\.)?(\w+)", re.M)  # the last part of each imported module


def set_elsewhere(texts: Mapping[Path, str]) -> dict[Path, dict[str, str]]:
    """For each file in ``texts`` that calls ``amp.initialize``, the option names its project sets
    to O2 or O3 (dashes read as underscores), each with its first place (``path:line: O2``)."""
    found: dict[Path, dict[str, str]] = {}
    for path, text in texts.items():
        if _INITIALIZES.search(text):
            # a module's setting counts where the file imports that module (`from config import
            # parse_args`); a config file's, always: a folder of unrelated scripts is no project
            imported = set(_IMPORTED.findall(text))
            names = {}
            # a command line's setting goes last, so it wins: it overrides every default
            for name, place, module in sorted(_names_under(project_root(path)), key=lambda found: on_a_command_line(found[1])):
                if module is None or module in imported:
                    names[name] = place
            if names:
                found[path] = names
    return found


def on_a_command_line(place: str) -> bool:
    """Whether a place ``set_elsewhere`` gives is a command line (``scripts/train.sh:4: O2``): it
    overrides the script's own default, where a config file or another module's default does not."""
    return place.split(":", 1)[0].endswith(_COMMAND_SUFFIXES)


@disk_reads.cached(maxsize=8)
def _names_under(root: Path) -> tuple[tuple[str, str, str | None], ...]:
    """Each setting to O2/O3 in the project: the option's name, its place (``path:line: O2``) and
    the module it is in (None in a config file)."""
    names: dict[tuple[str, str | None, bool], str] = {}

    def found(path: Path, name: str, line: int, level: str, module: str | None) -> None:
        place = f"{path.relative_to(root) if path.is_relative_to(root) else path}:{line}: {level}"
        names.setdefault((name.replace("-", "_"), module, on_a_command_line(place)), place)

    for path, tree in project_trees_saying(root, (b"O2", b"O3")):
        for name, line, level in _python_settings(tree):
            found(path, name, line, level, path.stem)
    for path, data in _texts(root):
        for match in (_COMMAND_OPTION if path.suffix in _COMMAND_SUFFIXES else _CONFIG_LINE).finditer(data):
            if path.suffix in _COMMAND_SUFFIXES and _commented_out(data, match.start()):
                continue
            found(path, match.group(1).decode(), data.count(b"\n", 0, match.start(2)) + 1, match.group(2).decode(), None)
    return tuple(sorted((name, place, module) for (name, module, _), place in names.items()))


def _commented_out(data: bytes, at: int) -> bool:
    """Whether the line holding ``at`` is a comment (``#--fp16_opt_level O2 \\`` in a script)."""
    return data[data.rfind(b"\n", 0, at) + 1:at].lstrip().startswith(b"#")


def _python_settings(tree: ast.Module) -> Iterator[tuple[str, int, str]]:
    """What a module sets to O2/O3 as a setting: an argparse option's default
    (``add_argument("--amp_level", default="O2")``), an assignment (``amp_level = "O2"``, a
    dataclass field ``amp_level: str = "O2"``, ``cfg.amp_level = "O2"``) or a dict key
    (``{"amp_level": "O2"}``); not an argument of a call (``amp.initialize(..., opt_level="O2")``
    is one script's choice, not the option's)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if _level(default) and flags:
                yield max(flags, key=len).lstrip("-"), node.lineno, _level(default)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and _level(node.value):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else None
                if name:
                    yield name, node.lineno, _level(node.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and _level(value):
                    yield key.value, value.lineno, _level(value)


def _level(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and node.value in _LEVELS else None


def _texts(root: Path) -> list[tuple[Path, bytes]]:
    """The project's config files, shell scripts and docs that mention O2 or O3 (not those of a
    project of its own inside it), at most ``_MOST_TEXTS`` looked at."""
    found, seen = [], 0
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if not name.startswith(".") and name not in ("node_modules", "__pycache__")]
        for name in files:
            if not name.endswith(_CONFIG_SUFFIXES + _COMMAND_SUFFIXES):
                continue
            seen += 1
            if seen > _MOST_TEXTS:
                return found
            path = Path(folder, name)
            try:
                if path.stat().st_size > _LARGEST_CONFIG:
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            if (b"O2" in data or b"O3" in data) and in_project(path, root):  # not a vendored apex's README
                found.append((path.resolve(), data))
    return found
