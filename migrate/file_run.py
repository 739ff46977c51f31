"""One file's run: read and decode it, decide whether it is worth parsing (``triage``), run the
rules over it, as Python or as a notebook's cells, and write the result back atomically. Every
failure (unreadable, undecodable, unparsable, unwritable, a crashing rule) becomes the file's
error result: one file never ends a run over the others.

``migrate.api`` runs this over a text or a tree, in this process or in worker processes.
"""
from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from migrate import files, quiet
from migrate.prefilter import may_apply, needs_parsing, reads_amp_api, sets_apex_flag, step_words, trigger_words
from migrate.rules import select_rules
from migrate.types import ERROR_CODE, INTERNAL_ERROR_CODE, Diagnostic, FileResult, Position

__all__ = ["Options", "decode", "error_result", "migrate_file", "migrate_one", "migrate_path", "triage", "triage_in_worker",
           "write_result"]


@dataclass(frozen=True)
class Options:
    """What changes a file's result. ``fix=False`` only reports (``--check``)."""

    unsafe_fixes: bool = False
    fix: bool = True
    settings: dict = field(default_factory=dict)
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (glob, code prefixes)
    edits: bool = False  # give each fix its text edits (JSON, SARIF)
    partners: Mapping[str, object] = field(default_factory=dict)  # path -> the other half of its apex amp
    imported_elsewhere: Mapping[str, frozenset[str]] = field(default_factory=dict)  # path -> ``migrate.importers``' names
    functions_imported_elsewhere: Mapping[str, frozenset[str]] = field(default_factory=dict)  # path -> its functions others import
    casts_elsewhere: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> ``migrate.cast_registrations``' places
    state_read_elsewhere: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> ``migrate.apex_state_reads``' places
    optimizer_state_loads: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> ``migrate.optimizer_resumes``' places
    handed_elsewhere: Mapping[str, tuple] = field(default_factory=dict)  # path -> ``migrate.forward_callers``' calls
    apex_kept_elsewhere: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> ``migrate.apex_kept``' places
    master_weights_kept: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> ``apex_kept.kept_for_scale_halves``' places
    apex_initialize_migrated: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> ``apex_kept.migrated_for_registrations``'
    apex_decorators_kept: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> ``apex_kept.decorators_kept``' places
    scale_loss_kept_elsewhere: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> ``migrate.scale_kept``' places
    initialized_elsewhere: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> ``scale_kept.initialized_elsewhere``'s places
    levels_elsewhere: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # path -> ``migrate.level_settings``' names
    state_callers_pass: Mapping[str, frozenset[str]] = field(default_factory=dict)  # path -> ``migrate.state_helpers``' functions
    state_helpers: Mapping[str, tuple] = field(default_factory=dict)  # path -> ``migrate.state_helpers``' calls
    state_callers_kept: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> callers left on apex
    state_initialize_kept: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> ``apex_kept.kept_for_state_helpers``' places
    forwardless_models: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # path -> ``migrate.forwardless_models``' lines
    gradient_norms: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # path -> ``migrate.grad_norms``' names
    half_helpers: Mapping[str, tuple] = field(default_factory=dict)  # path -> ``migrate.half_helpers``' names and places
    subclass_overrides: Mapping[str, tuple] = field(default_factory=dict)  # path -> ``migrate.subclass_overrides``' methods
    base_bindings: Mapping[str, tuple] = field(default_factory=dict)  # path -> ``migrate.base_bindings``' attributes
    amp_reexported: Mapping[str, tuple] = field(default_factory=dict)  # path -> ``migrate.amp_reexports``' names
    loop_feeds: Mapping[str, tuple] = field(default_factory=dict)  # path -> ``migrate.loop_feeds``' feeds


