"""The control-flow graph (``migrate.flow.control``): its answers against every run of generated programs.

A generated program is a function of plain calls ``s0()``, ``s1()``, ... nested in ``if``/``elif``/
``else``, ``for``/``while`` (with ``else:``, and ``while True:``), ``with``, ``try``/``except``/
``else``/``finally``, with ``break``, ``continue``, ``return`` and ``raise``. ``_runs`` lists
every way it can run, taking each branch both ways, each loop round zero to three times, and
letting each statement in a ``try`` body raise; the graph's answer must be what those runs say.
"""
from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from migrate.flow.control import Graph
from migrate.tree_walk import descendants

_ROUNDS = 3
_MOST_RUNS = 20_000


class _TooMany(Exception):
    pass


# generated programs


@st.composite
def _block(draw, depth: int, in_loop: bool, counter: list[int]) -> list[str]:
    size = draw(st.integers(1, 3))
    lines: list[str] = []
    for _ in range(size):
        lines += draw(_statement(depth, in_loop, counter))
    return lines


def _indented(lines: list[str]) -> list[str]:
    return ["    " + line for line in lines]


@st.composite
def _statement(draw, depth: int, in_loop: bool, counter: list[int]) -> list[str]:
    kinds = ["call", "call", "call"]
    if depth < 3:
        kinds += ["if", "if_else", "elif", "for", "while", "while_true", "with", "try", "try_finally"]
    kinds += ["return", "raise"] + (["break", "continue"] if in_loop else [])
    kind = draw(st.sampled_from(kinds))

    def inner(loop: bool = in_loop) -> list[str]:
        return _indented(draw(_block(depth + 1, loop, counter)))

    if kind == "call":
        counter[0] += 1
        return [f"s{counter[0] - 1}()"]
    if kind in ("return", "raise", "break", "continue"):
        return {"return": ["return"], "raise": ["raise E"], "break": ["break"], "continue": ["continue"]}[kind]
    if kind == "if":
        return ["if c():", *inner()]
    if kind == "if_else":
        return ["if c():", *inner(), "else:", *inner()]
    if kind == "elif":
        return ["if c():", *inner(), "elif c():", *inner()]
    if kind == "for":
        orelse = ["else:", *inner()] if draw(st.booleans()) else []
        return ["for x in xs:", *inner(True), *orelse]
    if kind == "while":
        return ["while c():", *inner(True)]
    if kind == "while_true":
        return ["while True:", *inner(True)]
    if kind == "with":
        return ["with m():", *inner()]
    handlers = draw(st.sampled_from([["except E:"], ["except Exception:"], ["except E:", "except:"]]))
    lines = ["try:", *inner()]
    for handler in handlers:
        lines += [handler, *inner()]
    if draw(st.booleans()):
        lines += ["else:", *inner()]
    if kind == "try_finally":
        lines += ["finally:", *inner()]
    return lines


@st.composite
def _programs(draw) -> cst.FunctionDef:
    lines = draw(_block(0, False, [0]))
    function = cst.parse_module("def f():\n" + "\n".join(_indented(lines)) + "\n").body[0]
    assume(len(_calls(function)) >= 2)
    return function


def _calls(function: cst.FunctionDef) -> dict[str, cst.SimpleStatementLine]:
    """``s0()``, ``s1()``... by name, each the line that holds it."""
    found = {}
    for node in descendants(function):
        if isinstance(node, cst.SimpleStatementLine) and isinstance(node.body[0], cst.Expr):
            name = node.body[0].value.func.value
            if name.startswith("s"):
                found[name] = node
    return found


# every run of a program


