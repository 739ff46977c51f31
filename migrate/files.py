"""The files a run reads and writes: finding them, reading them, and replacing them without losing work.

Only regular files are read (a FIFO or a device named ``*.py`` would block or never end).
A directory walk follows no links (so none out of the tree it searches); a file named on the
command line is read through its link. A file is replaced only if it is still what was read: one edited
while the run was in progress is left alone and reported. A replacement keeps the file's mode,
owner and hard links.
"""
from __future__ import annotations

import ast
import errno
import fnmatch
import os
import re
import stat
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from migrate import disk_reads, quiet


__all__ = ["DEFAULT_EXCLUDES", "ChangedSinceRead", "Found", "Source", "exit_now", "find", "known_project_root", "matches", "project_root", "read", "replace"]

# Directory names never searched: version control, caches, build output, installed packages.
DEFAULT_EXCLUDES = (
    ".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "__pycache__", "build", "dist",
    "node_modules", "site-packages", ".mypy_cache", ".pytest_cache", ".eggs", ".ipynb_checkpoints",
)


# What a directory search takes: Python files and Jupyter notebooks.
NOTEBOOK_SUFFIX = ".ipynb"
SUFFIXES = (".py", NOTEBOOK_SUFFIX)


class ChangedSinceRead(OSError):
    """The file changed on disk after it was read: writing would lose that change."""


class Found(NamedTuple):
    """The files to read, in path order, and the paths that cannot be read, with why."""

    files: list[Path]
    problems: dict[Path, str]


class Source(NamedTuple):
    """A file's bytes and the identity they were read with (checked again before replacing it)."""

    data: bytes
    identity: tuple[int, int, int, int]  # device, inode, size, modification time (ns)


def find(paths: Iterable[str | os.PathLike], exclude: Sequence[str] = (), respect_gitignore: bool = True) -> Found:
    """The ``SUFFIXES`` files under ``paths``; see ``migrate.api.discover``.

    A named path that is not a regular file or a directory (a FIFO, a device, a link loop) is a
    problem. Raises FileNotFoundError for a path that does not exist.
    """
    files: dict[Path, None] = {}
    problems: dict[Path, str] = {}
    seen: set[tuple[int, int]] = set()  # files already taken: one reached by another name is read once
    for given in paths:
        root = Path(given)
        kind = _kind(root)
        if kind == "missing":
            raise FileNotFoundError(errno.ENOENT, f"no such file or directory: {str(root)!r}", str(root))
        if kind == "directory":
            _walk(root, exclude, files, problems, seen, respect_gitignore)
        elif not matches(root, exclude):
            if kind != "file":
                problems[root] = _WHY[kind]
                continue
            inode = _inode(root)
            if inode not in seen:  # not a file named before under another name
                files[root] = None
                seen.add(inode)
    return Found(sorted(files), problems)


_ROOT_MARKERS = (".git", "pyproject.toml", "setup.cfg")  # and a `setup.py`, below
# what a packaging script imports: a package's own module named `setup.py` (cvpods' `engine/setup.py`,
# its default argument parser, beside the package's `__init__.py`) imports none of them
_PACKAGING = re.compile(rb"^[ \t]*(?:from|import)[ \t]+(?:setuptools|distutils|skbuild|numpy\.distutils)\b", re.MULTILINE)


def _marks_project(folder: Path) -> bool:
    """Whether ``folder`` holds a ``.git``, a ``pyproject.toml``, a ``setup.cfg`` or a ``setup.py``,
    but not a ``setup.py`` that is a module of the package the folder is and packages nothing."""
    return any((folder / marker).exists() for marker in _ROOT_MARKERS) or _setup_script(folder)


@disk_reads.cached(maxsize=256)
def _setup_script(folder: Path) -> bool:
    script = folder / "setup.py"
    if not (folder / "__init__.py").exists():
        return script.exists()
    try:
        return bool(_PACKAGING.search(script.read_bytes()))
    except OSError:
        return False


def project_root(path: Path) -> Path:
    """The project a file belongs to: the nearest folder up with a ``.git``, ``pyproject.toml``,
    ``setup.py`` or ``setup.cfg``; else the nearest one its own dotted imports start from
    (``from src.utils.load_save import ...`` in ``src/tasks/train.py``: a tree without a marker,
    an export or a copy); else the folder above the package holding it; else its own folder."""
    return known_project_root(path) or path.resolve().parent


def known_project_root(path: Path) -> Path | None:
    """``project_root`` where something says how far the project reaches (a marker, the file's own
    dotted imports, a package holding it); None for a file alone in a folder with none of them,
    which may be a folder of files gathered from many projects."""
    folder = path.resolve().parent
    for candidate in (folder, *folder.parents):
        if _marks_project(candidate):
            return candidate
    return _import_root(path.resolve(), folder)


def places_elsewhere(texts: Mapping[Path, str], needle: str,
                     places_of: Callable[[Path, str, Path], tuple]) -> dict[Path, tuple]:
    """For each file of ``texts`` holding ``needle``, ``places_of(path, text, root)`` (``root``: its
    project's), where that finds any: what a project-wide search tells each file."""
    found = {}
    for path, text in texts.items():
        if needle in text and (places := places_of(path, text, project_root(path))):
            found[path] = places
    return found


