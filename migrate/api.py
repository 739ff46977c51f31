"""Run the rules over sources and trees, and return results: what the CLI, editors and tests call.

``migrate_source`` handles one text; ``migrate_paths`` finds the Python files under paths, skips
those that cannot contain anything the selected rules look for without parsing them, parses the
rest (in worker processes when there are many), and writes fixed files atomically, keeping their
encoding, byte-order mark, line endings and mode. A file that cannot be read, decoded, parsed or
written is reported in its result and left untouched; the other files are still processed.
"""
from __future__ import annotations

import errno
import fnmatch
import io
import os
import stat
import tokenize
from dataclasses import dataclass, field, replace
from itertools import repeat
from pathlib import Path
from typing import Iterable, Sequence

from migrate.types import ERROR_CODE, INTERNAL_ERROR_CODE, Diagnostic, FileResult, Position, triggers_pattern

__all__ = ["DEFAULT_EXCLUDES", "discover", "migrate_paths", "migrate_source", "select_rules"]

# Directory names never searched: version control, caches, build output, installed packages.
DEFAULT_EXCLUDES = (
    ".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "__pycache__", "build", "dist",
    "node_modules", "site-packages", ".mypy_cache", ".pytest_cache", ".eggs",
)
_PARALLEL_MIN_FILES = 8  # below this, starting worker processes costs more than it saves


@dataclass(frozen=True)
class _Options:
    """What changes a file's result. ``fix=False`` only reports (``--check``)."""

    unsafe_fixes: bool = False
    fix: bool = True
    settings: dict = field(default_factory=dict)


def select_rules(select: Sequence[str] = (), ignore: Sequence[str] = (), catalogue: Sequence[type] | None = None):
    """The rules whose code starts with a ``select`` prefix and no ``ignore`` prefix.

    With no ``select``, the rules on by default (``Rule.DEFAULT``); ``ALL`` selects every rule.

    Example::

        >>> [rule.CODE for rule in select_rules(["AMP02"], ignore=["AMP022", "AMP023", "AMP024"])]
        ['AMP020', 'AMP021']

    Raises ValueError naming a prefix that matches no rule, since that is almost always a typo.
    """
    if catalogue is None:
        from migrate.rules import all_rules

        catalogue = all_rules()
    select = [prefix.strip().upper() for prefix in select if prefix.strip()]
    ignore = [prefix.strip().upper() for prefix in ignore if prefix.strip()]
    for prefix in (*select, *ignore):
        if prefix != "ALL" and not any(rule.CODE.startswith(prefix) for rule in catalogue):
            known = ", ".join(rule.CODE for rule in catalogue)
            raise ValueError(f"no rule code starts with {prefix!r}; known codes: {known} (see --list-rules)")
    chosen = [
        rule
        for rule in catalogue
        if ((not select and rule.DEFAULT) or "ALL" in select or any(rule.CODE.startswith(p) for p in select))
        and not any(p == "ALL" or rule.CODE.startswith(p) for p in ignore)
    ]
    return chosen


def migrate_source(
    source: str | bytes,
    filename: str = "<stdin>",
    *,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    unsafe_fixes: bool = False,
    fix: bool = True,
    settings: dict | None = None,
    rules: Sequence[type] | None = None,
) -> FileResult:
    """Run the selected rules over one file's text and return its result; nothing is written.

    Example::

        >>> result = migrate_source("import torch\\nscaler = torch.cuda.amp.GradScaler()\\n", select=["AMP02"])
        >>> result.new_source.splitlines()[1]
        'scaler = torch.amp.GradScaler("cuda")'

    Args:
        source (str or bytes): the file's text; bytes are decoded by their PEP 263 cookie or BOM.
        filename (str, optional, default="<stdin>"): the name diagnostics carry.
        select, ignore (sequence of str, optional): code prefixes, as ``--select``/``--ignore``.
        unsafe_fixes (bool, optional, default=False): also apply fixes that may change behaviour.
        fix (bool, optional, default=True): apply fixes; False only reports.
        rules (sequence of rule classes, optional): run these instead of the catalogue's selection.
    """
    options = _Options(unsafe_fixes=unsafe_fixes, fix=fix, settings=dict(settings or {}))
    data = source if isinstance(source, bytes) else None
    text = source if isinstance(source, str) else None
    return _migrate_one(filename, data, text, _chosen(rules, select, ignore), options, write=False)


