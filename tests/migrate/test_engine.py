"""The engine: one parse for all rules, fixes by node identity, imports scheduled once, never a broken file."""
from __future__ import annotations

import builtins
import gc
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import (
    ExpressionContextProvider,
    ImportAssignment,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
    ScopeProvider,
)

from migrate.apex_plan import ApexPlanProvider
from migrate.engine import run_rules
from migrate.metadata import parents, resolve
from migrate.names import may_resolve_within, qualified_names
from migrate.rule import ImportChange, Rule, SkipFile
from migrate.rules.deprecated_cuda_autocast import DeprecatedCudaAutocast
from migrate.rules.deprecated_cuda_grad_scaler import DeprecatedCudaGradScaler
from migrate.tree_walk import _TOKEN_NAMES, children, walk_batched
from migrate.types import ERROR_CODE, INTERNAL_ERROR_CODE, Position, Safety

REPO = Path(__file__).resolve().parents[2]


class PrintCall(Rule):
    """Reports every ``print(...)`` call and has no fix: a report-only lint rule."""

    CODE = "TST001"
    MESSAGE = "print() in training code"

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == "print":
            self.report(node)


class RenameOld(Rule):
    """Renames the name ``old`` to ``new``; unsafe when the module says ``UNSAFE = True``."""

    CODE = "TST002"
    MESSAGE = "old is renamed new"

    def __init__(self, context=None) -> None:
        super().__init__(context)
        self.unsafe = False

    def visit_Assign(self, node: cst.Assign) -> None:
        if any(isinstance(t.target, cst.Name) and t.target.value == "UNSAFE" for t in node.targets):
            self.unsafe = True

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == "old":
            safety = Safety.UNSAFE if self.unsafe else Safety.SAFE
            self.report(node, replacement=node.with_changes(value="new"), safety=safety, fix_message="rename")


class WrapInList(Rule):
    """Replaces ``wrap(x)`` by ``[x]``: nests, so an inner fix must wait for the outer one."""

    CODE = "TST003"
    MESSAGE = "wrap() is a list"

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == "wrap" and len(node.args) == 1:
            self.report(node, replacement=cst.List([cst.Element(node.args[0].value)]))


class UseOsPath(Rule):
    """Replaces ``join(a, b)`` by ``os.path.join(a, b)``, scheduling ``import os`` and dropping ``from os.path import join``."""

    CODE = "TST004"
    MESSAGE = "use os.path.join"

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == "join":
            self.report(
                node,
                replacement=node.with_changes(func=cst.parse_expression("os.path.join")),
                add_imports=(ImportChange("os"),),
                remove_imports=(ImportChange("os.path", "join"),),
            )


class BreaksCode(Rule):
    """Replaces ``x = 1`` by a statement that parses with libcst but does not compile."""

    CODE = "TST005"
    MESSAGE = "x"

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if cst.Module([node]).code.strip() == "x = 1":
            self.report(node, replacement=cst.parse_statement("return 1\n"))


class Crashes(Rule):
    CODE = "TST006"
    MESSAGE = "x"

    def visit_Name(self, node: cst.Name) -> None:
        raise RuntimeError("boom")


class NeedsMarker(Rule):
    """Stops at once in files without a ``# marker`` comment, like a rule for files with no apex import."""

    CODE = "TST007"
    MESSAGE = "old name in a marked file"

    def visit_Module(self, node: cst.Module) -> None:
        if "# marker" not in node.code:
            raise SkipFile("no marker")

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == "old":
            self.report(node)


class NeverSettles(Rule):
    """Every round appends a statement: the engine must give up instead of looping."""

    CODE = "TST008"
    MESSAGE = "x"

    def visit_Module(self, node: cst.Module) -> None:
        self.report(node, replacement=node.with_changes(body=[*node.body, cst.parse_statement("y = 1\n")]))


class MarkInsteadOfDrop(Rule):
    """Replaces ``drop()`` by a ``pass`` carrying a comment: the shape of a removed statement with
    its TODO, where the block may or may not keep other statements."""

    CODE = "TST009"
    MESSAGE = "drop"

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if cst.Module([node]).code.strip() == "drop()":
            comment = cst.EmptyLine(comment=cst.Comment("# TODO: by hand"))
            self.report(node, replacement=cst.SimpleStatementLine([cst.Pass()], leading_lines=[*node.leading_lines, comment]))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # a statement follows: it takes the comments, no `pass`
        ("def f():\n    drop()\n    x = 1\n", "def f():\n    # TODO: by hand\n    x = 1\n"),
        ("drop()\n\nif x:\n    y = 1\n", "# TODO: by hand\n\nif x:\n    y = 1\n"),
        ("# kept\ndrop()\n# own\nx = 1\n", "# kept\n# TODO: by hand\n# own\nx = 1\n"),
        ("if x:\n    drop()\n    drop()\n    y = 1\n", "if x:\n    # TODO: by hand\n    # TODO: by hand\n    y = 1\n"),
        # the last or only statement of its block keeps the `pass` that holds the comments
        ("def f():\n    drop()\n", "def f():\n    # TODO: by hand\n    pass\n"),
        ("x = 1\ndrop()\n", "x = 1\n# TODO: by hand\npass\n"),
        # the user's own `pass` is never touched
        ("def f():\n    pass\n    x = 1\n", "def f():\n    pass\n    x = 1\n"),
    ],
)
def test_a_pass_a_fix_leaves_only_to_hold_comments_goes_where_a_statement_follows(source, expected):
    result = run_rules(source, "f.py", [MarkInsteadOfDrop])
    assert result.source == expected
    assert run_rules(result.source, "f.py", [MarkInsteadOfDrop]).source == result.source


