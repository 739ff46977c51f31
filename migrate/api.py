"""Run the rules over sources and trees, and return results: what the CLI, editors and tests call.

``migrate_source`` handles one text; ``migrate_paths`` finds the Python files and notebooks under paths
(``migrate.files``), skips those that cannot contain anything the selected rules look for without
parsing them (``migrate.prefilter``), parses the rest (both in worker processes when there are many),
and, once every file is planned, writes the fixed ones atomically, keeping their encoding, byte-order
mark, line endings, mode, owner and hard links, unless they changed since they were read (a plan
reads other files of the project: it reads them as the run found them). A file that cannot be read,
decoded, parsed or written is reported in its result and left untouched; the other files are
still processed. Ctrl-C stops a run cleanly (``Interrupted``). Files holding one half of apex amp
each (``amp.initialize`` in one, ``amp.scale_loss`` in the other) are paired first
(``migrate.halves``, ``migrate.half_partners``), so that each is migrated knowing the other. Each file's own run is
``migrate.file_run``'s.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from migrate import disk_reads, files, run_in_workers
from migrate.file_run import (Options, error_result, file_settings, migrate_file, migrate_one, migrate_path, triage,
                              triage_in_worker, write_result)
from migrate.files import DEFAULT_EXCLUDES
from migrate.prefilter import reads_amp_api, sets_apex_flag, step_words, trigger_words
from migrate.rules import select_rules
from migrate.types import FileResult

__all__ = ["DEFAULT_EXCLUDES", "Interrupted", "discover", "migrate_paths", "migrate_source", "select_rules"]

_PARALLEL_MIN_FILES = 8  # below this, starting worker processes costs more than it saves


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
    disk_reads.forget()  # a file on disk may have been read by an earlier run, and changed since
    data = source if isinstance(source, bytes) else None
    text = source if isinstance(source, str) else None
    return migrate_one(filename, data, text, _chosen(rules, select, ignore), options)


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
    (SIGINT), once the files being worked on are done and those planned are written: it carries
    their results; a second Ctrl-C stops at once (KeyboardInterrupt), every file whole, as it was
    or as rewritten.
    """
    rules = _chosen(rules, select, ignore)
    options = _options(unsafe_fixes, fix, settings, per_file_ignores, edits)
    disk_reads.forget()  # the project's files are read as they are now, not as an earlier run found them
    found = files.find(paths, exclude, respect_gitignore)
    results: dict[Path, FileResult | None] = _Results.fromkeys(sorted([*found.files, *found.problems]))  # path order
    results.progress = progress
    for path, why in found.problems.items():
        results[path] = error_result(str(path), why)
    workers = min(jobs or run_in_workers.cores(), run_in_workers.cores(), len(found.files))
    # every file is planned before any is written: a plan reads other files of the project, which
    # must be as the run found them, whichever worker finished first (what --diff shows is written)
    to_write: dict[Path, files.Source] = {}
    with run_in_workers.StopOnInterrupt() as stop:
        if workers > 1 and len(found.files) >= _PARALLEL_MIN_FILES:
            _run_in_workers(workers, found.files, results, stop, rules, options, write, to_write)
        else:
            _run_here(found.files, results, stop, rules, options, write, to_write)
        for path in sorted(to_write):  # the files planned before a Ctrl-C, too: each is whole
            results.settle(path, write_result(path, results[path], to_write[path]))
        if stop.requested:
            raise Interrupted([r for r in results.values() if r is not None], len(results))
    return list(results.values())


def _run_here(paths: list[Path], results: dict, stop, rules: tuple | None, options: Options, write: bool,
              to_write: dict[Path, files.Source]) -> None:
    """Every file planned in this process (few of them, or one worker asked for); each changed one
    to save goes in ``to_write`` with its bytes as read."""
    words, stepping = trigger_words(rules), step_words(rules)
    todo: dict[Path, files.Source] = {}
    apex_texts: dict[Path, str] = {}
    for path in paths:
        _take(path, triage(path, words, stepping), results, todo, apex_texts)
    if todo and rules is None:
        rules = tuple(select_rules())
    options = _with_partners(options, apex_texts)
    for path, source in todo.items():
        if stop.requested:
            break
        results[path] = migrate_file(path, source, rules, options)
        if write and results[path].changed:
            to_write[path] = source


