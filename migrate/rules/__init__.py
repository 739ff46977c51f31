"""The catalogue: every rule class, found by importing the modules of this package, and the
choice among them by code prefix (``select_rules``, what ``--select`` and ``--ignore`` mean).

A module ``rules/<pattern>.py`` holds one rule class (a ``Rule`` subclass with a ``CODE``);
modules whose name starts with ``_`` hold shared helpers and are not searched.
Nothing is imported until the catalogue is first asked for, so a run that needs no rule stays light.
"""
from __future__ import annotations

import functools
import importlib
from typing import Sequence

__all__ = ["all_rules", "rule_by_code", "select_rules"]


@functools.lru_cache(maxsize=None)
def all_rules() -> tuple[type, ...]:
    """Every rule class of the package, ordered by code."""
    import pkgutil  # here: a run that parses no file never asks for the catalogue

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