class EmptyTheElse(Rule):
    """Replaces an ``if`` by itself with its ``else`` arm's ``drop()`` lines removed."""

    CODE = "TST010"
    MESSAGE = "drop in else"

    def visit_If(self, node: cst.If) -> None:
        if isinstance(node.orelse, cst.Else) and "drop()" in cst.Module([]).code_for_node(node.orelse):
            kept = [line for line in node.orelse.body.body if cst.Module([line]).code.strip() != "drop()"]
            self.report(node, replacement=node.with_changes(orelse=node.orelse.with_changes(body=node.orelse.body.with_changes(body=kept))))


@pytest.mark.parametrize(("source", "expected"), [
    ("if x:\n    a()\nelse:\n    drop()\nb()\n", "if x:\n    a()\nb()\n"),
    ("if x:\n    a()\nelse:\n    drop()\n    c()\n", "if x:\n    a()\nelse:\n    c()\n"),
])
def test_an_else_a_fix_empties_goes(source, expected):
    assert run_rules(source, "f.py", [EmptyTheElse]).source == expected


def test_nothing_to_do_returns_the_same_string():
    source = "import torch\r\n\r\nx = 1  # comment\r\n"
    result = run_rules(source, "f.py", [PrintCall, RenameOld, DeprecatedCudaAutocast])
    assert result.source is source
    assert result.diagnostics == () and result.error is None


def test_report_only_rule_reports_with_1_based_positions_and_no_fix():
    result = run_rules("x = 1\nif x:\n    print(x)\n", "f.py", [PrintCall])
    assert result.source == "x = 1\nif x:\n    print(x)\n"
    [d] = result.diagnostics
    assert (d.code, d.filename, d.location, d.end_location) == ("TST001", "f.py", Position(3, 5), Position(3, 13))
    assert d.fix is None and not d.applied


def test_all_rules_share_one_visit_and_fixes_from_several_rules_apply_together():
    source = "import torch\nold = torch.cuda.amp.GradScaler()\nprint(old)\n"
    result = run_rules(source, "f.py", [PrintCall, RenameOld, DeprecatedCudaGradScaler])
    assert result.source == 'import torch\nnew = torch.amp.GradScaler("cuda")\nprint(new)\n'
    assert sorted(d.code for d in result.diagnostics) == ["AMP021", "TST001", "TST002", "TST002"]
    assert {d.code for d in result.diagnostics if d.applied} == {"AMP021", "TST002"}


def test_unsafe_fixes_apply_only_when_asked():
    source = "UNSAFE = True\nold = 1\n"
    result = run_rules(source, "f.py", [RenameOld])
    assert result.source == source
    [d] = result.diagnostics
    assert d.fix.applicability is Safety.UNSAFE and not d.applied
    fixed = run_rules(source, "f.py", [RenameOld], unsafe_fixes=True)
    assert fixed.source == "UNSAFE = True\nnew = 1\n" and fixed.diagnostics[0].applied


def test_fix_false_reports_what_would_be_fixed_without_changing_anything():
    result = run_rules("old = 1\n", "f.py", [RenameOld], fix=False)
    assert result.source == "old = 1\n"
    assert result.diagnostics[0].applied


def test_nested_fixes_outermost_first_then_inner_in_a_later_round():
    source = "value = wrap(wrap(wrap(1)))\n"
    result = run_rules(source, "f.py", [WrapInList])
    assert result.source == "value = [[[1]]]\n"
    # positions are those of the original text: all three sites, as the user saw them
    assert [d.location.column for d in result.diagnostics] == [9, 14, 19]
    assert run_rules(result.source, "f.py", [WrapInList]).source == result.source


def test_imports_are_scheduled_once_and_unused_ones_removed():
    source = "from os.path import join\n\na = join('x', 'y')\nb = join('z', 'w')\n"
    result = run_rules(source, "f.py", [UseOsPath])
    assert result.source == "import os\n\na = os.path.join('x', 'y')\nb = os.path.join('z', 'w')\n"


def test_imports_still_used_elsewhere_are_kept():
    source = "from os.path import join\n\na = join('x', 'y')\nf = join\n"
    result = run_rules(source, "f.py", [UseOsPath])
    assert "from os.path import join\n" in result.source and "a = os.path.join('x', 'y')" in result.source