def _run_in_workers(workers: int, paths: list[Path], results: dict, stop, rules: tuple | None, options: Options,
                    write: bool, to_write: dict[Path, files.Source]) -> None:
    """Every file planned in worker processes: first each is triaged (read and prefiltered) there, sixteen
    a job, while this process imports the rules once a file needs them; then, in new workers
    that inherit the rules, the files worth parsing are worked on, the largest first (a long file
    started last would keep one worker busy while the others wait). The halves of apex amp are
    paired here while the workers start on the first files, none of which says apex. Each
    changed file to save comes back with its bytes as read, into ``to_write``."""
    words, stepping = trigger_words(rules), step_words(rules)
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
        pool.run(((None, triage_in_worker, (chunk, words, stepping)) for chunk in chunks), triaged)
    if stop.requested or not sizes:
        return
    largest_first = sorted(sizes, key=sizes.get, reverse=True)
    first = [path for path in largest_first if path not in apex_texts][: 2 * workers]
    started = set(first)

    def jobs():
        for path in first:
            yield path, migrate_path, (path, rules, options, write)
        paired = _with_partners(options, apex_texts)  # while the workers work on the first files
        for path in largest_first:
            if path not in started:
                yield path, migrate_path, (path, rules, paired, write)

    def planned(path: Path, outcome: tuple[FileResult, files.Source | None]) -> None:
        results[path], source = outcome
        if source is not None:
            to_write[path] = source

    with run_in_workers.WorkerPool(min(workers, len(sizes)), stop) as pool:
        pool.run(jobs(), planned)


_TRIAGE_CHUNK = 16  # files a triage job reads: enough to outweigh handing it out, few enough to share evenly


def _with_partners(options: Options, apex_texts: dict[Path, str]) -> Options:
    """``options`` with the other half of each file holding one half of apex amp, the names
    other files import from each file that imports apex (``migrate.importers``), the apex
    cast registrations of other files of its project (``migrate.cast_registrations``) and their
    reads of apex's internal state (``migrate.apex_state_reads``), and where
    its project loads an optimizer's state (``migrate.optimizer_resumes``), the functions it imports
    that return a gradient norm (``migrate.grad_norms``) or cast modules to float16
    (``migrate.half_helpers``), the methods of its classes that subclasses elsewhere override
    (``migrate.subclass_overrides``) and which of their methods running a model feed its training from a
    loop (``migrate.loop_feeds``), what the bases it imports keep of their ``__init__``'s
    parameters (``migrate.base_bindings``), and what other files
    hand its training functions (``migrate.forward_callers``), and for one using apex's cast decorators,
    where its project keeps apex's ``amp.initialize`` (``migrate.apex_kept``), as for a scale half
    one that may keep master weights, for one initializing (and its other half) where apex's cast
    decorators stay on apex, and for one initializing
    apex amp, which files it is linked to keep scaling losses with apex (``migrate.scale_kept``); for
    one reading apex amp's API through a name, the modules of its project handing it out
    (``migrate.amp_reexports``). ``apex_texts``: the texts ``triage`` kept."""
    # by path: the triage hands them back in the order its workers finish
    apex_texts = dict(sorted(apex_texts.items()))
    reading_amp = {path: text for path, text in apex_texts.items() if reads_amp_api(text)}
    apex_texts = {path: text for path, text in apex_texts.items() if "apex" in text or sets_apex_flag(text)}
    if reading_amp:
        from migrate import amp_reexports

        options = replace(options, amp_reexported={str(path): names for path, names in amp_reexports.reexported(reading_amp).items()})
    if not apex_texts:
        return options
    from migrate import (apex_kept, apex_state_reads, base_bindings, cast_registrations, forward_callers, forwardless_models,
                         grad_norms, half_helpers, half_partners, importers, level_settings, loop_feeds, optimizer_resumes,
                         scale_kept, state_helpers, subclass_overrides)

    options = replace(
        options,
        imported_elsewhere={str(path): names for path, names in importers.imported_elsewhere(apex_texts).items()},
        functions_imported_elsewhere={str(path): names
                                      for path, names in importers.functions_imported_elsewhere(apex_texts).items()},
        casts_elsewhere={str(path): places for path, places in cast_registrations.elsewhere(apex_texts).items()},
        state_read_elsewhere={str(path): places for path, places in apex_state_reads.elsewhere(apex_texts).items()},
        optimizer_state_loads={str(path): places for path, places in optimizer_resumes.loads(apex_texts).items()},
        handed_elsewhere={str(path): calls for path, calls in forward_callers.handed_elsewhere(apex_texts).items()},
        initialized_elsewhere={str(path): places for path, places in scale_kept.initialized_elsewhere(apex_texts).items()},
        levels_elsewhere={str(path): names for path, names in level_settings.set_elsewhere(apex_texts).items()},
        gradient_norms={str(path): names for path, names in grad_norms.elsewhere(apex_texts).items()},
        half_helpers={str(path): names for path, names in half_helpers.elsewhere(apex_texts).items()},
        subclass_overrides={str(path): methods for path, methods in subclass_overrides.elsewhere(apex_texts).items()},
        base_bindings={str(path): kept for path, kept in base_bindings.elsewhere(apex_texts).items()},
        forwardless_models={str(path): lines for path, lines in forwardless_models.elsewhere(apex_texts).items()},
        loop_feeds={str(path): feeds for path, feeds in loop_feeds.elsewhere(apex_texts).items()},
    )
    # each half's facts are planned with what the other files say of it, as its run is
    partners = half_partners.partners(apex_texts, options.settings, lambda path: file_settings(options, path))
    kept = apex_kept.kept_elsewhere(apex_texts, options.settings, partners, options.unsafe_fixes)
    master = apex_kept.kept_for_scale_halves(apex_texts, options.settings, partners)
    started = apex_kept.migrated_for_registrations(apex_texts, options.settings, partners)
    decorated = apex_kept.decorators_kept(apex_texts, options.settings, partners, options.unsafe_fixes)
    options = replace(
        options,
        partners={str(path): partner for path, partner in partners.items()},
        apex_kept_elsewhere={str(path): places for path, places in kept.items()},
        master_weights_kept={str(path): places for path, places in master.items()},
        apex_initialize_migrated={str(path): places for path, places in started.items()},
        apex_decorators_kept={str(path): places for path, places in decorated.items()},
    )
    passing, helpers, kept_by = state_helpers.handed(apex_texts, lambda path: file_settings(options, path), options.unsafe_fixes)
    # a checkpoint utility whose callers all pass the scaler is migrated with them: it keeps nothing of apex
    scaled = scale_kept.scaled_elsewhere(apex_texts, options.settings, partners, options.unsafe_fixes,
                                         {path.resolve(): True for path in passing})
    initialized = apex_kept.kept_for_state_helpers(apex_texts, lambda path: file_settings(options, path), partners, passing)
    return replace(
        options,
        scale_loss_kept_elsewhere={str(path): places for path, places in scaled.items()},
        state_callers_pass={str(path): functions for path, functions in passing.items()},
        state_helpers={str(path): calls for path, calls in helpers.items()},
        state_callers_kept={str(path): callers for path, callers in kept_by.items()},
        state_initialize_kept={str(path): places for path, places in initialized.items()},
    )