def migrate_paths(
    paths: Iterable[str | os.PathLike],
    *,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    unsafe_fixes: bool = False,
    fix: bool = True,
    write: bool = True,
    exclude: Sequence[str] = (),
    jobs: int | None = None,
    settings: dict | None = None,
    rules: Sequence[type] | None = None,
) -> list[FileResult]:
    """Run the selected rules over every Python file under ``paths``; write fixed files if ``write``.

    Example::

        >>> results = migrate_paths(["src/"], write=False)
        >>> [r.filename for r in results if r.changed]
        ['src/train.py']

    Args:
        paths (iterable of paths): files and directories (searched recursively, see ``discover``).
        write (bool, optional, default=True): save fixed files in place, atomically.
        exclude (sequence of str, optional): glob patterns of files and directories to leave out.
        jobs (int, optional, default=number of cores): worker processes for many files.
        Other arguments as for ``migrate_source``.

    Returns one ``FileResult`` per file found, in path order.
    """
    rules = _chosen(rules, select, ignore)
    options = _Options(unsafe_fixes=unsafe_fixes, fix=fix, settings=dict(settings or {}))
    triggers = _triggers(rules)
    results: dict[Path, FileResult] = {}
    todo: list[tuple[Path, bytes]] = []
    for path in discover(paths, exclude):
        try:
            data = path.read_bytes()
        except OSError as error:
            results[path] = _error_result(str(path), f"cannot read: {error.strerror or error}")
            continue
        if not _may_apply(data, triggers):
            results[path] = FileResult(str(path))
        else:
            todo.append((path, data))
            results[path] = None  # keeps discovery order

    if todo and rules is None:
        rules = tuple(select_rules())
    workers = min(jobs or _cores(), len(todo))
    if workers > 1 and len(todo) >= _PARALLEL_MIN_FILES:
        from concurrent.futures import ProcessPoolExecutor  # imported here: single-file runs start faster

        with ProcessPoolExecutor(max_workers=workers, mp_context=_fork_context()) as pool:
            done = pool.map(
                _migrate_path, [p for p, _ in todo], repeat(rules), repeat(options), repeat(write),
                chunksize=max(1, len(todo) // (workers * 4)),
            )
            results.update(zip((p for p, _ in todo), done))
    else:
        for path, data in todo:
            results[path] = _migrate_one(str(path), data, None, rules, options, write)
    return list(results.values())


def discover(paths: Iterable[str | os.PathLike], exclude: Sequence[str] = ()) -> list[Path]:
    """The ``.py`` files under ``paths``, sorted, without duplicates.

    Directories are searched recursively, skipping ``DEFAULT_EXCLUDES``, virtual environments
    (any directory holding ``pyvenv.cfg``) and anything matching an ``exclude`` glob, tried
    against the name and the path (``"legacy"``, ``"tests/fixtures/*"``, ``"*_pb2.py"``).
    Files named explicitly are kept whatever their suffix, unless an ``exclude`` glob matches them.
    Raises FileNotFoundError for a path that does not exist.
    """
    found: dict[Path, None] = {}
    for given in paths:
        root = Path(given)
        if root.is_file():
            if not _excluded(root, exclude):
                found[root] = None
            continue
        if not root.is_dir():
            raise FileNotFoundError(errno.ENOENT, f"no such file or directory: {str(root)!r}", str(root))
        for directory, subdirectories, files in os.walk(root):
            here = Path(directory)
            subdirectories[:] = sorted(
                name
                for name in subdirectories
                if name not in DEFAULT_EXCLUDES
                and not (here / name / "pyvenv.cfg").exists()
                and not _excluded(here / name, exclude)
            )
            for name in sorted(files):
                if name.endswith(".py") and not _excluded(here / name, exclude):
                    found[here / name] = None
    return sorted(found)


def _excluded(path: Path, patterns: Sequence[str]) -> bool:
    if not patterns:
        return False
    candidates = {path.name, path.as_posix(), path.resolve().as_posix()}
    return any(fnmatch.fnmatch(c, p) or fnmatch.fnmatch(c, f"*/{p}") for p in patterns for c in candidates)


def _chosen(rules: Sequence[type] | None, select: Sequence[str], ignore: Sequence[str]) -> tuple | None:
    """The rules to run; None for the whole catalogue, which is imported only once a file needs it."""
    if rules is not None:
        return tuple(rules)
    if select or ignore:
        return tuple(select_rules(select, ignore))
    return None


def _triggers(rules: Sequence[type] | None) -> tuple[str, ...] | None:
    """The words one of which a file must contain to be parsed; None when a rule needs every file."""
    if rules is None:
        from migrate.rules import TRIGGER_WORDS

        return TRIGGER_WORDS
    if any(not rule.TRIGGERS for rule in rules):
        return None
    return tuple(sorted({word for rule in rules for word in rule.TRIGGERS}))


def _may_apply(content: bytes | str, triggers: tuple[str, ...] | None) -> bool:
    """The cheap check before parsing: one regex search (on bytes: the words are ASCII, as in any PEP 263 encoding)."""
    if triggers is None:
        return True
    return triggers_pattern(triggers, isinstance(content, bytes)).search(content) is not None


def _migrate_path(path: Path, rules: tuple | None, options: _Options, write: bool) -> FileResult:
    """One file in a worker process (re-read there: cheaper than sending its bytes over)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        return _error_result(str(path), f"cannot read: {error.strerror or error}")
    return _migrate_one(str(path), data, None, rules, options, write)


def _migrate_one(
    filename: str, data: bytes | None, text: str | None, rules: tuple | None, options: _Options, write: bool
) -> FileResult:
    encoding = "utf-8"
    if data is not None:
        try:
            encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
            text = data.decode(encoding)
        except (SyntaxError, LookupError, UnicodeDecodeError) as error:
            return _error_result(filename, f"cannot decode as {encoding!r}: {error}; save it as UTF-8 or declare its encoding (PEP 263)")
    if not _may_apply(text, _triggers(rules)):
        return FileResult(filename, source=text, new_source=text, encoding=encoding)
    if rules is None:
        rules = tuple(select_rules())

    from migrate.engine import run_rules  # libcst is imported only once a file needs parsing

    try:
        outcome = run_rules(
            text, filename, rules, fix=options.fix, unsafe_fixes=options.unsafe_fixes, settings=options.settings
        )
    except Exception as error:  # one file must never end the run over the others
        return _error_result(filename, f"internal error: {type(error).__name__}: {error}", INTERNAL_ERROR_CODE)
    result = FileResult(filename, outcome.diagnostics, text, outcome.source, outcome.error, encoding, outcome.remaining)
    if write and result.changed:
        try:
            _write_atomic(Path(filename), result.new_source.encode(encoding))
        except UnicodeEncodeError as error:
            return _unwritten(result, f"the fixed text cannot be encoded as {encoding!r}: {error}")
        except OSError as error:
            return _unwritten(result, f"cannot write: {error.strerror or error}; check the file's permissions")
    return result


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace the file in one step (temp file in the same directory, then rename), keeping its mode."""
    import tempfile

    target = Path(os.path.realpath(path))  # write through a symlink, not over it
    status = target.stat()
    mode = stat.S_IMODE(status.st_mode)
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(errno.EACCES, "the file is read-only", str(path))
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
        os.chmod(temporary, mode)
        if hasattr(os, "chown") and (status.st_uid, status.st_gid) != (os.getuid(), os.getgid()):
            try:  # keep the owner when run by another user (e.g. root in a container)
                os.chown(temporary, status.st_uid, status.st_gid)
            except PermissionError:
                pass
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def _unwritten(result: FileResult, message: str) -> FileResult:
    """The result of a file whose fixes could not be saved: it is as it was."""
    error = _error_result(result.filename, message)
    diagnostics = (*error.diagnostics, *(replace(d, applied=False) for d in result.diagnostics))
    return FileResult(result.filename, diagnostics, result.source, result.source, message, result.encoding, diagnostics)


def _error_result(filename: str, message: str, code: str = ERROR_CODE) -> FileResult:
    start = Position(1, 1)
    error = (Diagnostic(code, message, filename, start, start),)
    return FileResult(filename, error, error=message, remaining=error)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _fork_context():
    """Fork where it exists: workers inherit the imported rules instead of importing them again."""
    import multiprocessing

    return multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