def test_comments_above_a_removed_import_are_kept():
    source = (
        "import sys\n# from posixpath import join  (the old spelling)\nfrom os.path import join\nimport re\n\n"
        "def f():\n    # joined here\n    from os.path import join\n    return join('x', 'y')\n"
        "# last\nfrom os.path import join\n"
    )
    result = run_rules(source, "f.py", [UseOsPath])
    assert result.source == (
        "import sys\n# from posixpath import join  (the old spelling)\nimport re\nimport os\n\n"
        "def f():\n    # joined here\n    return os.path.join('x', 'y')\n# last\n"
    )


def test_a_block_an_import_removal_empties_goes_with_its_comments():
    source = "import sys\nif sys.flags.debug:\n    # only here\n    from os.path import join\nx = join('a', 'b')\n"
    result = run_rules(source, "f.py", [UseOsPath])
    assert result.source == "import sys\nimport os\nx = os.path.join('a', 'b')\n"


def test_output_that_does_not_compile_is_discarded_with_an_internal_error():
    source = "x = 1\nold = 2\n"
    result = run_rules(source, "f.py", [BreaksCode, RenameOld])
    assert result.source is source
    assert result.diagnostics[0].code == INTERNAL_ERROR_CODE
    assert "does not compile" in result.error
    assert not any(d.applied for d in result.diagnostics)


def test_a_crashing_rule_leaves_the_file_untouched():
    result = run_rules("old = 1\n", "f.py", [Crashes, RenameOld])
    assert result.source == "old = 1\n"
    assert result.diagnostics[0].code == INTERNAL_ERROR_CODE
    assert "TST006 (Crashes.visit_Name) crashed at line 1: RuntimeError: boom" in result.error


def test_skip_file_stops_only_the_rule_that_raised_it():
    result = run_rules("old = 1\nprint(old)\n", "f.py", [NeedsMarker, PrintCall])
    assert [d.code for d in result.diagnostics] == ["TST001"]
    marked = run_rules("# marker\nold = 1\n", "f.py", [NeedsMarker])
    assert [d.code for d in marked.diagnostics] == ["TST007"]


def test_fixes_that_never_settle_are_abandoned():
    result = run_rules("x = 0\n", "f.py", [NeverSettles])
    assert result.source == "x = 0\n"
    assert result.diagnostics[0].code == INTERNAL_ERROR_CODE and "did not settle" in result.error


def test_syntax_error_is_a_file_error_at_its_line():
    result = run_rules("x = 1\ndef f(:\n    pass\n", "bad.py", [RenameOld])
    [d] = result.diagnostics
    assert d.code == ERROR_CODE and d.location.row == 3 and "cannot parse" in d.message
    assert result.source == "x = 1\ndef f(:\n    pass\n"


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_line_endings_and_comments_elsewhere_are_kept(newline):
    source = newline.join(["import torch  # keep me", "", "# and me", "s = torch.cuda.amp.GradScaler()", ""])
    result = run_rules(source, "f.py", [DeprecatedCudaGradScaler])
    assert result.source == source.replace("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cuda")')


class DropApexThenFlag(Rule):
    """Removes ``import apex``; once it is gone (a later round, whose text no longer says apex),
    turns ``flag = 1`` into ``flag = 2``."""

    CODE = "TST010"
    MESSAGE = "x"
    TRIGGERS = ("apex",)

    def visit_Module(self, node: cst.Module) -> None:
        self.imports_apex = "import apex" in node.code

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if cst.Module([node]).code.strip() == "import apex":
            self.report(node, replacement=cst.RemoveFromParent())
        elif cst.Module([node]).code.strip() == "flag = 1" and not self.imports_apex:
            self.report(node, replacement=cst.parse_statement("flag = 2\n"))


def test_rules_chosen_by_trigger_words_keep_running_in_later_rounds():
    result = run_rules("import apex\nflag = 1\n", "f.py", [DropApexThenFlag])
    assert result.source == "flag = 2\n"


class TodoComments(Rule):
    """Reports each ``# TODO(x)`` comment; has work only in a round whose text holds one."""

    CODE = "TST011"
    MESSAGE = "x"
    comments_visited = 0

    @classmethod
    def has_work_in(cls, text: str) -> bool:
        return "TODO(x)" in text

    def visit_Comment(self, node: cst.Comment) -> None:
        type(self).comments_visited += 1
        if node.value.startswith("# TODO(x)"):
            self.report(node)


class LeaveTodo(Rule):
    """Rewrites ``old = 1`` as ``new = 1`` with a ``# TODO(x)`` comment."""

    CODE = "TST012"
    MESSAGE = "x"

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if cst.Module([node]).code.strip() == "old = 1":
            self.report(node, replacement=cst.parse_statement("new = 1  # TODO(x): check\n"))


def test_a_round_without_a_rules_text_is_walked_without_it():
    TodoComments.comments_visited = 0
    result = run_rules("y = 1  # a comment\nprint(y)  # another\n", "f.py", [TodoComments, PrintCall])
    assert [d.code for d in result.diagnostics] == ["TST001"]
    assert TodoComments.comments_visited == 0  # the walk met no comment: it left the tokens out
    # the text a fix writes brings the rule into the next round
    fixed = run_rules("old = 1\n", "f.py", [TodoComments, LeaveTodo])
    assert fixed.source == "new = 1  # TODO(x): check\n"
    assert [(d.code, d.location) for d in fixed.remaining] == [("TST011", Position(1, 10))]


