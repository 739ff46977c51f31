"""The base of the rewrites that swap an apex class or function for its native counterpart."""
from __future__ import annotations

import textwrap
from typing import ClassVar, NamedTuple

import libcst as cst
from libcst.metadata import (
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

from migrate import apex_nodes as nodes
from migrate.importers import SETTING as IMPORTED_ELSEWHERE
from migrate.names import qualified_names
from migrate.rule import ImportChange, Rule
from migrate.tree_walk import descendants
from migrate.types import Safety


class NativeCall(NamedTuple):
    """How a call is rewritten: the new source of the call, its safety, and why (when unsafe)."""

    source: str
    safety: Safety = Safety.SAFE
    note: str = ""


class NoFix(NamedTuple):
    """Why a call (or reference) is only reported."""

    reason: str


def _listed(names) -> str:
    """Argument names for a message, sorted and each in backticks."""
    return ", ".join(f"`{name}`" for name in sorted(names))


def without_native(names) -> NoFix:
    """The report for apex-only arguments: they have no native counterpart to rewrite into."""
    return NoFix(f"{_listed(names)} {'has' if len(names) == 1 else 'have'} no native equivalent")


class ApexRename(Rule):
    """Finds every use of the apex names in ``TARGETS`` (resolved through imports) and rewrites it.

    A call goes through ``native_call``; a use that is not a call (``isinstance``, a base class,
    an alias) becomes ``REFERENCES[name]`` when there is one, and is reported otherwise. A class
    handed on as a value (``dict(sgd=FusedSGD)``, returned, passed) is reported too: the calls made
    with it are not seen. An alias (``impl = FusedSGD``) changes where each call through it is seen
    and taken by the native class as it is.

    A name that another file of the project imports from this one (``migrate.importers``) stays
    bound: its apex import becomes ``name = REFERENCES[target]``. Without a reference to bind it
    to, its uses are only reported, so that the import, and the other file, keep working.
    """

    TRIGGERS = ("apex",)
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ScopeProvider, ParentNodeProvider)
    # True: an unsafe fix changes how the model trains, and its line gets a TODO marker saying so
    MARK_UNSAFE: ClassVar[bool] = False
    TARGETS: ClassVar[tuple[str, ...]] = ()
    REFERENCES: ClassVar[dict[str, str]] = {}
    # True where a call of the native class may differ from the apex one (apex-only arguments, options
    # the rewrite adds): the class handed on as a value, its calls unseen, is then reported
    CALLS_UNSEEN_DIFFER: ClassVar[bool] = False

    def __init__(self, context=None) -> None:
        super().__init__(context)
        self._funcs: set[int] = set()
        self._in_import = 0
        self._module: cst.Module | None = None
        self._apex_imports: dict[str, list[ImportChange]] = {}  # the file's apex imports, by the name each binds
        self._pending: list[tuple[cst.CSTNode, str, NativeCall | NoFix]] = []  # decided once every use is known
        self._references: set[str] = set()  # targets also used outside calls
        self._exported = frozenset(self.context.settings.get(IMPORTED_ELSEWHERE, ()))
        self._exported_imports: dict[str, tuple[cst.ImportFrom, str]] = {}  # bound name -> its import, target

    def visit_Module(self, node: cst.Module) -> None:
        self._module = node
        self._apex_imports = nodes.apex_imports(node)

    def visit_Import(self, node: cst.Import) -> None:
        self._in_import += 1

    def leave_Import(self, original_node: cst.Import) -> None:
        self._in_import -= 1

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self._in_import += 1
        if not self._exported or isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            imported = nodes.apex_import(node, alias)
            if imported is not None and imported[0] in self._exported:
                bound, change = imported
                target = self._target_among(frozenset({f"{change.module}.{change.obj}"}))
                if target is not None:
                    self._exported_imports[bound] = (node, target)

    def leave_ImportFrom(self, original_node: cst.ImportFrom) -> None:
        self._in_import -= 1

    def _target(self, node: cst.CSTNode) -> str | None:
        # Only a name an apex import binds resolves to a target (every target is an apex name):
        # the others, nearly all of a file's, need no scope lookup.
        if self._in_import or nodes.root_name(node) not in self._apex_imports:
            return None
        target = self._target_among(qualified_names(self, node))
        if target is None or binds(self.get_metadata(ParentNodeProvider, node, None), node):
            return None
        return target

    def _target_among(self, names: frozenset[str]) -> str | None:
        """The target a use resolving to ``names`` is a use of."""
        return next((name for name in self.TARGETS if name in names), None)

    def visit_Call(self, node: cst.Call) -> None:
        target = self._target(node.func)
        if target is None:
            return
        self._funcs.add(id(node.func))
        self._pending.append((node, target, self.native_call(node, target)))

    # Asked of every name in the file by each of these rules: one whose root no apex import binds
    # is no target (``_target``), and is passed over before any other work.
    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self._apex_imports:
            self._reference(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if nodes.root_name(node) in self._apex_imports:
            self._reference(node)

    def _reference(self, node: cst.BaseExpression) -> None:
        if id(node) in self._funcs:
            return
        target = self._target(node)
        if target is None:
            return
        native = self.REFERENCES.get(target)
        if native is None:
            outcome: NativeCall | NoFix = NoFix("this use is not a call, and no single native name replaces it")
        else:
            outcome = self._as_base(node, target) or self._handed_on(node, target) or NativeCall(native)
        self._references.add(target)
        self._pending.append((node, target, outcome))

    def _as_base(self, node: cst.BaseExpression, target: str) -> NoFix | None:
        """Where ``node`` is a base of a class of the file: why it cannot change, when that class
        hands its base's ``__init__`` arguments the native class takes differently
        (``super().__init__(module, message_size=..., delay_allreduce=...)``)."""
        arg = self.get_metadata(ParentNodeProvider, node, None)
        owner = self.get_metadata(ParentNodeProvider, arg, None) if isinstance(arg, cst.Arg) else None
        if not (isinstance(owner, cst.ClassDef) and any(base is arg for base in owner.bases)):
            return None
        for call in _base_init_calls(owner, node):
            as_base = call.with_changes(func=node)
            outcome = self.native_call(as_base, target)
            if isinstance(outcome, NoFix):
                return NoFix(f"`{owner.name.value}` subclasses it, and its `__init__` hands the base what the native class "
                             f"cannot take: {outcome.reason}")
            native = cst.parse_expression(outcome.source)
            if not (isinstance(native, cst.Call) and nodes.code(native.with_changes(func=node)) == nodes.code(as_base)):
                return NoFix(f"`{owner.name.value}` subclasses it, and its `__init__` hands the base arguments the native "
                             "class takes differently")
        return None

    def _handed_on(self, node: cst.BaseExpression, target: str) -> NoFix | None:
        """Where ``node`` hands the class on as a value (``OPTIMIZERS = dict(sgd=FusedSGD)``, ``impl =
        FusedSGD``), the calls made with it are elsewhere: why it stays, unless it is a class check
        (``isinstance``), a base class, or bound to a name only ever called, each call one the
        native class takes as it is (nothing apex-only to drop, no option to add)."""
        arg = self.get_metadata(ParentNodeProvider, node, None)
        if not self.CALLS_UNSEEN_DIFFER or not isinstance(arg, (cst.Arg, cst.Assign, cst.AnnAssign, cst.Element, cst.DictElement, cst.Return)):
            return None  # `FusedSGD.__init__(self, ...)`, an attribute read: no value handed on
        holder = self.get_metadata(ParentNodeProvider, arg, None) if isinstance(arg, (cst.Arg, cst.Element)) else None
        if isinstance(arg, cst.Element) and isinstance(holder, cst.Tuple):  # isinstance(x, (A, B)): the call holding the tuple
            holder = self.get_metadata(ParentNodeProvider, self.get_metadata(ParentNodeProvider, holder, None), None)
        if isinstance(holder, cst.ClassDef) or (isinstance(holder, cst.Call) and nodes.call_name(holder) in ("isinstance", "issubclass")):
            return None
        calls = self._calls_through(node, arg)
        unseen = NoFix("it is handed on as a value here, and the calls made with it, elsewhere, may pass apex's own "
                       f"arguments, which `{self.REFERENCES[target]}` does not take the same way")
        if calls is None:
            return unseen
        for call in calls:
            outcome = self.native_call(call.with_changes(func=node), target)
            if isinstance(outcome, NoFix) or outcome.safety is not Safety.SAFE:
                return unseen
            native = cst.parse_expression(outcome.source)
            if not isinstance(native, cst.Call) or nodes.code(native.with_changes(func=node)) != nodes.code(call.with_changes(func=node)):
                return unseen
        return None

    def _calls_through(self, node: cst.BaseExpression, parent: cst.CSTNode | None) -> list[cst.Call] | None:
        """The calls made through the name ``node`` is assigned to (``impl = FusedSGD``, also beside
        ``impl = torch.optim.SGD``), where that name is used nowhere but as the callee of a call; else None."""
        if not (isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1
                and isinstance(parent.targets[0].target, cst.Name)):
            return None
        name = parent.targets[0].target.value
        assigned, uses, calls = set(), [], []  # `impl = ...` binds, reads nothing
        for n in descendants(self._module):
            if type(n) is cst.AssignTarget:
                assigned.add(id(n.target))
            elif type(n) is cst.Name and n.value == name:
                uses.append(n)
            elif type(n) is cst.Call and isinstance(n.func, cst.Name) and n.func.value == name:
                calls.append(n)
        uses = [n for n in uses if id(n) not in assigned]
        if len(uses) != len(calls) or any(nodes.has_star(call) for call in calls):
            return None
        return calls

    def leave_Module(self, original_node: cst.Module) -> None:
        """Uses of a name that is also referenced (``isinstance``, a base class) change together.

        An object built by the native class fails ``isinstance(x, ApexClass)``: where the file
        names the class outside calls, either every use is rewritten (with the least safe of their
        safeties) or none is. So do the uses of a name other files import from this one, and its import.
        """
        self._keep_exported_names()
        for node, target, outcome in self._pending:
            together = [o for _, t, o in self._pending if t == target] if target in self._references else [outcome]
            if any(isinstance(o, NoFix) for o in together):
                reason = outcome.reason if isinstance(outcome, NoFix) else "another use of it in this file is not rewritten"
                self.report(node, f"{self.MESSAGE}; not rewritten: {reason}")
                continue
            safety = Safety.UNSAFE if any(o.safety is Safety.UNSAFE for o in together) else Safety.SAFE
            why_unsafe = "" if safety is Safety.SAFE else outcome.note or (
                f"another use of `{target}` in this file needs an unsafe fix, and they change together"
            )
            replacement = nodes.parse_expression(outcome.source, self._module)
            self._fix(node, replacement, safety, f"Use `{outcome.source.split('(')[0]}`", why_unsafe)

    def _keep_exported_names(self) -> None:
        """Each name another file imports from this one: its import becomes ``name = <native>``
        (as safe as its uses' fixes), or, where it cannot, its uses are not rewritten."""
        for bound, (statement, target) in self._exported_imports.items():
            uses = [(node, outcome) for node, t, outcome in self._pending if t == target and nodes.root_name(self._use(node)) == bound]
            native = self.REFERENCES.get(target)
            why_not = ""
            if native is None:
                why_not = "no single native name replaces it"
            elif len(statement.names) != 1:
                why_not = "its import line binds other names too"
            elif any(isinstance(outcome, NoFix) for _, outcome in uses):
                why_not = "another use of it in this file is not rewritten"
            if why_not:
                reason = f"another file of the project imports `{bound}` from this module, and {why_not}"
                self._pending = [
                    (node, t, NoFix(reason) if any(node is use for use, _ in uses) else outcome) for node, t, outcome in self._pending
                ]
                continue
            unsafe = [outcome for _, outcome in uses if outcome.safety is Safety.UNSAFE]
            self.report(
                statement,
                f"{self.MESSAGE}; another file of the project imports `{bound}` from this module",
                replacement=cst.Assign([cst.AssignTarget(cst.Name(bound))], nodes.parse_expression(native, self._module)),
                safety=Safety.UNSAFE if unsafe else Safety.SAFE,
                fix_message=f"Bind `{bound}` to `{native}` for the modules that import it",
                add_imports=(ImportChange("torch"),),
                why_unsafe=unsafe[0].note if unsafe else "",
            )

    @staticmethod
    def _use(node: cst.CSTNode) -> cst.CSTNode:
        return node.func if isinstance(node, cst.Call) else node

    def _fix(self, node: cst.CSTNode, replacement: cst.CSTNode, safety: Safety, message: str, why_unsafe: str = "") -> None:
        root = nodes.root_name(self._use(node))
        statement = line_holding(self, node) if safety is Safety.UNSAFE and self.MARK_UNSAFE and why_unsafe else None
        if statement is not None:  # the line, with a marker above it saying how training changes
            node, replacement = statement, marked(statement.deep_replace(node, replacement), why_unsafe)
        self.report(
            node,
            replacement=replacement,
            safety=safety,
            fix_message=message,
            add_imports=(ImportChange("torch"),),
            why_unsafe=why_unsafe,
            remove_imports=tuple(self._apex_imports.get(root or "", ())),
        )

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        raise NotImplementedError

    # Helpers for subclasses.
    @staticmethod
    def rebuild(native: str, call: cst.Call, drop: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> str:
        """``native(<the call's arguments without the keywords in drop>, <extra>)``."""
        kept = [nodes.code(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT)) for arg in call.args if arg.keyword is None or arg.keyword.value not in drop]
        return f"{native}({', '.join([*kept, *extra])})"


def _base_init_calls(owner: cst.ClassDef, base: cst.BaseExpression) -> list[cst.Call]:
    """The calls of the base's ``__init__`` in ``owner``'s methods, as a call of the base itself:
    ``super().__init__(a, b=1)`` and ``Base.__init__(self, a, b=1)`` give ``(a, b=1)``."""
    found = []
    for node in descendants(owner):
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "__init__"):
            continue
        receiver = node.func.value
        if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Name) and receiver.func.value == "super":
            found.append(node)
        elif nodes.code(receiver) == nodes.code(base) and node.args:
            found.append(node.with_changes(args=node.args[1:]))  # `self` is not an argument of the call
    return found