def _runs(function: cst.FunctionDef, exceptions: bool) -> list[tuple]:
    """Each way ``function`` can run, as its events: ``("s", node)`` for a statement run (a
    loop's header each time it is tested), ``("break", loop)``, ``("raised out of", loop)``, and
    at the end ``("end",)``, ``("raised",)``, or ``("cut",)`` where a loop went round too often to follow."""
    count = [0]

    def grow(runs: list) -> list:
        count[0] += len(runs)
        if count[0] > _MOST_RUNS:
            raise _TooMany
        return runs

    def node(statement, catching: bool) -> list[tuple[tuple, str]]:
        """Running a node: it goes on, or raises where it stands in a try body."""
        ran = (("s", id(statement)),)
        return [(ran, "normal")] + ([(ran, "raise")] if catching and exceptions else [])

    def then(runs: list, rest) -> list:
        out = []
        for events, how in runs:
            if how == "normal":
                out += [(events + more, onward) for more, onward in rest()]
            else:
                out.append((events, how))
        return grow(out)

    def block(statements, catching: bool) -> list:
        runs = [((), "normal")]
        for statement in statements:
            runs = then(runs, lambda s=statement: one(s, catching))
        return runs

    def body(suite, catching: bool) -> list:
        if isinstance(suite, cst.IndentedBlock):
            return block(suite.body, catching)
        return line(suite, suite.body, catching)

    def line(statement, smalls, catching: bool) -> list:
        ran = (("s", id(statement)),)
        jump = next((type(s) for s in smalls if type(s) in (cst.Return, cst.Break, cst.Continue, cst.Raise)), None)
        how = {cst.Return: "return", cst.Break: "break", cst.Continue: "continue", cst.Raise: "raise", None: "normal"}[jump]
        return [(ran, how)] + ([(ran, "raise")] if catching and exceptions and how != "raise" else [])

    def one(statement, catching: bool) -> list:
        kind = type(statement)
        if kind is cst.SimpleStatementLine:
            return line(statement, statement.body, catching)
        if kind is cst.If:
            def arms():
                other = statement.orelse
                rest = one(other, catching) if isinstance(other, cst.If) else \
                    body(other.body, catching) if isinstance(other, cst.Else) else [((), "normal")]
                return grow(body(statement.body, catching) + rest)
            return then(node(statement, catching), arms)
        if kind in (cst.For, cst.While):
            return loop(statement, catching)
        if kind is cst.With:
            return then(node(statement, catching), lambda: body(statement.body, catching))
        if kind is cst.Try:
            return attempt(statement, catching)
        return node(statement, catching)

    def loop(statement, catching: bool) -> list:
        endless = isinstance(statement, cst.While) and cst.Module([]).code_for_node(statement.test) == "True"
        done = []

        def rounds(left: int) -> list:
            """From a test of the loop's header on."""
            out = []
            for events, how in node(statement, catching):
                if how != "normal":
                    out.append((events + (("raised out of", id(statement)),), how))
                    continue
                if not endless:  # the test fails: the loop's else, then on
                    tail = body(statement.orelse.body, catching) if statement.orelse is not None else [((), "normal")]
                    out += [(events + more, how) for more, how in tail]
                if left == 0:  # cut off here: what it did so far still counts
                    out.append((events + (("cut",),), "cut"))
                    continue
                for more, how in body(statement.body, catching):
                    if how in ("normal", "continue"):
                        out += [(events + more + again, onward) for again, onward in rounds(left - 1)]
                    elif how == "break":
                        out.append((events + more + (("break", id(statement)),), "normal"))
                    elif how == "raise":
                        out.append((events + more + (("raised out of", id(statement)),), how))
                    else:
                        out.append((events + more, how))
            return grow(out)

        done += rounds(_ROUNDS)
        return done

    def attempt(statement: cst.Try, catching: bool) -> list:
        finally_catching = catching or statement.finalbody is not None
        out = []
        for events, how in then(node(statement, catching), lambda: block(statement.body.body, True)):
            if how == "raise" and events[-1] != ("s", id(statement)):
                for handler in statement.handlers:
                    caught = then(node(handler, False), lambda h=handler: body(h.body, finally_catching))
                    out += [(events + more, onward) for more, onward in caught]
                catch_all = any(h.type is None or cst.Module([]).code_for_node(h.type) in ("Exception", "BaseException")
                                for h in statement.handlers)
                if not catch_all:
                    out.append((events, how))
            elif how == "normal" and statement.orelse is not None:
                out += [(events + more, onward) for more, onward in body(statement.orelse.body, finally_catching)]
            else:
                out.append((events, how))
        if statement.finalbody is None:
            return grow(out)
        final = []
        for events, how in out:
            if how == "cut":
                final.append((events, how))
                continue
            for more, onward in body(statement.finalbody.body, catching):
                final.append((events + more, how if onward == "normal" else onward))
        return grow(final)

    runs = block(function.body.body, False)
    ends = {"raise": (("raised",),), "cut": ()}
    return [events + ends.get(how, (("end",),)) for events, how in runs]