class OnlyWithApex(Rule):
    """Reports every name, but only claims files that mention ``apex`` as a word."""

    CODE = "TST009"
    MESSAGE = "x"
    TRIGGERS = ("apex",)

    def visit_Name(self, node: cst.Name) -> None:
        self.report(node)


def test_rules_visit_only_files_holding_one_of_their_trigger_words():
    assert run_rules("apex = 1\n", "f.py", [OnlyWithApex]).diagnostics[0].code == "TST009"
    # a word or part of a snake_case name, in any case; not a part of another word
    assert run_rules("HAS_APEX = 1\n", "f.py", [OnlyWithApex]).diagnostics[0].code == "TST009"
    assert run_rules("capex = apexify = 1\n", "f.py", [OnlyWithApex, PrintCall]).diagnostics == ()
    assert [d.code for d in run_rules("x = 1\nprint(x)\n", "f.py", [OnlyWithApex, PrintCall]).diagnostics] == ["TST001"]


def test_remaining_findings_are_located_in_the_fixed_text():
    source = "from os.path import join\na = join('x', 'y')\nprint(a)\n"
    result = run_rules(source, "f.py", [UseOsPath, PrintCall])
    assert result.source == "import os\n\na = os.path.join('x', 'y')\nprint(a)\n"
    [before] = [d for d in result.diagnostics if d.code == "TST001"]
    [after] = result.remaining
    assert (after.code, before.location.row, after.location.row) == ("TST001", 3, 4)
    assert not after.applied


def test_added_imports_follow_the_files_line_endings():
    source = "from torch.cuda.amp import GradScaler\r\n\r\nscaler = GradScaler()\r\n"
    result = run_rules(source, "f.py", [DeprecatedCudaGradScaler])
    assert result.source == 'import torch\r\n\r\nscaler = torch.amp.GradScaler("cuda")\r\n'


class ParentOfName(Rule):
    """Reports each name with the kind of node holding it (reads ``ParentNodeProvider``)."""

    CODE = "TST010"
    MESSAGE = "x"
    METADATA_DEPENDENCIES = (*Rule.METADATA_DEPENDENCIES, ParentNodeProvider)

    def visit_Name(self, node: cst.Name) -> None:
        self.report(node, type(self.get_metadata(ParentNodeProvider, node)).__name__)


_EVERY_KIND_OF_NODE = '''\
from __future__ import annotations
import a.b as c, d
from .x import (y as z, w,)
@dec(1)
async def f(a, /, b: int = 1, *args: str, c, d=2, **kw) -> "T":
    global g
    async with x as (p, q), y:
        async for i in aiter():
            await i
    h = lambda a, *b, c=1, **d: (yield)
    return [x async for x in y if x] + {k: v for k, v in z.items()} + {*s} + (t for t in u)
class C[T](Base, metaclass=M):
    x: int = 1
    def g[U: int, *Ts, **P](self) -> None: ...
type Alias[T] = list[T]
match cmd:
    case [1, 2, *rest] if rest:
        pass
    case {"k": v, **others}:
        pass
    case Point(x=0, y=_) | Other() as o:
        pass
try:
    pass
except* (ValueError, TypeError) as eg:
    raise X from Y
finally:
    del a[1:2:3], b.c
while (n := next(it)) is not None:
    assert n, "m"
x = f"{a!r:>{w}} {b=}" "implicit" 'concat'
y = a if b else c; z = not a and b or c; q = a @ b; r = ~a ** -b // c % d << e >> f & g | h ^ i
x += 1; x[...] = ...; print(*a, **b)
with (open(a) as b, open(c) as d):
    pass
'''


def test_the_parent_map_is_libcsts_for_every_node():
    module = cst.parse_module(_EVERY_KIND_OF_NODE)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    found = parents(module)
    assert len(found) == len(expected) > 500
    assert all(found[node] is parent for node, parent in expected.items())


class AsksParentsAround(Rule):
    """Asks, of each node of some kinds it visits, the parent of the node, of each node below it,
    and of a node elsewhere in the tree; and at the end of the walk, of every node."""

    CODE = "TST012"
    METADATA_DEPENDENCIES = (*Rule.METADATA_DEPENDENCIES, ParentNodeProvider)

    def __init__(self, context=None) -> None:
        super().__init__(context)
        self.answers: list[tuple[cst.CSTNode, cst.CSTNode | None]] = []

    def _ask(self, node: cst.CSTNode) -> None:
        for asked in [node, *_below(node), self._elsewhere]:
            self.answers.append((asked, self.get_metadata(ParentNodeProvider, asked, None)))

    def visit_Module(self, node: cst.Module) -> None:
        self._elsewhere = node.body[-1].body.body[0]  # a node the walk has not reached

    def leave_Module(self, original_node: cst.Module) -> None:
        self._ask(original_node)

    visit_Name = visit_Call = visit_Attribute = visit_SimpleStatementLine = visit_If = visit_IndentedBlock = _ask
    visit_FunctionDef = visit_Arg = visit_Param = visit_Subscript = visit_Comparison = visit_Comment = _ask


