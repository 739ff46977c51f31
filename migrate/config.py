"""``[tool.ampmigrate]`` from the nearest ``pyproject.toml``.

Example::

    [tool.ampmigrate]
    select = ["AMP0"]
    extend-select = ["AMP021"]
    ignore = ["AMP009"]
    exclude = ["legacy/*", "third_party"]
    unsafe-fixes = false

    [tool.ampmigrate.per-file-ignores]
    "tests/*" = ["AMP8"]

Command-line options override these: ``--select`` replaces ``select`` and ``extend-select``;
``--ignore`` and ``--exclude`` add to ``ignore``/``extend-ignore`` and ``exclude``/``extend-exclude``.
On Python 3.10, where ``tomllib`` is missing, ``tomli`` is used if installed; without it a file that has a ``[tool.ampmigrate]`` table is reported, not guessed at.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

__all__ = ["Config", "ConfigError", "find_pyproject", "load_config"]

class ConfigError(Exception):
    """The configuration cannot be used as written."""


@dataclass(frozen=True)
class Config:
    """The settings read (defaults where the file says nothing); ``path`` is None without a file."""

    path: Path | None = None
    select: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    extend_ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    extend_exclude: tuple[str, ...] = ()
    per_file_ignores: dict = field(default_factory=dict)  # glob -> tuple of code prefixes
    respect_gitignore: bool = True
    unsafe_fixes: bool = False
    output_format: str | None = None
    settings: dict = field(default_factory=dict)  # per-rule options, passed to the rules as they are

    def code_lists(self) -> list[tuple[str, tuple[str, ...]]]:
        """Each list of rule codes the file gives, with the key it is under (to check them against the rules)."""
        lists = [
            ("select", self.select), ("extend-select", self.extend_select),
            ("ignore", self.ignore), ("extend-ignore", self.extend_ignore),
        ]
        lists += [(f"per-file-ignores {pattern!r}", codes) for pattern, codes in self.per_file_ignores.items()]
        return [(key, codes) for key, codes in lists if codes]


# key in the file -> (Config field, expected type)
_KEYS = {
    "select": ("select", list),
    "extend-select": ("extend_select", list),
    "ignore": ("ignore", list),
    "extend-ignore": ("extend_ignore", list),
    "exclude": ("exclude", list),
    "extend-exclude": ("extend_exclude", list),
    "per-file-ignores": ("per_file_ignores", dict),
    "respect-gitignore": ("respect_gitignore", bool),
    "unsafe-fixes": ("unsafe_fixes", bool),
    "output-format": ("output_format", str),
    "settings": ("settings", dict),
}


def find_pyproject(paths: Iterable[str | os.PathLike] = ()) -> Path | None:
    """The nearest ``pyproject.toml`` at or above the common directory of ``paths`` (or the cwd)."""
    resolved = [Path(os.path.realpath(p)) for p in paths if str(p) != "-"]  # a link loop stays as named
    start = Path(os.path.commonpath(resolved)) if resolved else Path.cwd()
    if start.is_file():
        start = start.parent
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(pyproject: Path | None) -> Config:
    """Read ``[tool.ampmigrate]`` from ``pyproject`` (an empty ``Config`` when None or absent).

    Raises ConfigError for a file that is not valid TOML, an unknown key, or a value of the wrong type.
    """
    if pyproject is None:
        return Config()
    try:
        text = pyproject.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{str(pyproject)!r} is not UTF-8 (TOML must be): {error}") from error
    if "ampmigrate" not in text:  # no table to read: spare the TOML parse
        return Config()
    toml = _toml_module()
    if toml is None:
        raise ConfigError(
            f"{str(pyproject)!r} configures ampmigrate, but this Python has no TOML reader; "
            "install 'tomli' (pip install tomli) or use Python 3.11+"
        )
    try:
        table = toml.loads(text).get("tool", {})
    except toml.TOMLDecodeError as error:
        raise ConfigError(f"{str(pyproject)!r} is not valid TOML: {error}") from error
    table = table.get("ampmigrate", {}) if isinstance(table, dict) else {}
    if not isinstance(table, dict):
        raise ConfigError(f"tool.ampmigrate in {str(pyproject)!r} must be a table ([tool.ampmigrate]), not {_toml(table)}")
    values: dict = {}
    for key, value in table.items():
        if key not in _KEYS:
            known = ", ".join(sorted(_KEYS))
            raise ConfigError(f"unknown key {key!r} in [tool.ampmigrate] of {str(pyproject)!r}; known keys: {known}")
        name, expected = _KEYS[key]
        if not isinstance(value, expected) or (expected is list and not all(isinstance(v, str) for v in value)):
            wanted = {list: "a list of strings", dict: "a table", bool: "true or false"}.get(expected, f"a {expected.__name__}")
            raise ConfigError(f"[tool.ampmigrate] {key} in {str(pyproject)!r} must be {wanted}, not {_toml(value)}")
        _check_value(key, value, pyproject)
        if key == "per-file-ignores":
            value = {pattern: tuple(codes) for pattern, codes in value.items()}
        values[name] = tuple(value) if expected is list else value
    return Config(path=pyproject, **values)


def _check_value(key: str, value, pyproject: Path) -> None:
    """Values with a fixed set of choices. (Rule codes in select/ignore are checked against the rules.)"""
    where = f"[tool.ampmigrate] {key} in {str(pyproject)!r}"
    if key == "output-format":
        from migrate.report import FORMATS

        if value not in FORMATS:
            raise ConfigError(f"{where} must be one of {', '.join(map(_toml, FORMATS))}, not {_toml(value)}")
    elif key == "per-file-ignores":
        for pattern, codes in value.items():
            if not isinstance(codes, list) or not all(isinstance(code, str) for code in codes):
                raise ConfigError(f"{where}: {_toml(pattern)} must map to a list of rule codes, not {_toml(codes)}")
    elif key == "settings":
        for name, setting in value.items():
            if name not in _SETTINGS:
                known = ", ".join(sorted(_SETTINGS))
                raise ConfigError(f"unknown setting {name!r} in {where}; known settings: {known}")
            if setting not in _SETTINGS[name]:
                choices = ", ".join(_toml(choice) for choice in _SETTINGS[name])
                raise ConfigError(f"{where}: {name} must be one of {choices}, not {_toml(setting)}")


def _toml(value) -> str:
    """``value`` as pyproject.toml spells it (``true``, ``"O1"``, ``["AMP0"]``), for an error message."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml(key)} = {_toml(item)}" for key, item in value.items()) + "}"
    return str(value)


# [tool.ampmigrate.settings]: each setting the rules read, with its choices.
_SETTINGS = {
    "opt-level": ("O0", "O1"),  # every opt level computed at run time is this one (the apex rewrites)
    "o2-as-autocast": (True, False),  # apex O2 may become autocast with fp32 weights (apex_plan.ACCEPT_O2)
}


def _toml_module():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            return None
    return tomllib