def place(file: Path, line: int, root: Path) -> str:
    """``path:line`` as a finding names a place of another file: relative to its project's ``root``."""
    return f"{file.relative_to(root) if file.is_relative_to(root) else file}:{line}"


def outermost_package(path: Path) -> Path | None:
    """The package holding a file: the outermost folder up with an ``__init__.py``; None outside one."""
    folder, package = path.resolve().parent, None
    while (folder / "__init__.py").exists():
        package, folder = folder, folder.parent
    return package


def in_project(path: Path, root: Path) -> bool:
    """Whether ``path``, under ``root``, belongs to that project, not to a project of its own inside
    it (a folder on the way with a ``.git``, ``pyproject.toml`` or ``setup.*``)."""
    folder = path.resolve().parent
    while folder != root and root in folder.parents:
        if _marks_project(folder):
            return False
        folder = folder.parent
    return True


_DOTTED_IMPORT = re.compile(rb"^[ \t]*(?:from|import)[ \t]+([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)", re.MULTILINE)


@disk_reads.cached(maxsize=256)
def _import_root(path: Path, folder: Path) -> Path | None:
    try:
        modules = {match.decode() for match in _DOTTED_IMPORT.findall(path.read_bytes())}
    except (OSError, UnicodeDecodeError):
        return None
    for candidate in (folder, *folder.parents):
        for module in modules:
            found = candidate.joinpath(*module.split("."))
            if found.with_suffix(".py").is_file() or found.is_dir():  # a module, a package (or a namespace one)
                return candidate
    package = None
    while (folder / "__init__.py").is_file():  # else above the package holding it, as its importers see it
        package, folder = folder, folder.parent
    if package is not None and _exported_repository(package) and not any(folder.glob("*.py")):
        return package  # a repository whose top is a package, in a folder of other things (`~/code`)
    return folder if package is not None else None


def _exported_repository(folder: Path) -> bool:
    """Whether ``folder`` reads as a repository's top (a README or a licence beside its code), as an
    export without its ``.git`` keeps it."""
    return any(next(folder.glob(pattern), None) is not None for pattern in ("README*", "LICENSE*", "LICENCE*"))



_MOST_FILES_SEARCHED = 5000  # a project's search on disk looks at no more files than this


@disk_reads.cached(maxsize=8)
def project_python_files(root: Path) -> tuple[Path, ...]:
    """The ``.py`` files of the project at ``root`` (resolved; as ``find`` lists them, ignored
    files left out), at most ``_MOST_FILES_SEARCHED``: what the searches of a project on disk read
    (``halves``, ``importers``, ``cast_registrations``, ``optimizer_resumes``)."""
    return tuple(path.resolve() for path in find([root]).files if path.suffix == ".py")[:_MOST_FILES_SEARCHED]


def project_files_saying(root: Path, needle: bytes | tuple[bytes, ...]) -> Iterator[tuple[Path, bytes]]:
    """The ``.py`` files of the project at ``root`` whose bytes hold ``needle`` (one of them, for a
    tuple), each with its bytes (a file that cannot be read is passed over): what a search of the
    project parses."""
    needles = needle if isinstance(needle, tuple) else (needle,)
    for path in project_python_files(root):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if any(each in data for each in needles):
            yield path, data


def project_trees_saying(root: Path, needle: bytes | tuple[bytes, ...]) -> Iterator[tuple[Path, ast.Module]]:
    """The parsed ``.py`` files of the project at ``root`` whose bytes hold ``needle``; not those
    that do not parse, nor those of a project of its own inside this one."""
    for path, data in project_files_saying(root, needle):
        if not in_project(path, root):
            continue
        try:
            yield path, quiet.parse(data)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue


_WHY = {
    "loop": "a symbolic link loop: skipped",
    "special": "not a regular file (a FIFO, socket or device): skipped",
}


def _kind(path: Path) -> str:
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "loop"
        if os.path.islink(path):  # a dangling link
            return "missing"
        return "missing" if error.errno in (errno.ENOENT, errno.ENOTDIR) else "file"  # reading will say why
    if stat.S_ISDIR(mode):
        return "directory"
    return "file" if stat.S_ISREG(mode) else "special"