def _below(node: cst.CSTNode) -> list[cst.CSTNode]:
    found, pending = [], list(children(node))
    while pending:
        found.append(pending.pop())
        pending.extend(children(found[-1]))
    return found


def test_parents_read_during_the_walk_are_libcsts():
    module = cst.parse_module(_EVERY_KIND_OF_NODE)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    rule = AsksParentsAround()
    rule.metadata = resolve(MetadataWrapper(module, unsafe_skip_copy=True), [rule], {})
    walk_batched(module, [rule], path=rule.metadata[ParentNodeProvider].path)
    assert len(rule.answers) > 2_000
    assert all(parent is expected.get(node) for node, parent in rule.answers)


def test_rules_read_each_names_parent():
    result = run_rules("import torch\nclass Net(torch.nn.Module):\n    pass\n", "f.py", [ParentOfName])
    assert [d.message for d in result.diagnostics] == ["ImportAlias", "ClassDef", "Attribute", "Attribute", "Attribute"]


def test_a_rule_visits_with_its_own_and_inherited_methods_only():
    class WrapAndPrint(WrapInList):
        def visit_Name(self, node: cst.Name) -> None:
            pass

    assert sorted(WrapAndPrint().get_visitors()) == ["visit_Call", "visit_Name"]


class ReadsEveryProvider(Rule):
    CODE = "TST011"
    METADATA_DEPENDENCIES = (PositionProvider, ParentNodeProvider, ExpressionContextProvider, ApexPlanProvider)


_APEX_SCRIPT = """\
from apex import amp
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
with amp.scale_loss(loss, optimizer) as scaled_loss:
    scaled_loss.backward()
optimizer.step()
"""


@pytest.mark.parametrize(("source", "planned"), [(_EVERY_KIND_OF_NODE, False), (_APEX_SCRIPT, True)])
def test_the_engine_resolves_the_metadata_libcst_would(source, planned):
    module = cst.parse_module(source)
    ours, theirs = ReadsEveryProvider(), ReadsEveryProvider()
    ours.metadata = resolve(MetadataWrapper(module, unsafe_skip_copy=True), [ours], {})
    theirs.metadata = MetadataWrapper(module, unsafe_skip_copy=True).resolve_many(theirs.get_inherited_dependencies())
    assert ours.metadata.keys() == theirs.metadata.keys()
    nodes = [module, *parents(module)]
    for provider in (PositionProvider, ParentNodeProvider, ExpressionContextProvider):
        assert [ours.get_metadata(provider, n, None) for n in nodes] == [theirs.get_metadata(provider, n, None) for n in nodes]
    for node in nodes:  # local names resolve to nothing a rule asks about: see the next test
        found = [{(q.name, q.source) for q in side.get_metadata(QualifiedNameProvider, node, set())
                  if q.source is not QualifiedNameSource.LOCAL} for side in (ours, theirs)]
        assert found[0] == found[1] or _token(node)
    assert _scopes(ours.metadata[ScopeProvider], nodes) == _scopes(theirs.metadata[ScopeProvider], nodes)
    outsider = cst.Name("x")  # not in the tree: no metadata
    assert [side.get_metadata(QualifiedNameProvider, outsider, "none") for side in (ours, theirs)] == ["none", "none"]
    plans = [side.get_metadata(ApexPlanProvider, module).findings for side in (ours, theirs)]
    summary = [[(f.code, f.node, f.message, f.safety, _code(module, f.replacement)) for f in plan] for plan in plans]
    assert summary[0] == summary[1] and bool(summary[0]) is planned


@pytest.mark.parametrize("path", sorted([*(REPO / "fixtures" / "legacy").rglob("*.py"), *(REPO / "fixtures" / "corpus").glob("*.py")]),
                         ids=lambda path: path.name)
def test_scopes_are_libcsts_on_real_shapes(path):
    module = cst.parse_module(path.read_text(encoding="utf-8"))
    ours = resolve(MetadataWrapper(module, unsafe_skip_copy=True), [ReadsEveryProvider()], {})
    theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve_many([ScopeProvider, ExpressionContextProvider, QualifiedNameProvider])
    nodes = [module, *parents(module)]
    assert _scopes(ours[ScopeProvider], nodes) == _scopes(theirs[ScopeProvider], nodes)
    assert dict(ours[ExpressionContextProvider]) == dict(theirs[ExpressionContextProvider])
    assert _resolved(ours, nodes) == _resolved(theirs, nodes)


def test_names_resolve_as_with_libcst_on_every_kind_of_node():
    source = _EVERY_KIND_OF_NODE + "import torch.cuda.amp\nfrom apex import amp as A\nA.initialize(len(x))[0].y\ntorch.cuda.amp.autocast()\n"
    module = cst.parse_module(source)
    ours = resolve(MetadataWrapper(module, unsafe_skip_copy=True), [ReadsEveryProvider()], {})
    theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve_many([QualifiedNameProvider])
    nodes = [module, *parents(module)]
    found = _resolved(ours, nodes)
    assert found == _resolved(theirs, nodes)
    assert {"apex.amp.initialize", "builtins.len", "torch.cuda.amp.autocast", "a.b", "d"} <= set().union(*found)