# Each Options field holding what other files tell a file, and the setting its plan reads it from
# (the modules that find them are loaded only in a run that holds apex).
_PROJECT_FACTS = (
    ("partners", "apex-partner"),
    ("imported_elsewhere", "imported-elsewhere"),
    ("functions_imported_elsewhere", "functions-imported-elsewhere"),
    ("casts_elsewhere", "apex-casts-elsewhere"),
    ("state_read_elsewhere", "apex-state-read-elsewhere"),
    ("optimizer_state_loads", "optimizer-state-loaded"),
    ("handed_elsewhere", "forward-callers"),
    ("apex_kept_elsewhere", "apex-initialize-kept"),
    ("master_weights_kept", "apex-master-weights-kept"),
    ("apex_initialize_migrated", "apex-initialize-migrated"),
    ("apex_decorators_kept", "apex-decorators-kept"),
    ("scale_loss_kept_elsewhere", "apex-scale-loss-kept"),
    ("initialized_elsewhere", "apex-initialized-elsewhere"),
    ("levels_elsewhere", "apex-level-set-elsewhere"),
    ("state_callers_pass", "apex-state-callers-pass"),
    ("state_helpers", "apex-state-helpers"),
    ("state_callers_kept", "apex-state-callers-kept"),
    ("state_initialize_kept", "apex-state-initialize-kept"),
    ("forwardless_models", "apex-o3-forwardless"),
    ("gradient_norms", "gradient-norm-helpers"),
    ("half_helpers", "half-cast-helpers"),
    ("subclass_overrides", "subclass-overrides"),
    ("base_bindings", "base-bindings"),
    ("amp_reexported", "apex-amp-reexported"),
    ("loop_feeds", "model-runs-feeding-training"),
)


def triage(path: Path, words: tuple[str, ...] | None, stepping: frozenset[str]) -> FileResult | tuple[files.Source, str | None]:
    """A file's final result when it cannot be read or decoded, or is not worth parsing (``words``,
    ``stepping``: ``needs_parsing``'s); else its bytes as read, and its text when it may hold a half
    of apex amp (``migrate.halves``)."""
    try:
        source = files.read(path)
    except OSError as error:
        return error_result(str(path), f"cannot read: {error.strerror or error}")
    decoded = decode(str(path), source.data)
    if isinstance(decoded, FileResult):
        return decoded
    text = decoded[0]
    if path.suffix == files.NOTEBOOK_SUFFIX:  # its JSON escapes line ends: "\nscaler" would hide "scaler"
        from migrate import notebook

        return (source, None) if may_apply(notebook.searchable(text), words) else FileResult(str(path))
    if not needs_parsing(text, words, stepping):  # the whole check here, so that a run of such files never imports a rule
        return FileResult(str(path))
    # a flag left once apex went (`HAS_APEX = True`) is asked about too: whether other modules import
    # it; and apex's amp API read through a name: whether a module of the project hands it out
    return source, text if "apex" in text or sets_apex_flag(text) or reads_amp_api(text) else None


def triage_in_worker(paths: list[Path], words: tuple[str, ...] | None, stepping: frozenset[str]) -> list[tuple[Path, object]]:
    """``triage`` of each path, in a worker: a file worth parsing comes back as its size, not its
    bytes (it is read again where it is worked on)."""
    verdicts = []
    for path in paths:
        verdict = triage(path, words, stepping)
        if not isinstance(verdict, FileResult):
            source, apex_text = verdict
            verdict = len(source.data), apex_text
        verdicts.append((path, verdict))
    return verdicts


def _ignored_here(filename: str, options: Options) -> tuple[str, ...]:
    """The code prefixes ``per_file_ignores`` leave out for this file."""
    path = Path(filename)
    return tuple(
        code.strip().upper()
        for glob, codes in options.per_file_ignores
        if (not files.matches(path, [glob[1:]]) if glob.startswith("!") else files.matches(path, [glob]))
        for code in codes
    )


def migrate_path(path: Path, rules: tuple | None, options: Options, write: bool) -> tuple[FileResult, files.Source | None]:
    """One file in a worker process (re-read there: cheaper than sending its bytes over), and,
    where ``write`` and it changed, its bytes as read, for ``write_result`` once the run has
    planned every file."""
    try:
        source = files.read(path)
    except OSError as error:
        return error_result(str(path), f"cannot read: {error.strerror or error}"), None
    result = migrate_file(path, source, rules, options)
    return result, source if write and result.changed else None


def file_settings(options: Options, path: Path) -> dict:
    """The settings ``path`` is planned with: the run's, and what the run found in other files for it."""
    settings = dict(options.settings)
    for field_name, setting in _PROJECT_FACTS:
        found = getattr(options, field_name).get(str(path))
        if found:
            settings[setting] = found
    return settings


def migrate_file(path: Path, source: files.Source, rules: tuple | None, options: Options) -> FileResult:
    """``path``'s result, planned with what the run found in other files for it; nothing is written."""
    settings = file_settings(options, path)
    if len(settings) != len(options.settings):
        options = replace(options, settings=settings)
    return migrate_one(str(path), source.data, None, rules, options, triaged=True)


