"""Which paths of a git work tree its ignore files leave out, read as git reads them.

A directory search skips what ``git add`` would skip: the patterns of every ``.gitignore`` from
the repository's root down to the file, and of ``.git/info/exclude``. A deeper file's patterns
come after its parents', and the last pattern that matches decides (``!pattern`` takes a path
back). A path under an ignored directory stays ignored, since the search never enters it. The
user's global excludes file (``core.excludesFile``) is not read: it is a setting of one machine,
and a run should not depend on whose machine it is. Outside a git work tree nothing is ignored.

Patterns follow gitignore(5): ``#`` comments, ``\\`` escapes, a trailing ``/`` for directories only,
a ``/`` at the start or in the middle anchoring the pattern to its file's directory, ``*``, ``?``,
``[...]`` within one path component, and ``**`` across components.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple, Sequence

__all__ = ["Pattern", "Rules", "ignored", "parse", "read_directory", "repository_root", "rules_above"]


class Pattern(NamedTuple):
    """One line of an ignore file, for paths relative to ``base`` (the file's directory)."""

    base: str
    regex: re.Pattern
    negated: bool
    directories_only: bool

    def matches(self, path: str, is_directory: bool) -> bool:
        """``path``: absolute, with ``/`` separators."""
        if self.directories_only and not is_directory:
            return False
        prefix = self.base.rstrip("/") + "/"
        if not path.startswith(prefix):
            return False
        return self.regex.match(path[len(prefix):]) is not None


Rules = tuple  # of Pattern, outermost file first


def ignored(rules: Rules, path: str, is_directory: bool) -> bool:
    """Whether the last pattern of ``rules`` matching ``path`` ignores it."""
    for pattern in reversed(rules):
        if pattern.matches(path, is_directory):
            return not pattern.negated
    return False


def parse(text: str, base: str) -> list[Pattern]:
    """The patterns of one ignore file whose directory is ``base`` (absolute, ``/`` separators)."""
    found = []
    for line in text.splitlines():
        pattern = _compile(line, base)
        if pattern is not None:
            found.append(pattern)
    return found


def _compile(line: str, base: str) -> Pattern | None:
    line = _strip_trailing_spaces(line)
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    directories_only = line.endswith("/") and not line.endswith("\\/")
    line = line.rstrip("/") if directories_only else line
    if not line:
        return None
    anchored = "/" in line
    body = _translate(line.lstrip("/"))
    regex = re.compile(("" if anchored else "(?:.*/)?") + body + r"\Z", re.DOTALL)
    return Pattern(base, regex, negated, directories_only)


def _strip_trailing_spaces(line: str) -> str:
    """Trailing spaces go, unless escaped with a backslash (which then goes too)."""
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        return stripped[:-1] + " "
    return stripped


def _translate(glob: str) -> str:
    """A gitignore glob as a regex over a path relative to the ignore file's directory."""
    out = []
    i, n = 0, len(glob)
    while i < n:
        char = glob[i]
        if char == "*":
            if glob.startswith("**", i) and (i == 0 or glob[i - 1] == "/") and (i + 2 == n or glob[i + 2] == "/"):
                if i + 2 == n:  # "dir/**": everything inside
                    out.append(".*")
                    i += 2
                else:  # "**/" at the start or "/**/" inside: any number of directories
                    out.append("(?:.*/)?")
                    i += 3
                continue
            while i < n and glob[i] == "*":  # other runs of "*" are one "*"
                i += 1
            out.append("[^/]*")
            continue
        if char == "?":
            out.append("[^/]")
        elif char == "[":
            start = i + 1 + (glob[i + 1 : i + 2] in ("!", "^"))
            end = glob.find("]", start + (glob[start : start + 1] == "]"))  # "[]a]": a leading "]" is a member
            if end == -1:
                out.append(re.escape(char))
            else:
                members = "".join(re.escape(c) if c in "\\[]&~|" else c for c in glob[start:end])
                out.append(("[^" if start > i + 1 else "[") + members + "]")
                i = end
        elif char == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(glob[i]))
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def repository_root(directory: Path) -> Path | None:
    """The work tree holding ``directory``: the nearest directory at or above it with a ``.git``."""
    for candidate in (directory, *directory.parents):
        if os.path.lexists(candidate / ".git"):
            return candidate
    return None


def read_directory(directory: Path) -> list[Pattern]:
    """The patterns of ``directory``'s ``.gitignore`` (none if it has none or cannot be read)."""
    try:
        text = (directory / ".gitignore").read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return []
    return parse(text, directory.as_posix())


def rules_above(directory: Path) -> Rules | None:
    """The rules that apply to ``directory``'s contents from the files above it (and its
    repository's ``.git/info/exclude``), its own ``.gitignore`` not included; None outside a work tree."""
    directory = Path(os.path.realpath(directory))
    root = repository_root(directory)
    if root is None:
        return None
    found: list[Pattern] = []
    try:
        exclude = (root / ".git" / "info" / "exclude").read_text(encoding="utf-8", errors="surrogateescape")
        found += parse(exclude, root.as_posix())
    except OSError:  # no such file, or ".git" is a file (a worktree or submodule)
        pass
    chain: Sequence[Path] = [directory, *directory.parents]
    for folder in reversed(chain[1 : chain.index(root) + 1]):
        found += read_directory(folder)
    return tuple(found)