def test_local_names_are_answered_by_their_scope_without_linking_each_use_to_each_assignment():
    # A notebook exported as a script: each cell assigns and uses the same names again.
    cell = "model = Net()\nloss = model(x).sum()\nloss.backward()\nprint(loss.item())\n"
    module = cst.parse_module("import torch\nfrom typing import cast\n" + cell * 50 + "y = cast(int, torch.zeros(1))\n")
    reader = ReadsEveryProvider()
    reader.metadata = resolve(MetadataWrapper(module, unsafe_skip_copy=True), [reader], {})
    scope = reader.metadata[ScopeProvider][module]
    assert not scope.accesses["model"] and not scope.accesses["loss"]  # libcst links each use to all 50 assignments
    assert len(scope.accesses["print"]) == 50 and len(scope.accesses["torch"]) == 1
    cast = module.body[-1].body[0].value.func
    model = module.body[3].body[0].value.func.value.func  # `model` of the first `model(x).sum()`
    assert {(q.name, q.source) for q in reader.get_metadata(QualifiedNameProvider, cast)} == {
        ("typing.cast", QualifiedNameSource.IMPORT)}
    assert {(q.name, q.source) for q in reader.get_metadata(QualifiedNameProvider, model)} == {
        ("model", QualifiedNameSource.LOCAL)}
    assert qualified_names(reader, model) == frozenset()


def test_a_name_imported_in_every_cell_resolves_with_each_imports_names_worked_out_once(monkeypatch):
    calls = []
    names_of = ImportAssignment.get_qualified_names_for
    monkeypatch.setattr(ImportAssignment, "get_qualified_names_for", lambda self, name: calls.append(self) or names_of(self, name))
    module = cst.parse_module("import torch\nx = torch.zeros(1)\ny = torch.ones(1)\n" * 40)
    reader = ReadsEveryProvider()
    reader.metadata = resolve(MetadataWrapper(module, unsafe_skip_copy=True), [reader], {})
    uses = [line.body[0].value.func for line in module.body if isinstance(line.body[0], cst.Assign)]
    assert [qualified_names(reader, use) for use in uses] == [frozenset({"torch.zeros"}), frozenset({"torch.ones"})] * 40
    # Each import asked once per dotted name (`torch.zeros`, `torch.ones`); libcst asked every import
    # seen at each use, in the scope analysis (for `typing.cast`) and again for each answer: 1,640 + 3,200.
    assert len(calls) == 2 * 40


def test_the_scope_analysis_finds_the_libcst_internals_it_trims():
    # Without them it would still be right, and quadratic again: a libcst upgrade must say so here.
    from migrate.metadata import _LeanScopes, _LeanScopeVisitor

    visitor = _LeanScopeVisitor(_LeanScopes())
    assert None not in visitor._stacks and isinstance(visitor._ScopeVisitor__deferred_accesses, list)


_PACKAGES = [("apex",), ("torch",), ("apex", "amp_C", "apex_C"), ("builtins",), ("numpy", "os")]


@pytest.mark.parametrize("path", sorted([*(REPO / "fixtures" / "legacy").rglob("*.py"), *(REPO / "fixtures" / "corpus").glob("*.py")]),
                         ids=lambda path: path.name)
def test_a_name_said_not_to_come_from_a_package_resolves_to_none_of_its_names(path):
    source = path.read_text(encoding="utf-8") + "import numpy as np, os.path\nfrom . import apex\nnp.mean(os.path.join(apex.x))\nlen(x)\n"
    module = cst.parse_module(source)
    reader = ReadsEveryProvider()
    reader.metadata = resolve(MetadataWrapper(module, unsafe_skip_copy=True), [reader], {})
    for node in (node for node in [module, *parents(module)] if not _token(node)):
        names = qualified_names(reader, node)
        for packages in _PACKAGES:
            if not may_resolve_within(reader, node, packages):
                assert not any(name.split(".")[0] in packages for name in names), (packages, names)
    mean = module.body[-2].body[0].value.func  # the test spares the lookups it can
    assert [may_resolve_within(reader, mean, packages) for packages in _PACKAGES] == [False, False, False, False, True]


def _resolved(metadata, nodes: list[cst.CSTNode]) -> list[frozenset[str]]:
    """What ``migrate.names.qualified_names`` gives each node (its import and builtin names), punctuation and whitespace aside."""
    reader = ReadsEveryProvider()
    reader.metadata = {QualifiedNameProvider: metadata[QualifiedNameProvider]}
    return [qualified_names(reader, node) for node in nodes if not _token(node)]


def _token(node: cst.CSTNode) -> bool:
    return type(node).__name__ in _TOKEN_NAMES


