"""Plain data shared by every layer of ``migrate``: findings, their fixes, and where they are.

Immutable records here and across the package are ``NamedTuple``s: creating a frozen dataclass
compiles its six methods at import, some 3 million instructions each on Python 3.11, and a run
on one file imports some thirty records (a tenth of the time it takes past ``import libcst``).
Records with a dict field stay frozen dataclasses: a ``NamedTuple`` default would be one dict for all.
"""
from __future__ import annotations

import enum
import functools
import re
from typing import NamedTuple


# Codes of the findings the tool itself makes about a file, rather than a rule.
ERROR_CODE = "AMP900"  # the file could not be read, decoded, parsed or written
INTERNAL_ERROR_CODE = "AMP901"  # a rule crashed, or its fixes gave code that does not compile
UNUSED_NOQA_CODE = "AMP800"  # a "# noqa" code that suppressed nothing (rules/unused_noqa.py documents it)


class Safety(str, enum.Enum):
    """How far a fix may be trusted (Ruff's "applicability")."""

    SAFE = "safe"  # keeps behaviour: applied by default
    UNSAFE = "unsafe"  # may change behaviour: applied only with --unsafe-fixes


class ImportChange(NamedTuple):
    """``import module`` (obj None) or ``from module import obj [as asname]``; ``relative``: the
    number of leading dots of a relative import's module."""

    module: str
    obj: str | None = None
    asname: str | None = None
    relative: int = 0


class Position(NamedTuple):
    """A place in a file: 1-based row, 1-based column (Ruff's convention); in a notebook, the
    row is in the cell numbered ``cell`` (from 1, among all its cells)."""

    row: int
    column: int
    cell: int | None = None


class FixSafety(str, enum.Enum):
    """What a rule declares of the fixes it offers (``--list-rules``); tests check it against its examples."""

    ALWAYS = "always safe"  # every fix it offers keeps behaviour
    SOMETIMES = "sometimes safe"  # some fixes are safe, others may change behaviour
    NEVER = "never safe"  # every fix needs --unsafe-fixes
    NO_FIX = "no fix"  # it only reports


class Edit(NamedTuple):
    """Replace the text from ``location`` up to ``end_location`` (exclusive) by ``content`` (Ruff's edit)."""

    content: str
    location: Position
    end_location: Position


class Fix(NamedTuple):
    """A finding's fix. ``why_unsafe`` says how an unsafe fix may change behaviour; ``edits`` are
    filled in only when asked for (JSON and SARIF output), located in the text the finding is in."""

    applicability: Safety
    message: str
    why_unsafe: str = ""
    edits: tuple[Edit, ...] = ()


class Related(NamedTuple):
    """Another place a finding is about (SARIF's ``relatedLocations``): a read the same wait
    covers, the helper line a call reaches."""

    message: str
    location: Position
    end_location: Position


class Diagnostic(NamedTuple):
    """One finding at one site. ``fix`` is None when the rule can only report; ``related``: the
    other places of the same cause."""

    code: str
    message: str
    filename: str
    location: Position
    end_location: Position
    fix: Fix | None = None
    applied: bool = False  # the fix was written (or would be, under --diff/--check)
    related: tuple[Related, ...] = ()


class FileResult(NamedTuple):
    """What a run did to one file.

    ``source`` is the text read and ``new_source`` the text after the fixes allowed (the same
    string when nothing changed); both are None when the file was not read through, or was
    skipped because it cannot contain anything the selected rules look for. ``diagnostics`` are
    located in ``source``. ``error`` says why a file could not be read, decoded, parsed, fixed or
    written; such a file is left untouched.
    """

    filename: str
    diagnostics: tuple[Diagnostic, ...] = ()
    source: str | None = None
    new_source: str | None = None
    error: str | None = None
    encoding: str = "utf-8"  # as found in the file; "utf-8-sig" keeps a byte-order mark
    remaining: tuple[Diagnostic, ...] = ()  # the findings left after the fixes, located in new_source

    @property
    def changed(self) -> bool:
        return self.source is not None and self.new_source is not None and self.new_source != self.source


def holds_trigger(content: str | bytes, words: tuple[str, ...]) -> bool:
    """Whether ``content`` (text, or undecoded bytes) holds one of a rule's ``TRIGGERS`` words.

    A word matches in any case, alone or as a part of a snake_case name: ``amp`` is found in
    ``use_amp`` and ``AMP_LEVEL``, not in ``clamp``. Kept here, below libcst, so that files can be
    skipped before anything heavy is imported.

    What ``triggers_pattern`` finds, several times faster: the lowered text is searched for each
    word alone, a C-speed literal search, and each place one starts is checked for its neighbours.
    (A lookbehind in front of the words keeps the regex from that fast search.) The regex is left
    for the text where lowering is not what its Unicode case rules do (``_FOLDING_INTO_ASCII``).
    """
    binary = isinstance(content, bytes)
    if not words or not all(words) or not (binary or content.isascii() or _lowers_as_the_regex_folds(content, words)):
        # no word (the regex then matches any word boundary), or Unicode case rules at play: the regex
        return triggers_pattern(words, binary).search(content) is not None
    lowered_words, alphanumeric = _lowered(words, binary)
    lowered = content.lower()
    return any(holds_word(lowered, word, alphanumeric) for word in lowered_words)


# The only characters that, in the regex's case-insensitive match, stand for an ASCII letter (or
# lower to one): dotted and dotless i, long s, the Kelvin sign. Any other keeps its own letters.
_FOLDING_INTO_ASCII = ("\u0130", "\u0131", "\u017f", "\u212a")


def _lowers_as_the_regex_folds(text: str, words: tuple[str, ...]) -> bool:
    return all(word.isascii() for word in words) and not any(character in text for character in _FOLDING_INTO_ASCII)


def holds_word(content: str | bytes, word: str | bytes, inside: frozenset) -> bool:
    """Whether ``word`` stands in ``content`` with none of the characters ``inside`` a word (single
    characters, or single bytes) on either side: each place a C-speed literal search finds it,
    its neighbours are checked."""
    start = content.find(word)
    while start != -1:
        end = start + len(word)
        if content[start - 1:start] not in inside and content[end:end + 1] not in inside:
            return True
        start = content.find(word, start + 1)
    return False


@functools.lru_cache(maxsize=None)
def _lowered(words: tuple[str, ...], binary: bool) -> tuple[tuple, frozenset]:
    """The lowered words and the ASCII letters and digits, in text or bytes."""
    lowered = tuple(sorted({word.lower() for word in words}))
    characters = "abcdefghijklmnopqrstuvwxyz0123456789"
    if binary:
        return tuple(word.encode() for word in lowered), frozenset(bytes([c]) for c in characters.encode())
    return lowered, frozenset(characters)


@functools.lru_cache(maxsize=None)
def triggers_pattern(words: tuple[str, ...], binary: bool = False) -> re.Pattern:
    """The regex of ``holds_trigger``, in text or (``binary``) undecoded bytes."""
    alternatives = "|".join(re.escape(word) for word in sorted(words, key=len, reverse=True))
    body = rf"(?<![A-Za-z0-9])(?:{alternatives})(?![A-Za-z0-9])"
    return re.compile(body.encode() if binary else body, re.IGNORECASE)
