"""Run the rules over sources and trees, and return results: what the CLI, editors and tests call.

``migrate_source`` handles one text; ``migrate_paths`` finds the Python files and notebooks under paths
(``migrate.files``), skips those that cannot contain anything the selected rules look for without
parsing them (``migrate.prefilter``), parses the rest (both in worker processes when there are many),
and writes fixed files atomically, keeping their encoding, byte-order mark, line endings, mode,
owner and hard links, unless they changed since they were read. A file that cannot be read,
decoded, parsed or written is reported in its result and left untouched; the other files are
still processed. Ctrl-C stops a run cleanly (``Interrupted``). Files holding one half of apex amp
each (``amp.initialize`` in one, ``amp.scale_loss`` in the other) are paired first
(``migrate.halves``), so that each is migrated knowing the other.
"""
from __future__ import annotations

import contextlib
import gc
import io
import os
import tokenize
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from migrate import files, run_in_workers
from migrate.files import DEFAULT_EXCLUDES
from migrate.prefilter import may_apply, needs_parsing, trigger_words
from migrate.types import ERROR_CODE, INTERNAL_ERROR_CODE, Diagnostic, FileResult, Position

__all__ = ["DEFAULT_EXCLUDES", "Interrupted", "discover", "migrate_paths", "migrate_source", "select_rules"]

_PARALLEL_MIN_FILES = 8  # below this, starting worker processes costs more than it saves


@dataclass(frozen=True)
class _Options:
    """What changes a file's result. ``fix=False`` only reports (``--check``)."""

    unsafe_fixes: bool = False
    fix: bool = True
    settings: dict = field(default_factory=dict)
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (glob, code prefixes)
    edits: bool = False  # give each fix its text edits (JSON, SARIF)
    partners: Mapping[str, object] = field(default_factory=dict)  # path -> the other half of its apex amp


def select_rules(
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    catalogue: Sequence[type] | None = None,
    *,
    extend_select: Sequence[str] = (),
):
    """The rules a ``select`` (or, without one, the rules on by default) and ``extend_select`` pick,
    less those under an ``ignore`` prefix.

    A prefix picks the rules under it that are on by default. A rule that is off by default
    (``Rule.DEFAULT = False``: the deprecated-spelling rules AMP020-AMP025) is picked only by its
    code, by a prefix under which every rule is off by default (``AMP02``), or by ``ALL``: so
    ``AMP0`` means the apex rewrites, not those too.

    Example::

        >>> [rule.CODE for rule in select_rules(["AMP02"], ignore=["AMP022", "AMP023", "AMP024"])]
        ['AMP020', 'AMP021', 'AMP025']

    Raises ValueError naming a prefix that matches no rule, since that is almost always a typo.
    """
    if catalogue is None:
        from migrate.rules import all_rules

        catalogue = all_rules()
    select, ignore, extend_select = (
        [prefix.strip().upper() for prefix in prefixes if prefix.strip()]
        for prefixes in (select, ignore, extend_select)
    )
    for prefix in (*select, *extend_select, *ignore):
        if prefix != "ALL" and not any(rule.CODE.startswith(prefix) for rule in catalogue):
            known = ", ".join(rule.CODE for rule in catalogue)
            raise ValueError(f"no rule code starts with {prefix!r}; known codes: {known} (see --list-rules)")

    def picks(prefixes: list[str], rule: type) -> bool:
        return any(
            prefix == "ALL"
            or (rule.CODE.startswith(prefix) and (rule.DEFAULT or _only_off_by_default(prefix, catalogue)))
            for prefix in prefixes
        )

    return [
        rule
        for rule in catalogue
        if (picks(select, rule) if select else rule.DEFAULT) or picks(extend_select, rule)
        if not any(prefix == "ALL" or rule.CODE.startswith(prefix) for prefix in ignore)
    ]


def _only_off_by_default(prefix: str, catalogue: Sequence[type]) -> bool:
    return not any(rule.DEFAULT for rule in catalogue if rule.CODE.startswith(prefix))