def _scopes(scope_of, nodes: list[cst.CSTNode]) -> list:
    """Each node's scope (punctuation and whitespace aside: the engine's scope analysis reads
    the tree without them), and each scope's assignments and its accesses to names an import binds
    or a builtin has (the only ones the engine links), by node identity."""
    seen, summary = {}, []
    for node in nodes:
        if _token(node):
            continue
        scope = scope_of.get(node)
        summary.append((id(node), type(scope).__name__, id(getattr(scope, "node", None))))
        if scope is not None and id(scope) not in seen:
            seen[id(scope)] = scope
    imported = {a.name.split(".")[0] for scope in seen.values() for a in scope.assignments if isinstance(a, ImportAssignment)}
    for scope in sorted(seen.values(), key=lambda scope: id(getattr(scope, "node", None))):
        assignments = sorted((a.name, id(getattr(a, "node", None))) for a in scope.assignments)
        accesses = sorted((id(a.node), sorted(id(getattr(r, "node", None)) for r in a.referents))
                          for name, found in scope.accesses._accesses.items() for a in found
                          if name.split(".")[0] in imported or hasattr(builtins, name))
        summary.append((id(getattr(scope, "node", None)), assignments, accesses))
    return summary


def _code(module: cst.Module, replacement) -> str:
    if isinstance(replacement, cst.FlattenSentinel):
        return "".join(module.code_for_node(node) for node in replacement.nodes)
    return module.code_for_node(replacement) if isinstance(replacement, cst.CSTNode) else repr(replacement)