def _take(path: Path, verdict, results: dict, todo: dict, apex_texts: dict[Path, str]) -> None:
    """A ``triage`` verdict put where it goes: a final result, or ``todo[path]`` (the file's bytes, or
    its size) and its text when it may hold a half of apex amp."""
    if isinstance(verdict, FileResult):
        results[path] = verdict
        return
    todo[path], apex_text = verdict
    if apex_text is not None:
        apex_texts[path] = apex_text


class _Results(dict):
    """Each file's result, by path; ``progress(done, total)`` hears of each result set."""

    progress: Callable[[int, int], None] | None = None
    done = 0

    def __setitem__(self, path: Path, result: FileResult | None) -> None:
        super().__setitem__(path, result)
        if self.progress is not None and result is not None:
            self.done += 1
            self.progress(self.done, len(self))

    def settle(self, path: Path, result: FileResult) -> None:
        """A result set again once the file is written (or could not be): no progress to hear of."""
        super().__setitem__(path, result)


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
) -> Options:
    ignores = tuple((glob, tuple(codes)) for glob, codes in (per_file_ignores or {}).items())
    if ignores:
        select_rules(ignore=[code for _, codes in ignores for code in codes])  # a code no rule has is an error now
    return Options(
        unsafe_fixes=unsafe_fixes, fix=fix, settings=dict(settings or {}), per_file_ignores=ignores, edits=edits
    )


def _chosen(rules: Sequence[type] | None, select: Sequence[str], ignore: Sequence[str]) -> tuple | None:
    """The rules to run; None for the whole catalogue, which is imported only once a file needs it."""
    if rules is not None:
        return tuple(rules)
    if select or ignore:
        return tuple(select_rules(select, ignore))
    return None