def migrate_source(
    source: str | bytes,
    filename: str = "<stdin>",
    *,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    unsafe_fixes: bool = False,
    fix: bool = True,
    settings: dict | None = None,
    per_file_ignores: Mapping[str, Sequence[str]] | None = None,
    rules: Sequence[type] | None = None,
    edits: bool = False,
) -> FileResult:
    """Run the selected rules over one file's text and return its result; nothing is written.

    Example::

        >>> result = migrate_source("import torch\\nscaler = torch.cuda.amp.GradScaler()\\n", select=["AMP02"])
        >>> result.new_source.splitlines()[1]
        'scaler = torch.amp.GradScaler("cuda")'

    Args:
        source (str or bytes): the file's text; bytes are decoded by their PEP 263 cookie or BOM.
        filename (str, optional, default="<stdin>"): the name diagnostics carry; one ending in
            ``.ipynb`` says the source is a notebook's JSON (``migrate.notebook``).
        select, ignore (sequence of str, optional): code prefixes, as ``--select``/``--ignore``.
        unsafe_fixes (bool, optional, default=False): also apply fixes that may change behaviour.
        fix (bool, optional, default=True): apply fixes; False only reports.
        per_file_ignores (mapping of glob to code prefixes, optional): rules not run on the files a
            glob matches (as ``exclude`` matches them); a glob starting with ``!`` applies to the
            files it does not match.
        rules (sequence of rule classes, optional): run these instead of the catalogue's selection.
        edits (bool, optional, default=False): give each fix its text edits (``Fix.edits``), as
            Ruff's JSON has them; it costs a rewrite per fix.
    """
    options = _options(unsafe_fixes, fix, settings, per_file_ignores, edits)
    data = source if isinstance(source, bytes) else None
    text = source if isinstance(source, str) else None
    return _migrate_one(filename, data, text, _chosen(rules, select, ignore), options)


