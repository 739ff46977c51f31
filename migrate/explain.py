"""``--explain CODE`` and ``--list-rules``: the catalogue's own words, so they cannot drift from the code."""
from __future__ import annotations

import inspect
from typing import Sequence

from migrate.types import Safety

__all__ = ["explain", "list_rules"]


def explain(code: str) -> str:
    """The documentation of the rule with ``code``: its docstring, then ``INVALID[0]`` and its fix.

    Raises LookupError for an unknown code.
    """
    from migrate.rules import all_rules, rule_by_code

    rule = rule_by_code(code)
    if rule is None:
        known = ", ".join(r.CODE for r in all_rules())
        raise LookupError(f"no rule has the code {code!r}; known codes: {known}")
    lines = [f"# {rule.name()} ({rule.CODE})", "", inspect.cleandoc(rule.__doc__ or rule.MESSAGE), ""]
    if rule.INVALID:
        example = rule.INVALID[0]
        lines += ["Example:", "", _indent(example.code)]
        if example.expected_replacement is not None:
            flag = " (with --unsafe-fixes)" if example.unsafe_fixes else ""
            lines += [f"Becomes{flag}:", "", _indent(example.expected_replacement)]
    return "\n".join(lines).rstrip("\n") + "\n"


def list_rules(rules: Sequence[type] | None = None) -> str:
    """One line per rule: code, name, whether it fixes, and how safe its fix is."""
    if rules is None:
        from migrate.rules import all_rules

        rules = all_rules()
    rows = [("code", "name", "fixable", "safety")]
    for rule in rules:
        rows.append((rule.CODE, rule.name(), "yes" if rule.fixable() else "no", _safety(rule)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n" for row in rows)


def _safety(rule: type) -> str:
    """Worked out from the examples: a fix shown only under --unsafe-fixes makes the rule (sometimes) unsafe."""
    fixed = [case for case in rule.INVALID if case.expected_replacement is not None]
    if not fixed:
        return "-"
    unsafe = sum(case.unsafe_fixes for case in fixed)
    if unsafe == 0:
        return Safety.SAFE.value
    return Safety.UNSAFE.value if unsafe == len(fixed) else "sometimes unsafe"


def _indent(code: str) -> str:
    return "\n".join(f"    {line}" if line else "" for line in code.rstrip("\n").splitlines()) + "\n"