def _walk(
    root: Path, exclude: Sequence[str], files: dict, problems: dict, seen: set[tuple[int, int]], respect_gitignore: bool
) -> None:
    # Links are not followed: a linked directory is not entered, and a linked file is either in
    # the tree, where the walk finds it, or outside it, where it is none of this run's business.
    from migrate import gitignore  # only a directory needs it: a hook's file list never does

    above = gitignore.rules_above(root) if respect_gitignore else None
    real_root = Path(os.path.realpath(root)).as_posix()
    ignore_rules: dict[str, gitignore.Rules] = {}  # by path relative to root: its own .gitignore's included
    for directory, subdirectories, names in os.walk(root):
        here = Path(directory)
        rules = real_here = None
        if above is not None:
            relative = os.path.relpath(directory, root)
            real_here = real_root if relative == "." else f"{real_root}/{Path(relative).as_posix()}"
            inherited = above if relative == "." else ignore_rules[os.path.dirname(relative) or "."]
            rules = ignore_rules[relative] = (*inherited, *gitignore.read_directory(Path(real_here)))
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if name not in DEFAULT_EXCLUDES
            and not (here / name / "pyvenv.cfg").exists()
            and not matches(here / name, exclude)
            and not (rules and gitignore.ignored(rules, f"{real_here}/{name}", True))
        )
        for name in sorted(names):
            path = here / name
            if not name.endswith(SUFFIXES) or matches(path, exclude):
                continue
            if rules and gitignore.ignored(rules, f"{real_here}/{name}", False):
                continue
            kind = _kind(path)
            if kind == "loop":
                problems[path] = _WHY[kind]
            if kind != "file" or path.is_symlink():
                continue  # FIFOs, devices and sockets are no source files
            inode = _inode(path)
            if inode not in seen:  # not named on its own, nor a hard link to a file already taken
                seen.add(inode)
                files[path] = None


def _inode(path: Path) -> tuple[int, int]:
    """Which file ``path`` names, whatever the name (a symbolic or hard link): rewriting it
    through one name changes it under the others."""
    try:
        status = os.stat(path)
    except OSError:
        return (-1, id(path))  # unreadable: reading it will say why, under its own name
    return status.st_dev, status.st_ino


def matches(path: Path, patterns: Sequence[str]) -> bool:
    """Whether a glob matches the path's name, the path, or its real path, whole or as its end
    (``"legacy"``, ``"tests/*"``, ``"*_pb2.py"``)."""
    if not patterns:
        return False
    candidates = {path.name, path.as_posix(), Path(os.path.realpath(path)).as_posix()}
    return any(fnmatch.fnmatch(c, p) or fnmatch.fnmatch(c, f"*/{p}") for p in patterns for c in candidates)


def read(path: Path) -> Source:
    """The bytes of a regular file (OSError for anything else: opening a FIFO does not wait for a writer)."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as stream:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        data = stream.read()
    return Source(data, _identity(status))


def _identity(status: os.stat_result) -> tuple[int, int, int, int]:
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def replace(path: Path, data: bytes, read_as: Source) -> None:
    """Write ``data`` as the file's new content, if the file is still as ``read_as`` found it.

    The new text goes to a temporary file in the same directory, renamed over the file in one
    step, with the file's mode and owner. A file with other hard links is rewritten in place
    instead (a rename would cut it off from them). Raises ChangedSinceRead, leaving the file
    alone, if it changed since it was read.
    """
    target = Path(os.path.realpath(path))  # write through a symlink, not over it
    status = target.stat()
    mode = stat.S_IMODE(status.st_mode)
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(errno.EACCES, "the file is read-only", str(path))
    if status.st_nlink > 1:
        _rewrite_in_place(target, data, read_as)
        return
    import tempfile  # only a write needs it: a check never does

    global _temporary
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    _temporary = temporary
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
        os.chmod(temporary, mode)
        if hasattr(os, "chown") and (status.st_uid, status.st_gid) != (os.getuid(), os.getgid()):
            try:  # keep the owner when run by another user (e.g. root in a container)
                os.chown(temporary, status.st_uid, status.st_gid)
            except PermissionError:
                pass
        _check_unchanged(target, read_as)  # as late as possible: right before the rename
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    finally:
        _temporary = None


_temporary: str | None = None  # the temporary file being written, if any


def exit_now(_signal: int = 0, _frame=None) -> None:
    """A signal handler that ends the process at once, leaving no temporary file behind."""
    if _temporary is not None:
        try:
            os.unlink(_temporary)
        except OSError:
            pass
    os._exit(128 + (_signal or 15))


def _rewrite_in_place(target: Path, data: bytes, read_as: Source) -> None:
    with open(target, "r+b") as stream:
        _check_unchanged(target, read_as)
        stream.write(data)
        stream.truncate()
        stream.flush()
        os.fsync(stream.fileno())


def _check_unchanged(target: Path, read_as: Source) -> None:
    status = target.stat()
    if _identity(status) != read_as.identity or target.read_bytes() != read_as.data:
        raise ChangedSinceRead(errno.EAGAIN, "it changed on disk while ampmigrate ran", str(target))


def first_in_project(filename: str, needles: tuple[bytes, ...], line_of) -> str | None:
    """The first place of the project holding ``filename`` where ``line_of`` (a parsed module ->
    a line or None) finds something, among the files saying one of ``needles``, as ``path:line``
    from the project's root; None where there is none or ``filename`` is not a file on disk."""
    path = Path(filename)
    if path.suffix != ".py" or not path.is_file():
        return None
    return _first_in_project(project_root(path), needles, line_of)


@disk_reads.cached(maxsize=128)
def _first_in_project(root: Path, needles: tuple[bytes, ...], line_of) -> str | None:
    for path, data in project_files_saying(root, needles):
        try:
            line = line_of(quiet.parse(data))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        if line is not None:
            return f"{path.relative_to(root).as_posix()}:{line}"
    return None
