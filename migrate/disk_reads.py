"""What a run read from other files of a project, kept until the next run starts.

A file's plan reads other files of its project (where a model's parameters are frozen, which
files hold apex's ``initialize``, ...); each such reading is cached, as many files of a project
ask the same. A run's files may change on disk before the next run in the same process (an
editor, a test, ``ampmigrate`` then ``--check``): ``forget`` clears every such cache, and
``migrate.api`` calls it as each run starts.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, TypeVar

__all__ = ["cached", "forget"]

_Function = TypeVar("_Function", bound=Callable)
_caches: list = []  # every function ``cached`` made: cleared together


def cached(maxsize: int) -> Callable[[_Function], _Function]:
    """``functools.lru_cache(maxsize)`` for a function reading the disk, cleared by ``forget``."""
    def decorate(function: _Function) -> _Function:
        wrapped = lru_cache(maxsize=maxsize)(function)
        _caches.append(wrapped)
        return wrapped

    return decorate


def forget() -> None:
    """Clear what every reading of the disk cached: the next run reads the files as they are then."""
    for wrapped in _caches:
        wrapped.cache_clear()
