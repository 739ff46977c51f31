"""``flow.bindings``: where a name is bound and what each part of a binding gives it, read the
same way by the migration (``bindings``, ``bound_value``) and the linter's step values
(``value_syntax.pairs_bound``)."""
from __future__ import annotations

import libcst as cst
import pytest

from migrate import apex_nodes as nodes
from migrate.flow.bindings import BINDING_NODES, bindings, bound_names, bound_value, parts
from migrate.step_model.value_syntax import pairs_bound
from migrate.tree_walk import descendants

# (statement, name, what bound_value gives it: its source text, or None for "not seen")
CASES = [
    ("x = f(a)", "x", "f(a)"),
    ("x: int = 3", "x", "3"),
    ("a = x = g()", "x", "g()"),
    ("x, y = f(a), g(b)", "y", "g(b)"),
    ("[x, y] = (1, 2)", "x", "1"),
    ("x, y = pair", "x", None),  # unpacking a value: not seen
    ("x, *rest = f(a)", "x", None),
    ("x += 1", "x", None),
    ("for x in xs: pass", "x", None),
    ("for i, x in enumerate(xs): pass", "x", None),
    ("with open(p) as x: pass", "x", None),
    ("(x := f(a))", "x", "f(a)"),
    ("self.scaler, self.opt = GradScaler(), SGD()", "self.scaler", "GradScaler()"),
]


def _binding(source: str, name: str) -> cst.CSTNode:
    found = bindings(cst.parse_module(source + "\n"), name)
    assert len(found) == 1, source
    return found[0]


@pytest.mark.parametrize(("source", "name", "value"), CASES, ids=[case[0] for case in CASES])
def test_bound_value_is_the_value_of_the_names_own_part(source, name, value):
    binding = _binding(source, name)
    assert name in bound_names(binding)
    given = bound_value(binding, name)
    assert (given is binding) == (value is None)
    if value is not None:
        assert nodes.code(given) == value


# (statement, the parts: names and the source of what each holds, None where nothing gives it)
PARTS = [
    ("x, y = f(a), g(b)", [(("x",), "f(a)"), (("y",), "g(b)")]),
    ("for k, v in d.items(): pass", [(("k",), None), (("v",), "d")]),
    ("for i, (x, y) in enumerate(pairs): pass", [(("i",), None), (("x", "y"), "pairs")]),
    ("for a, b in zip(xs, ys): pass", [(("a",), "xs"), (("b",), "ys")]),
    ("key, value = outputs.popitem()", [(("key",), None), (("value",), "outputs")]),
    ("total += loss", [(("total",), "loss")]),
    ("for x in xs: pass", [(("x",), "xs")]),
]


@pytest.mark.parametrize(("source", "expected"), PARTS, ids=[case[0] for case in PARTS])
def test_parts_say_where_each_name_takes_its_value_from(source, expected):
    module = cst.parse_module(source + "\n")
    binding = next(node for node in descendants(module) if type(node) in BINDING_NODES)
    got = [(part.names, nodes.code(part.value) if part.value is not None else None) for part in parts(binding)]
    assert got == expected


class _Recorded:
    """A binding as the linter's walk records it."""

    def __init__(self, node: cst.CSTNode) -> None:
        self.node, self.targets = node, bound_names(node)
        self.value = getattr(node, "value", None) or getattr(node, "iter", None)


@pytest.mark.parametrize("source", [source for source, _ in PARTS] + [source for source, _, _ in CASES])
def test_the_linter_reads_a_binding_as_the_migration_does(source):
    module = cst.parse_module(source + "\n")
    for binding in (node for node in descendants(module) if type(node) in BINDING_NODES):
        assert pairs_bound(_Recorded(binding)) == [(part.names, part.value) for part in parts(binding)]


def test_a_loop_over_a_dict_gives_the_linter_its_keys_not_its_values():
    loop = cst.parse_module("for key in loss_dict: pass\n").body[0]
    assert pairs_bound(_Recorded(loop)) == [(("key",), None)]  # strings, whatever the dict holds
