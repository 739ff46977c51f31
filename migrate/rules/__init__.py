"""The catalogue: every rule class, found by importing the modules of this package.

A module ``rules/<pattern>.py`` holds one rule class (a ``Rule`` subclass with a ``CODE``);
modules whose name starts with ``_`` hold shared helpers and are not searched.
Nothing is imported until the catalogue is first asked for, so a run that needs no rule stays light.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil

__all__ = ["all_rules", "rule_by_code"]


@functools.lru_cache(maxsize=None)
def all_rules() -> tuple[type, ...]:
    """Every rule class of the package, ordered by code."""
    from migrate.rule import Rule

    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            # a rule defined here; its bases read (see tree_walk.is_node_type: issubclass is slow here)
            if not (isinstance(value, type) and value.__module__ == module.__name__ and Rule in value.__mro__):
                continue
            if not value.CODE:
                continue
            if value.CODE in found:
                other = found[value.CODE]
                raise RuntimeError(
                    f"rule code {value.CODE!r} is used by both {other.__module__}.{other.__name__} and "
                    f"{module.__name__}.{value.__name__}; give one of them a free code"
                )
            found[value.CODE] = value
    return tuple(found[code] for code in sorted(found))


def rule_by_code(code: str) -> type | None:
    """The rule with this exact code (case-insensitive), or None."""
    wanted = code.strip().upper()
    return next((rule for rule in all_rules() if rule.CODE == wanted), None)
