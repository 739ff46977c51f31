"""Plain data shared by every layer of ``migrate``: findings, their fixes, and where they are."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Safety(str, enum.Enum):
    """How far a fix may be trusted (Ruff's "applicability")."""

    SAFE = "safe"  # keeps behaviour: applied by default
    UNSAFE = "unsafe"  # may change behaviour: applied only with --unsafe-fixes


@dataclass(frozen=True)
class Position:
    """A place in a file: 1-based row, 1-based column (Ruff's convention)."""

    row: int
    column: int


@dataclass(frozen=True)
class Fix:
    applicability: Safety
    message: str


@dataclass(frozen=True)
class Diagnostic:
    """One finding at one site. ``fix`` is None when the rule can only report."""

    code: str
    message: str
    filename: str
    location: Position
    end_location: Position
    fix: Fix | None = None
    applied: bool = False  # the fix was written (or would be, under --diff/--check)