def write_result(path: Path, result: FileResult, source: files.Source) -> FileResult:
    """Save a changed file's new text over ``source`` (its bytes as read), atomically; the result
    of a file that could not be saved says why, and the file is as it was."""
    try:
        files.replace(path, result.new_source.encode(result.encoding), source)
    except UnicodeEncodeError as error:
        return _unwritten(result, f"the fixed text cannot be encoded as {result.encoding!r}: {error}")
    except files.ChangedSinceRead:
        return _unwritten(result, "it changed on disk while ampmigrate ran; left as it is: run again to migrate it")
    except OSError as error:
        return _unwritten(result, f"cannot write: {error.strerror or error}; check the file's permissions")
    return result


def decode(filename: str, data: bytes) -> tuple[str, str] | FileResult:
    """The text and its encoding (PEP 263 cookie or BOM), or the error result of a file that cannot be decoded."""
    encoding = "utf-8"
    try:
        encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
        return data.decode(encoding), encoding
    except (SyntaxError, LookupError, UnicodeDecodeError) as error:
        hint = "; it looks like UTF-16 or UTF-32" if data.startswith(_WIDE_BOMS) or b"\0" in data[:4096] else ""
        return error_result(
            filename, f"cannot decode as {encoding!r}: {error}{hint}; save it as UTF-8 or declare its encoding (PEP 263)"
        )


_WIDE_BOMS = (b"\xff\xfe", b"\xfe\xff")


def migrate_one(filename: str, data: bytes | None, text: str | None, rules: tuple | None, options: Options,
                triaged: bool = False) -> FileResult:
    """One file's result; ``triaged``: ``triage`` found it worth parsing (not asked again)."""
    encoding = "utf-8"
    if data is not None:
        decoded = decode(filename, data)
        if isinstance(decoded, FileResult):
            return decoded
        text, encoding = decoded
    if filename.endswith(files.NOTEBOOK_SUFFIX):
        return _migrate_notebook(filename, text, encoding, rules, options)
    return _migrate_python(filename, text, encoding, rules, options, triaged)


def _migrate_notebook(filename: str, text: str, encoding: str, rules: tuple | None, options: Options) -> FileResult:
    """A notebook's code cells, run as one Python text; findings are placed in their cells."""
    from migrate import notebook

    try:
        book = notebook.Notebook(text)
    except notebook.NotebookError as error:
        return error_result(filename, f"{error}; left as it is")
    if book.python is None:  # another language's notebook
        return FileResult(filename, source=text, new_source=text, encoding=encoding)
    inner = _migrate_python(filename, book.python, "utf-8", rules, options)

    def in_cells(diagnostics: tuple[Diagnostic, ...], python: str) -> tuple[Diagnostic, ...]:
        # a fix's edits address the cells joined as one text, not the notebook's JSON: they are left out
        return tuple(
            d._replace(location=book.locate(python, d.location), end_location=book.locate(python, d.end_location),
                       related=tuple(r._replace(location=book.locate(python, r.location),
                                                end_location=book.locate(python, r.end_location)) for r in d.related),
                       fix=d.fix and d.fix._replace(edits=()))
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


def _migrate_python(filename: str, text: str, encoding: str, rules: tuple | None, options: Options,
                    triaged: bool = False) -> FileResult:
    if not triaged and not needs_parsing(text, trigger_words(rules), step_words(rules)):
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
        # the file's tree lives until the run ends: the collector would scan it again and again as
        # it is made, a fifth of a large file's time, growing faster than the file
        with quiet.cycle_collector_paused():
            outcome = run_rules(
                text.replace("\r", "\n") if cr_only else text, filename, rules,
                fix=options.fix, unsafe_fixes=options.unsafe_fixes, settings=options.settings, edits=options.edits,
            )
    except Exception as error:  # one file must never end the run over the others
        return error_result(filename, f"internal error: {type(error).__name__}: {error}", INTERNAL_ERROR_CODE)
    new_text = outcome.source.replace("\n", "\r") if cr_only else outcome.source
    return FileResult(filename, outcome.diagnostics, text, new_text, outcome.error, encoding, outcome.remaining)


def _unwritten(result: FileResult, message: str) -> FileResult:
    """The result of a file whose fixes could not be saved: it is as it was."""
    error = error_result(result.filename, message)
    diagnostics = (*error.diagnostics, *(d._replace(applied=False) for d in result.diagnostics))
    return FileResult(result.filename, diagnostics, result.source, result.source, message, result.encoding, diagnostics)


def error_result(filename: str, message: str, code: str = ERROR_CODE) -> FileResult:
    start = Position(1, 1)
    error = (Diagnostic(code, message, filename, start, start),)
    return FileResult(filename, error, error=message, remaining=error)