def _after(runs: list[tuple], source, within) -> list[tuple]:
    """What each run does after each time ``source`` runs, up to the end of that iteration of
    ``within`` (the function, for None), that end included: ``("ended",)`` where an exception
    ended it (no way on), ``("cut",)`` where the run was cut off."""
    found = []
    for events in runs:
        for at, event in enumerate(events):
            if event != ("s", id(source)):
                continue
            rest = []
            for later in events[at + 1:]:
                if later in (("raised",), ("raised out of", id(within))):
                    rest.append(("ended",))
                    break
                rest.append(later)
                if later in (("end",), ("s", id(within)), ("break", id(within))):
                    break
            found.append(tuple(rest))
    return found


def _reaches(rest: tuple, targets) -> bool:
    return any(event in {("s", id(t)) for t in targets} for event in rest)


def _passes(rest: tuple, targets, through) -> bool:
    wanted = {("s", id(t)) for t in targets}
    for at, event in enumerate(rest):
        if event in wanted:
            return False
        if event[0] == "s" and id(through) == event[1] and any(later in wanted for later in rest[at + 1:]):
            return True
    return False


@st.composite
def _questions(draw):
    function = draw(_programs())
    calls = _calls(function)
    names = sorted(calls)
    source = calls[draw(st.sampled_from(names))]
    targets = [calls[name] for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))]
    through = calls[draw(st.sampled_from(names))]
    graph = Graph(function)
    within = draw(st.sampled_from([None, *graph.loops_around(source)]))
    return function, source, targets, through, within


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(_questions(), st.booleans())
def test_the_graph_answers_what_every_run_does(question, exceptions):
    function, source, targets, through, within = question
    try:
        runs = _runs(function, exceptions)
    except _TooMany:
        assume(False)
    afters = _after(runs, source, within)
    assume(afters)  # the source runs at all
    graph = Graph(function, exceptions=exceptions)
    # a run cut off before the target may have reached it later: only the others can say "no"
    always = source in targets or all(_reaches(rest, targets) or rest[-1:] in ((("cut",),), (("ended",),)) for rest in afters)
    has_finally = any(isinstance(node, cst.Finally) for node in descendants(function))
    code = cst.Module([]).code_for_node(function)
    if has_finally:  # the graph lets a `finally` go on to any place its `try` might: it may only say "no" more
        assert always or not graph.always_reaches(source, targets, within), code
    else:
        assert graph.always_reaches(source, targets, within) == always, code
        passes = any(_passes(rest, targets, through) for rest in afters)
        assert graph.may_pass(source, targets, lambda node: node is through, within) == passes, code


# the shapes of a training step, by name


def _graph(source: str, exceptions: bool = True) -> tuple[Graph, dict[str, cst.SimpleStatementLine], list]:
    function = cst.parse_module(textwrap.dedent(source)).body[0]
    loops = [node for node in descendants(function) if isinstance(node, (cst.For, cst.While))]
    return Graph(function, exceptions=exceptions), _calls(function), loops


def test_a_step_under_the_accumulation_boundary_does_not_always_follow():
    graph, calls, (loop,) = _graph("""
        def f():
            for x in xs:
                s0()
                if c():
                    s1()
    """)
    assert not graph.always_reaches(calls["s0"], [calls["s1"]], loop)
    last, edge = graph.way_out(calls["s0"], [calls["s1"]], loop)
    assert last is not None and edge.value == "normal"


