"""``--add-noqa``: a ``# noqa`` directive for every current finding, so that a project adopts the
rules and only new code is held to them (Ruff's ``--add-noqa``).

The findings come from a run that fixed nothing; each file is read again and written only if it
is still the text that run checked, atomically, as fixes are written. Notebooks are left alone:
a directive would go into a cell's source through the notebook's JSON.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Sequence

from migrate import files, noqa
from migrate.types import ERROR_CODE, INTERNAL_ERROR_CODE, UNUSED_NOQA_CODE, FileResult

_TOOL_CODES = frozenset({ERROR_CODE, INTERNAL_ERROR_CODE, UNUSED_NOQA_CODE})  # about the file or the run, not its code


class Added(NamedTuple):
    codes: int  # directives' codes written
    files: int  # files written
    skipped: tuple[str, ...]  # files with findings left as they were, and why


def add_noqa(results: Sequence[FileResult]) -> Added:
    codes = written = 0
    skipped = []
    for result in results:
        findings = [(d.location.row, d.code) for d in result.diagnostics if d.code not in _TOOL_CODES]
        if not findings or result.source is None or result.error:
            continue
        path = Path(result.filename)
        if path.suffix == ".ipynb":
            skipped.append(f"{result.filename}: a notebook (add its directives in the cells)")
            continue
        text, added = noqa.add_directives(result.source, findings)
        if not added:
            continue
        try:
            source = files.read(path)
            if source.data.decode(result.encoding) != result.source:
                raise files.ChangedSinceRead(result.filename)
            files.replace(path, text.encode(result.encoding), source)
        except (OSError, UnicodeDecodeError) as error:  # ChangedSinceRead among them
            skipped.append(f"{result.filename}: not written ({type(error).__name__}: {error})")
            continue
        codes += added
        written += 1
    return Added(codes, written, tuple(skipped))
