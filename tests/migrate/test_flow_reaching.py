"""``flow.reaching`` against running code: generated functions bind ``x`` in branches, loops,
``try`` blocks, with ``break``/``continue``/``raise``, and read it once; each binding leaves its
own tag in ``x``. Run with random decisions, every tag the read sees must be among the bindings
that ``reaching`` says reach it (and ``"outside"`` among them only where it says so). Where every
decision is an independent coin (no ``try``: the graph lets any statement there raise), every
binding it names must also be seen on some run: the answer is exact, not just safe."""
from __future__ import annotations

import random
import textwrap

import libcst as cst
from hypothesis import given, settings
from hypothesis import strategies as st

from migrate.flow.control import Graph
from migrate.flow.reaching import reaching
from migrate.tree_walk import descendants

READ = "seen.append(x)"


class _Program:
    """A function ``f(x, coin, seen)`` built at random; ``x = "b3"`` and ``for x in [...]`` tag their binding."""

    def __init__(self, rng: random.Random, with_try: bool) -> None:
        self.rng, self.with_try, self.tags = rng, with_try, 0
        self.read_placed = False

    def tag(self) -> str:
        self.tags += 1
        return f"b{self.tags}"

    def block(self, depth: int, in_loop: bool) -> list[str]:
        lines: list[str] = []
        for _ in range(self.rng.randint(1, 3)):
            lines += self.statement(depth, in_loop)
        return lines

    def statement(self, depth: int, in_loop: bool) -> list[str]:
        kinds = ["bind", "bind", "other", "read"] + ["if", "for", "range"] * (depth < 2)
        kinds += ["try"] * (depth < 2 and self.with_try) + ["jump"] * in_loop + ["raise", "bind_or_raise"] * self.with_try
        kind = self.rng.choice(kinds)
        if kind == "read" and self.read_placed:
            kind = "other"
        if kind == "bind":
            return [f'x = "{self.tag()}"']
        if kind == "bind_or_raise":  # raises before it binds, now and then
            return [f'x = raising(coin, "{self.tag()}")']
        if kind == "other":
            return ["y = 0"]
        if kind == "read":
            self.read_placed = True
            return [READ]
        if kind == "jump":
            return [f"if coin(): {self.rng.choice(['break', 'continue'])}"]
        if kind == "raise":
            return ["if coin(): raise ValueError"]
        inner = lambda loop: textwrap.indent("\n".join(self.block(depth + 1, loop)), "    ").splitlines()  # noqa: E731
        if kind == "if":
            lines = ["if coin():", *inner(in_loop)]
            return lines + (["else:", *inner(in_loop)] if self.rng.random() < 0.5 else [])
        if kind == "for":  # may run no time at all
            tag = self.tag()  # one tag for the loop's every item
            return [f'for x in (["{tag}", "{tag}"] if coin() else []):', *inner(True)]
        if kind == "range":
            return ["for _ in range(2 if coin() else 0):", *inner(True)]
        lines = ["try:", *inner(in_loop), "except ValueError:", *inner(in_loop)]
        return lines + (["finally:", *inner(in_loop)] if self.rng.random() < 0.3 else [])

    def source(self) -> str:
        body = self.block(0, False)
        if not self.read_placed:
            body.append(READ)
        body = ["try:", *textwrap.indent("\n".join(body), "    ").splitlines(), "except ValueError:", "    pass"]
        return "def f(x, coin, seen):\n" + textwrap.indent("\n".join(body), "    ") + "\n"


def _predicted(source: str) -> set[str]:
    function = cst.parse_module(source).body[0]
    graph = Graph(function)
    read = next(node for node in descendants(function) if type(node) is cst.SimpleStatementLine
                and cst.Module([]).code_for_node(node).strip() == READ)
    found = reaching(graph, "x", read)
    tags = {"outside"} if found.from_outside else set()
    for binding in found.bindings:
        tags |= {node.evaluated_value for node in descendants(binding, lambda n: n is binding or type(n) is not cst.IndentedBlock)
                 if type(node) is cst.SimpleString}
    return tags


def _raising(coin, tag: str) -> str:
    if coin():
        raise ValueError(tag)
    return tag


def _seen(source: str, seed: int, runs: int) -> set[str]:
    namespace: dict = {"raising": _raising}
    exec(compile(source, "generated.py", "exec"), namespace)
    rng = random.Random(seed)
    seen: list[str] = []
    for _ in range(runs):
        namespace["f"]("outside", lambda: rng.random() < 0.5, seen)
    return set(seen)


@settings(max_examples=300, deadline=None, database=None)
@given(seed=st.integers(0, 2**32), with_try=st.booleans())
def test_what_a_read_sees_is_a_binding_that_reaches_it(seed, with_try):
    source = _Program(random.Random(seed), with_try).source()
    predicted = _predicted(source)
    seen = _seen(source, seed, 200)
    assert seen <= predicted, source
    if not with_try:
        assert seen == predicted or not seen, source


def _reaching_text(source: str, name: str, line: str) -> tuple[set[str], bool]:
    function = cst.parse_module(textwrap.dedent(source)).body[0]
    statement = next(node for node in descendants(function) if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
                     and cst.Module([]).code_for_node(node).strip().splitlines()[0] == line)
    found = reaching(Graph(function), name, statement)
    return {cst.Module([]).code_for_node(b).strip().splitlines()[0] for b in found.bindings}, found.from_outside


def test_a_statement_reads_what_was_bound_before_it_not_its_own_binding():
    assert _reaching_text("""\
        def f(loss):
            loss = loss / 4
            use(loss)
        """, "loss", "loss = loss / 4") == (set(), True)


def test_a_loop_target_is_what_its_body_reads_and_an_empty_loop_leaves_the_old_value():
    source = """\
        def f(loss, xs):
            i = loss
            for i, x in enumerate(xs):
                use(i)
            done(i)
        """
    assert _reaching_text(source, "i", "use(i)") == ({"for i, x in enumerate(xs):"}, False)
    assert _reaching_text(source, "i", "done(i)") == ({"i = loss", "for i, x in enumerate(xs):"}, False)


def test_a_binding_later_in_a_loop_reaches_the_top_of_its_next_pass():
    assert _reaching_text("""\
        def f(xs):
            total = 0
            for x in xs:
                use(total)
                total = total + x
        """, "total", "use(total)") == ({"total = 0", "total = total + x"}, False)


def test_attributes_with_as_walrus_except_and_nested_definitions_bind():
    source = """\
        def f(self, path):
            self.opt = make()
            with open(path) as handle:
                pass
            if (n := len(path)) > 2:
                pass
            try:
                pass
            except OSError as error:
                pass
            def helper():
                pass
            read(self.opt, handle, n, error, helper)
        """
    line = "read(self.opt, handle, n, error, helper)"
    assert _reaching_text(source, "self.opt", line) == ({"self.opt = make()"}, False)
    assert _reaching_text(source, "handle", line) == ({"with open(path) as handle:"}, False)
    assert _reaching_text(source, "n", line) == ({"if (n := len(path)) > 2:"}, False)
    assert _reaching_text(source, "error", line) == ({"except OSError as error:"}, True)
    assert _reaching_text(source, "helper", line) == ({"def helper():"}, False)


def test_a_comprehensions_own_target_binds_nothing_outside_it():
    assert _reaching_text("""\
        def f(x, xs):
            ys = [x for x in xs]
            use(x)
        """, "x", "use(x)") == (set(), True)