def migrate_paths(
    paths: Iterable[str | os.PathLike],
    *,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    unsafe_fixes: bool = False,
    fix: bool = True,
    write: bool = True,
    exclude: Sequence[str] = (),
    respect_gitignore: bool = True,
    jobs: int | None = None,
    settings: dict | None = None,
    per_file_ignores: Mapping[str, Sequence[str]] | None = None,
    rules: Sequence[type] | None = None,
    edits: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> list[FileResult]:
    """Run the selected rules over every Python file and notebook under ``paths``; write fixed files if ``write``.

    Example::

        >>> results = migrate_paths(["src/"], write=False)
        >>> [r.filename for r in results if r.changed]
        ['src/train.py']

    Args:
        paths (iterable of paths): files and directories (searched recursively, see ``discover``).
        write (bool, optional, default=True): save fixed files in place, atomically; a file that
            changed on disk since it was read is left alone and reported.
        exclude (sequence of str, optional): glob patterns of files and directories to leave out.
        respect_gitignore (bool, optional, default=True): leave out, in a directory search, what
            the ignore files of its git work tree ignore (``migrate.gitignore``).
        jobs (int, optional, default=number of cores): worker processes for many files (at most
            the number of cores).
        progress (callable, optional): called as ``progress(done, total)`` each time a file is done.
        Other arguments as for ``migrate_source``.

    Returns one ``FileResult`` per file found, in path order. Raises ``Interrupted`` on Ctrl-C
    (SIGINT), once the files being worked on are done: it carries their results; a second
    Ctrl-C stops at once (KeyboardInterrupt), every file whole, as it was or as rewritten.
    """
    rules = _chosen(rules, select, ignore)
    options = _options(unsafe_fixes, fix, settings, per_file_ignores, edits)
    found = files.find(paths, exclude, respect_gitignore)
    results: dict[Path, FileResult | None] = _Results.fromkeys(sorted([*found.files, *found.problems]))  # path order
    results.progress = progress
    for path, why in found.problems.items():
        results[path] = _error_result(str(path), why)
    workers = min(jobs or run_in_workers.cores(), run_in_workers.cores(), len(found.files))
    with run_in_workers.StopOnInterrupt() as stop:
        if workers > 1 and len(found.files) >= _PARALLEL_MIN_FILES:
            _run_in_workers(workers, found.files, results, stop, rules, options, write)
        else:
            _run_here(found.files, results, stop, rules, options, write)
        if stop.requested:
            raise Interrupted([r for r in results.values() if r is not None], len(results))
    return list(results.values())


def _run_here(paths: list[Path], results: dict, stop, rules: tuple | None, options: _Options, write: bool) -> None:
    """Every file in this process: few of them, or one worker asked for."""
    words = trigger_words(rules)
    todo: dict[Path, files.Source] = {}
    apex_texts: dict[Path, str] = {}
    for path in paths:
        _take(path, _triage(path, words), results, todo, apex_texts)
    if todo and rules is None:
        rules = tuple(select_rules())
    options = _with_partners(options, apex_texts)
    for path, source in todo.items():
        if stop.requested:
            break
        results[path] = _migrate_file(path, source, rules, options, write)


def _run_in_workers(workers: int, paths: list[Path], results: dict, stop, rules: tuple | None, options: _Options, write: bool) -> None:
    """Every file in worker processes: first each is triaged (read and prefiltered) there, sixteen
    a job, while this process imports the rules once a file needs them; then, in new workers
    that inherit the rules, the files worth parsing are worked on, the largest first (a long file
    started last would keep one worker busy while the others wait). The halves of apex amp are
    paired here while the workers start on the first files, none of which says apex."""
    words = trigger_words(rules)
    sizes: dict[Path, int] = {}
    apex_texts: dict[Path, str] = {}

    def triaged(_key, verdicts: list) -> None:
        nonlocal rules
        for path, verdict in verdicts:
            _take(path, verdict, results, sizes, apex_texts)
        if sizes and rules is None:
            rules = tuple(select_rules())

    chunks = [paths[start:start + _TRIAGE_CHUNK] for start in range(0, len(paths), _TRIAGE_CHUNK)]
    with run_in_workers.WorkerPool(workers, stop) as pool:
        pool.run(((None, _triage_in_worker, (chunk, words)) for chunk in chunks), triaged)
    if stop.requested or not sizes:
        return
    largest_first = sorted(sizes, key=sizes.get, reverse=True)
    first = [path for path in largest_first if path not in apex_texts][: 2 * workers]
    started = set(first)

    def jobs():
        for path in first:
            yield path, _migrate_path, (path, rules, options, write)
        paired = _with_partners(options, apex_texts)  # while the workers work on the first files
        for path in largest_first:
            if path not in started:
                yield path, _migrate_path, (path, rules, paired, write)

    with run_in_workers.WorkerPool(min(workers, len(sizes)), stop) as pool:
        pool.run(jobs(), results.__setitem__)


_TRIAGE_CHUNK = 16  # files a triage job reads: enough to outweigh handing it out, few enough to share evenly


def _with_partners(options: _Options, apex_texts: dict[Path, str]) -> _Options:
    """``options`` with the other half of each file holding one half of apex amp."""
    if not apex_texts:
        return options
    from migrate import halves

    partners = halves.partners(apex_texts, options.settings)
    if not partners:
        return options
    return replace(options, partners={str(path): partner for path, partner in partners.items()})


def _triage(path: Path, words: tuple[str, ...] | None) -> FileResult | tuple[files.Source, str | None]:
    """A file's final result when it cannot be read or decoded, or is not worth parsing; else its
    bytes as read, and its text when it may hold a half of apex amp (``migrate.halves``)."""
    try:
        source = files.read(path)
    except OSError as error:
        return _error_result(str(path), f"cannot read: {error.strerror or error}")
    decoded = _decode(str(path), source.data)
    if isinstance(decoded, FileResult):
        return decoded
    text = decoded[0]
    if path.suffix == files.NOTEBOOK_SUFFIX:  # its JSON escapes line ends: "\nscaler" would hide "scaler"
        from migrate import notebook

        return (source, None) if may_apply(notebook.searchable(text), words) else FileResult(str(path))
    if not needs_parsing(text, words):  # the whole check here, so that a run of such files never imports a rule
        return FileResult(str(path))
    return source, text if "apex" in text else None


def _take(path: Path, verdict, results: dict, todo: dict, apex_texts: dict[Path, str]) -> None:
    """A ``_triage`` verdict put where it goes: a final result, or ``todo[path]`` (the file's bytes, or
    its size) and its text when it may hold a half of apex amp."""
    if isinstance(verdict, FileResult):
        results[path] = verdict
        return
    todo[path], apex_text = verdict
    if apex_text is not None:
        apex_texts[path] = apex_text


def _triage_in_worker(paths: list[Path], words: tuple[str, ...] | None) -> list[tuple[Path, object]]:
    """``_triage`` of each path, in a worker: a file worth parsing comes back as its size, not its
    bytes (it is read again where it is worked on)."""
    verdicts = []
    for path in paths:
        verdict = _triage(path, words)
        if not isinstance(verdict, FileResult):
            source, apex_text = verdict
            verdict = len(source.data), apex_text
        verdicts.append((path, verdict))
    return verdicts


class _Results(dict):
    """Each file's result, by path; ``progress(done, total)`` hears of each result set."""

    progress: Callable[[int, int], None] | None = None
    done = 0

    def __setitem__(self, path: Path, result: FileResult | None) -> None:
        super().__setitem__(path, result)
        if self.progress is not None and result is not None:
            self.done += 1
            self.progress(self.done, len(self))


def discover(
    paths: Iterable[str | os.PathLike], exclude: Sequence[str] = (), respect_gitignore: bool = True
) -> list[Path]:
    """The Python files and notebooks (``.py``, ``.ipynb``) under ``paths``, sorted, without duplicates.

    Directories are searched recursively, skipping ``DEFAULT_EXCLUDES``, virtual environments
    (any directory holding ``pyvenv.cfg``) and anything matching an ``exclude`` glob, tried
    against the name and the path (``"legacy"``, ``"tests/fixtures/*"``, ``"*_pb2.py"``), and,
    with ``respect_gitignore``, what the ignore files of the git work tree ignore.
    Only regular files are taken, and a directory search follows no links (a file linked from
    inside the tree is taken under its own name). Files named explicitly are kept whatever their
    suffix, unless an ``exclude`` glob matches them (a ``.gitignore`` does not leave them out,
    as in Ruff). Raises FileNotFoundError for a path that does
    not exist.
    """
    return files.find(paths, exclude, respect_gitignore).files


class Interrupted(Exception):
    """The run was stopped by Ctrl-C. ``results``: the files done before it stopped, of ``total`` found."""

    def __init__(self, results: list[FileResult], total: int) -> None:
        super().__init__(f"interrupted after {len(results)} of {total} files")
        self.results = results
        self.total = total


def _options(
    unsafe_fixes: bool, fix: bool, settings: dict | None, per_file_ignores: Mapping | None, edits: bool = False
) -> _Options:
    ignores = tuple((glob, tuple(codes)) for glob, codes in (per_file_ignores or {}).items())
    if ignores:
        select_rules(ignore=[code for _, codes in ignores for code in codes])  # a code no rule has is an error now
    return _Options(
        unsafe_fixes=unsafe_fixes, fix=fix, settings=dict(settings or {}), per_file_ignores=ignores, edits=edits
    )


def _ignored_here(filename: str, options: _Options) -> tuple[str, ...]:
    """The code prefixes ``per_file_ignores`` leave out for this file."""
    path = Path(filename)
    return tuple(
        code.strip().upper()
        for glob, codes in options.per_file_ignores
        if (not files.matches(path, [glob[1:]]) if glob.startswith("!") else files.matches(path, [glob]))
        for code in codes
    )


def _chosen(rules: Sequence[type] | None, select: Sequence[str], ignore: Sequence[str]) -> tuple | None:
    """The rules to run; None for the whole catalogue, which is imported only once a file needs it."""
    if rules is not None:
        return tuple(rules)
    if select or ignore:
        return tuple(select_rules(select, ignore))
    return None


def _migrate_path(path: Path, rules: tuple | None, options: _Options, write: bool) -> FileResult:
    """One file in a worker process (re-read there: cheaper than sending its bytes over)."""
    try:
        source = files.read(path)
    except OSError as error:
        return _error_result(str(path), f"cannot read: {error.strerror or error}")
    return _migrate_file(path, source, rules, options, write)


def _migrate_file(path: Path, source: files.Source, rules: tuple | None, options: _Options, write: bool) -> FileResult:
    partner = options.partners.get(str(path))
    if partner is not None:
        from migrate.halves import PARTNER

        options = replace(options, settings={**options.settings, PARTNER: partner})
    result = _migrate_one(str(path), source.data, None, rules, options)
    if not (write and result.changed):
        return result
    try:
        files.replace(path, result.new_source.encode(result.encoding), source)
    except UnicodeEncodeError as error:
        return _unwritten(result, f"the fixed text cannot be encoded as {result.encoding!r}: {error}")
    except files.ChangedSinceRead:
        return _unwritten(result, "it changed on disk while ampmigrate ran; left as it is: run again to migrate it")
    except OSError as error:
        return _unwritten(result, f"cannot write: {error.strerror or error}; check the file's permissions")
    return result


def _decode(filename: str, data: bytes) -> tuple[str, str] | FileResult:
    """The text and its encoding (PEP 263 cookie or BOM), or the error result of a file that cannot be decoded."""
    encoding = "utf-8"
    try:
        encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
        return data.decode(encoding), encoding
    except (SyntaxError, LookupError, UnicodeDecodeError) as error:
        hint = "; it looks like UTF-16 or UTF-32" if data.startswith(_WIDE_BOMS) or b"\0" in data[:4096] else ""
        return _error_result(
            filename, f"cannot decode as {encoding!r}: {error}{hint}; save it as UTF-8 or declare its encoding (PEP 263)"
        )


_WIDE_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _migrate_one(filename: str, data: bytes | None, text: str | None, rules: tuple | None, options: _Options) -> FileResult:
    encoding = "utf-8"
    if data is not None:
        decoded = _decode(filename, data)
        if isinstance(decoded, FileResult):
            return decoded
        text, encoding = decoded
    if filename.endswith(files.NOTEBOOK_SUFFIX):
        return _migrate_notebook(filename, text, encoding, rules, options)
    return _migrate_python(filename, text, encoding, rules, options)


def _migrate_notebook(filename: str, text: str, encoding: str, rules: tuple | None, options: _Options) -> FileResult:
    """A notebook's code cells, run as one Python text; findings are placed in their cells."""
    from migrate import notebook

    try:
        book = notebook.Notebook(text)
    except notebook.NotebookError as error:
        return _error_result(filename, f"{error}; left as it is")
    if book.python is None:  # another language's notebook
        return FileResult(filename, source=text, new_source=text, encoding=encoding)
    inner = _migrate_python(filename, book.python, "utf-8", rules, options)

    def in_cells(diagnostics: tuple[Diagnostic, ...], python: str) -> tuple[Diagnostic, ...]:
        # a fix's edits address the cells joined as one text, not the notebook's JSON: they are left out
        return tuple(
            replace(d, location=book.locate(python, d.location), end_location=book.locate(python, d.end_location),
                    fix=d.fix and replace(d.fix, edits=()))
            for d in diagnostics
        )

    diagnostics = in_cells(inner.diagnostics, book.python)
    source = None if inner.source is None else text
    if inner.error or not inner.changed:
        remaining = in_cells(inner.remaining, book.python)
        return FileResult(filename, diagnostics, source, source, inner.error, encoding, remaining)
    try:
        fixed = book.rebuild(inner.new_source)
    except notebook.NotebookError as error:
        return _unwritten(FileResult(filename, diagnostics, text, text, None, encoding), str(error))
    return FileResult(filename, diagnostics, text, fixed, None, encoding, in_cells(inner.remaining, inner.new_source))


def _migrate_python(filename: str, text: str, encoding: str, rules: tuple | None, options: _Options) -> FileResult:
    if not needs_parsing(text, trigger_words(rules)):
        return FileResult(filename, source=text, new_source=text, encoding=encoding)
    if rules is None:
        rules = tuple(select_rules())
    ignored = _ignored_here(filename, options) if options.per_file_ignores else ()
    if ignored:
        rules = () if "ALL" in ignored else tuple(rule for rule in rules if not rule.CODE.startswith(ignored))

    from migrate.engine import run_rules  # libcst is imported only once a file needs parsing

    # libcst drops the last newline of a file whose lines end in a lone CR: such a file is
    # worked on with LF, then given its CRs back (a CR in its text can only be a line end).
    cr_only = "\r" in text and "\n" not in text
    try:
        with _without_cycle_collection():
            outcome = run_rules(
                text.replace("\r", "\n") if cr_only else text, filename, rules,
                fix=options.fix, unsafe_fixes=options.unsafe_fixes, settings=options.settings, edits=options.edits,
            )
    except Exception as error:  # one file must never end the run over the others
        return _error_result(filename, f"internal error: {type(error).__name__}: {error}", INTERNAL_ERROR_CODE)
    new_text = outcome.source.replace("\n", "\r") if cr_only else outcome.source
    return FileResult(filename, outcome.diagnostics, text, new_text, outcome.error, encoding, outcome.remaining)


def _unwritten(result: FileResult, message: str) -> FileResult:
    """The result of a file whose fixes could not be saved: it is as it was."""
    error = _error_result(result.filename, message)
    diagnostics = (*error.diagnostics, *(replace(d, applied=False) for d in result.diagnostics))
    return FileResult(result.filename, diagnostics, result.source, result.source, message, result.encoding, diagnostics)


def _error_result(filename: str, message: str, code: str = ERROR_CODE) -> FileResult:
    start = Position(1, 1)
    error = (Diagnostic(code, message, filename, start, start),)
    return FileResult(filename, error, error=message, remaining=error)


@contextlib.contextmanager
def _without_cycle_collection():
    """A parsed file is a tree of objects that all live until its run ends. The cycle collector
    would scan them again and again as they are made, ever more of them: a fifth of a large file's
    time, growing faster than the file. What the run leaves is collected once it is over."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