@pytest.mark.parametrize(
    "path",
    sorted(Path(__file__).resolve().parents[2].glob("fixtures/*/*.py")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_positions_are_libcsts(path):
    from libcst.metadata import MetadataWrapper, PositionProvider

    from migrate.positions import positions

    module = cst.parse_module(path.read_text(encoding="utf-8"))
    assert positions(module) == MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    crlf = cst.parse_module(path.read_text(encoding="utf-8").replace("\n", "\r\n"))
    assert positions(crlf) == MetadataWrapper(crlf, unsafe_skip_copy=True).resolve(PositionProvider)


def _apply_edits(text: str, edits) -> str:
    lines = text.splitlines(keepends=True)
    starts = [sum(len(line) for line in lines[:i]) for i in range(len(lines) + 1)]

    def offset(where):
        return starts[where.row - 1] + where.column - 1

    for edit in sorted(edits, key=lambda e: offset(e.location), reverse=True):
        text = text[: offset(edit.location)] + edit.content + text[offset(edit.end_location):]
    return text


def test_one_fix_alone_keeps_an_import_the_other_sites_still_use():
    source = "from os.path import join\n\na = join('x', 'y')\nb = join('z', 'w')\n"
    result = run_rules(source, "f.py", [UseOsPath], fix=False, edits=True)
    assert len(result.diagnostics) == 2
    for diagnostic in result.diagnostics:
        alone = _apply_edits(source, diagnostic.fix.edits)
        assert "import os\n" in alone and "from os.path import join\n" in alone  # added, and still there
        assert alone.count("os.path.join(") == 1


def test_one_fix_alone_that_leaves_an_import_unused_removes_it():
    source = "from os.path import join\n\na = join('x', 'y')\n"
    [diagnostic] = run_rules(source, "f.py", [UseOsPath], fix=False, edits=True).diagnostics
    assert _apply_edits(source, diagnostic.fix.edits) == run_rules(source, "f.py", [UseOsPath]).source


@pytest.mark.parametrize(
    "head",
    [
        "import os\n",
        '"""Doc."""\nimport os\n',
        "import os as o\n",
        "import os.path\n",
        "import sys, os\n",
        "x = 1\nimport os\n",
        "from os import path\n",
        "from os import *\n",
        "import sys\nfrom os import path as p\n",
        "from . import os\n",
        "'''a''' 'b'\nimport os\n",
        "",
    ],
)
@pytest.mark.parametrize("wanted", [ImportChange("os"), ImportChange("os", "path"), ImportChange("os", "path", "p")])
def test_an_import_already_there_is_recognised_as_libcst_would(head, wanted):
    # the engine skips libcst's AddImportsVisitor (a walk of the whole tree) when it would add nothing
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor

    from migrate.import_changes import already_imported

    module = cst.parse_module(head + "\ndef f():\n    return 1\n")
    context = CodemodContext(filename="f.py", full_module_name="pkg.f")
    AddImportsVisitor.add_needed_import(context, wanted.module, wanted.obj, wanted.asname)
    libcst_adds_nothing = AddImportsVisitor(context).transform_module(module).code == module.code
    ours = already_imported(module, wanted)
    if ours and not libcst_adds_nothing:  # an import after other code and before any use, where libcst does not look
        # (and `import os.path`, which binds `os` as `import os` does, where libcst adds `import os`)
        assert head in ("x = 1\nimport os\n", "'''a''' 'b'\nimport os\n") or (head, wanted) == ("import os.path\n", ImportChange("os"))
    elif ours != libcst_adds_nothing:  # only ever where a shortcut would be unsure
        assert head in ("import sys, os\n", "from os import *\n", "from . import os\n")


_TRAIN_LOOP = (
    'from apex import amp\n\n'
    'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
    'for x in loader:\n'
    '    loss = model(x)\n'
    '    with amp.scale_loss(loss, optimizer) as scaled_loss:\n'
    '        scaled_loss.backward()\n'
    '    optimizer.step()\n'
)


@pytest.mark.parametrize("head, added", [
    ('import os\nos.environ["OMP_NUM_THREADS"] = "1"\nimport torch\n', False),  # set before torch loads: kept so
    ('import os\nprint(torch)\nimport torch\n', True),  # used before that import
    ('import os\nif fast:\n    import torch\n', True),  # not at the top level
])
def test_a_later_import_at_the_top_level_serves_the_fixes_when_nothing_uses_the_name_before_it(head, added):
    source = head + _TRAIN_LOOP
    from migrate.api import migrate_source

    output = migrate_source(source, "train.py").new_source
    assert "torch.amp.GradScaler" in output
    assert output.startswith("import os\nimport torch\n") == added
    assert output.count("import torch\n") == head.count("import torch\n") + added


def test_a_native_file_saying_amp_is_linted_without_the_apex_planner():
    source = (
        "import torch\n"
        "scaler = torch.amp.GradScaler('cuda')\n"
        "for x, y in loader:\n"
        "    with torch.autocast('cuda'):\n"
        "        loss = model(x, y)\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(optimizer)\n"
        "    scaler.update()\n"
        "    print(loss.item())\n"
    )
    script = (
        "import sys\n"
        "from migrate.api import migrate_source\n"
        f"print([d.code for d in migrate_source({source!r}, 'train.py').diagnostics])\n"
        "print('migrate.apex_plan.planner' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.split("\n")[:2] == ["['AMP100']", "False"]


def test_the_edits_of_many_fixes_cost_no_import_scheduling_each(monkeypatch):
    # libcst's import visitors walk the whole tree (seconds on a large file): once per fix made
    # a JSON report of a large apex file take a minute and a half
    from libcst.codemod import ContextAwareTransformer

    calls = []
    original = ContextAwareTransformer.transform_module

    def counted(self, module):
        calls.append(type(self).__name__)
        return original(self, module)

    monkeypatch.setattr(ContextAwareTransformer, "transform_module", counted)
    source = "import os\nfrom os.path import join\n\n" + "".join(f"a{i} = join('x', '{i}')\n" for i in range(6))
    result = run_rules(source, "f.py", [UseOsPath], fix=False, edits=True)
    assert len(result.diagnostics) == 6 and all(d.fix.edits for d in result.diagnostics)
    assert calls == []
    assert run_rules(source, "f.py", [UseOsPath]).source.startswith("import os\n\na0 = os.path.join(")
    assert calls == []  # the rewrite itself: `join` is read nowhere after it, so no scope analysis either


def test_comments_above_one_of_several_removed_imports_are_kept():
    source = "import sys\nfrom os.path import join\n# the old one\nfrom os.path import join\nfrom os.path import join\nx = join('a', 'b')\n"
    result = run_rules(source, "f.py", [UseOsPath])
    assert result.error is None, result.error
    assert result.source == "import sys\n# the old one\nimport os\n\nx = os.path.join('a', 'b')\n"


def test_a_files_tree_is_freed_when_its_analysis_ends_without_the_cycle_collector():
    """libcst's scope analysis links scopes and assignments in cycles, and so did visitor classes
    made inside the apex planner's methods: cycles that held the file's tree until the cycle
    collector scanned it all, a tenth of a run over a tree. Every rule and the apex plan run, as
    on an apex training script. (A rewrite that removes imports runs libcst's own import remover,
    whose scopes are left to the collector.)"""
    from migrate.rules import select_rules

    source = (REPO / "fixtures" / "legacy" / "train_o1.py").read_text() + "\nTHIS_TESTS_MARKER = 1\n"
    rules = tuple(select_rules(["ALL"]))
    run_rules(source, "train.py", rules, fix=False)  # what is built once per process is built
    gc.collect()
    gc.disable()
    try:
        result = run_rules(source, "train.py", rules, fix=False)  # as --check and the linter run
        left = [o for o in gc.get_objects() if type(o) is cst.Module and "THIS_TESTS_MARKER" in o.code]
    finally:
        gc.enable()
    assert "AMP003" in {d.code for d in result.diagnostics}, "the apex plan was made"
    assert left == []


@pytest.mark.parametrize("head, added", [
    ("import torch.utils.data\n", False),
    ("import os, torch.nn.functional\n", False),
    ("import torch.nn as nn\n", True),  # binds `nn`, not `torch`
    ("from torch import nn\n", True),
    ("import torchvision.models\n", True),
])
def test_an_import_of_a_submodule_binds_the_package_and_no_import_torch_is_added(head, added):
    source = head + _TRAIN_LOOP
    from migrate.api import migrate_source

    output = migrate_source(source, "train.py").new_source
    assert "torch.amp.GradScaler" in output
    assert ("import torch\n" in output) is added, output