def binds(parent: cst.CSTNode | None, node: cst.CSTNode) -> bool:
    """``node`` is a name being defined (``class X``, ``X = ...``, a parameter), not a use."""
    if isinstance(parent, (cst.ClassDef, cst.FunctionDef)) and parent.name is node:
        return True
    if isinstance(parent, cst.Attribute) and parent.attr is node:
        return True
    return isinstance(parent, (cst.AssignTarget, cst.Param, cst.AsName, cst.NameItem))


def line_holding(rule: cst.MetadataDependent, node: cst.CSTNode) -> cst.SimpleStatementLine | None:
    """The line ``node`` stands on (``rule`` asks for ``ParentNodeProvider``); None in a one-line
    compound statement (``if x: loss.backward()``), which has no line of its own to mark."""
    while node is not None and not isinstance(node, cst.SimpleStatementLine):
        node = rule.get_metadata(ParentNodeProvider, node, None)
    return node


def marked(statement: cst.SimpleStatementLine, why: str) -> cst.SimpleStatementLine:
    """``statement`` with ``# TODO(ampmigrate): review, this rewrite is unsafe: <why>`` above it."""
    lines = textwrap.wrap(f"TODO(ampmigrate): review, this rewrite is unsafe: {why}", width=76, break_on_hyphens=False, break_long_words=False)
    comments = [cst.EmptyLine(comment=cst.Comment(f"# {text}" if i == 0 else f"#   {text}")) for i, text in enumerate(lines)]
    return statement.with_changes(leading_lines=[*statement.leading_lines, *comments])