def test_a_continue_of_an_inner_loop_stays_in_the_iteration():
    graph, calls, (outer, inner) = _graph("""
        def f():
            for x in xs:
                s0()
                for p in ps:
                    if c():
                        continue
                    s1()
                s2()
    """)
    assert graph.always_reaches(calls["s0"], [calls["s2"]], outer)
    last, edge = graph.way_out(calls["s0"], [calls["s1"]], outer)
    assert edge.value == "normal"  # the inner loop may not run


def test_a_continue_of_the_loop_itself_leaves_the_iteration():
    graph, calls, (loop,) = _graph("""
        def f():
            for x in xs:
                s0()
                if c():
                    continue
                s1()
    """)
    last, edge = graph.way_out(calls["s0"], [calls["s1"]], loop)
    assert edge.value == "jump" and isinstance(last, cst.SimpleStatementLine)


@pytest.mark.parametrize("handler, always", [("        pass\n", False), ("        raise\n", True)])
def test_an_exception_caught_within_the_iteration_skips_the_rest(handler, always):
    source = ("def f():\n    for x in xs:\n        try:\n            s0()\n            s1()\n"
              f"        except E:\n    {handler}")
    graph, calls, (loop,) = _graph(source)
    assert graph.always_reaches(calls["s0"], [calls["s1"]], loop) is always
    assert Graph(graph.root, exceptions=False).always_reaches(calls["s0"], [calls["s1"]], loop)


def test_an_exception_that_ends_the_loop_is_not_a_way_on():
    graph, calls, (loop,) = _graph("""
        def f():
            try:
                for x in xs:
                    s0()
                    s1()
            except KeyboardInterrupt:
                s2()
    """)
    assert graph.always_reaches(calls["s0"], [calls["s1"]], loop)


def test_a_loop_left_only_by_a_break():
    graph, calls, loops = _graph("""
        def f():
            s0()
            while True:
                if c():
                    break
            s1()
    """)
    assert graph.always_reaches(calls["s0"], [calls["s1"]])
    graph, calls, loops = _graph("""
        def f():
            s0()
            while c():
                pass
            s1()
    """)
    assert graph.always_reaches(calls["s0"], [calls["s1"]])


def test_a_step_in_every_arm_always_follows():
    graph, calls, (loop,) = _graph("""
        def f():
            for x in xs:
                s0()
                if c():
                    s1()
                elif d():
                    s2()
                else:
                    s3()
    """)
    assert graph.always_reaches(calls["s0"], [calls["s1"], calls["s2"], calls["s3"]], loop)
    assert not graph.always_reaches(calls["s0"], [calls["s1"], calls["s2"]], loop)


def test_a_nested_function_is_not_run_where_it_stands():
    graph, calls, _ = _graph("""
        def f():
            s0()
            def g():
                return
            s1()
    """)
    assert graph.always_reaches(calls["s0"], [calls["s1"]])
    assert not graph.holds(calls["s1"].body[0]) and graph.holds(calls["s1"])


def test_an_exception_a_handler_may_not_catch_goes_on_to_the_outer_one():
    graph, calls, (loop,) = _graph("""
        def f():
            for x in xs:
                try:
                    try:
                        s0()
                    except ValueError:
                        s2()
                    s1()
                except E:
                    continue
    """)
    assert not graph.always_reaches(calls["s0"], [calls["s1"], calls["s2"]], loop)
    graph, calls, (loop,) = _graph("""
        def f():
            for x in xs:
                try:
                    try:
                        s0()
                    except Exception:
                        s2()
                    s1()
                except E:
                    continue
    """)
    assert graph.always_reaches(calls["s0"], [calls["s1"], calls["s2"]], loop)


def test_a_jump_through_finally_goes_on_where_it_was_going():
    graph, calls, (loop,) = _graph("""
        def f():
            for x in xs:
                s0()
                try:
                    if c():
                        continue
                finally:
                    s1()
                s2()
    """, exceptions=False)
    assert graph.always_reaches(calls["s0"], [calls["s1"]], loop)
    last, edge = graph.way_out(calls["s0"], [calls["s2"]], loop)
    assert edge.value == "jump"
