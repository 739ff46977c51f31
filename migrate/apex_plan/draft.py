"""The rewrite being written: what replaces which node, the lines put before statements, and
why it may train differently. Planning steps add to it; none reads another's flags from it.

The last steps (``place_insertions``, ``compose_nested``, ``check_disjoint``) turn it into
replacements that can be applied at once: the lines planned before a statement go in, and a
replacement that keeps original statements carries the replacements planned inside them.
"""
from __future__ import annotations

import textwrap
from typing import Callable

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.backslash_lines import continued_lines, moved_with_their_statements, statement_depths
from migrate.apex_plan.block_indents import by_default, indented_as_around
from migrate.apex_plan.syntax import SUSPENDS, ReplaceByIdentity, contains, defines
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import MANUAL_STEP_MARKER, SCALE_LOSS, Unplannable
from migrate.rule import Replacement
from migrate.tree_walk import descendants
from migrate.types import ImportChange


class Draft:
    """The replacements of one file's rewrite, with the finding (code, message, fix) of each."""

    def __init__(self, tree: FileTree) -> None:
        self.tree = tree
        self.replacements: dict[int, tuple[cst.CSTNode, Replacement]] = {}
        self.kinds: dict[int, tuple[str, str, str]] = {}  # node id -> (rule code, message, fix)
        # Lines to put before a statement (`scaler.unscale_(opt)`, a default scaler).
        self.insert_before: dict[int, tuple[cst.BaseStatement, list[str]]] = {}
        self.composed: set[int] = set()  # replaced statements that carry the replacements inside them
        self.regions: set[int] = set()  # statements that became an autocast region
        self.region_enabled: dict[int, str] = {}  # a training region's first statement -> its `enabled` argument
        self.unscale_covered: set[int] = set()  # gradient-reading statements (and helpers) an unscale covers
        self.unscale_refused: set[int] = set()  # those an unscale cannot precede: the step may not follow
        self.master_params_in_clips: set[int] = set()  # rewritten as part of a scale-aware clip
        self.unsafe: list[str] = [tree.unbound_note] if tree.unbound_note else []  # why the rewrite may train differently
        self.unsafe_sites: dict[str, list[cst.CSTNode]] = {}  # a reason -> the nodes it is about (none: all)
        self.marked_reasons: list[str] = []  # unsafe reasons a marker at their own line already states
        self.marks: list[tuple[cst.CSTNode, str]] = []  # statements to mark, fixed or not, once all fixes are planned
        self.notes: list[str] = list(tree.fallback_notes)  # what a safe fix reads differently from the letter of the code
        self.after_imports: list[str] = []  # module-level definitions the rewrite adds
        self.imports_added: list[ImportChange] = []  # imports the rewrite needs besides torch
        self.partner_unsafe: list[str] = []  # the other half's reasons: a pair is fixed together or not at all
        self.half_facts: dict | None = None  # what this half tells the other half's plan
        # `if isfinite(norm):` tests around a step: exact ones (their scaler and the step's test),
        # and those `update()` cannot follow on every path
        self.gradient_guards: dict[int, tuple[cst.If, str, str | None]] = {}
        self.inexact_gradient_guards: dict[int, cst.If] = {}

    def insert_once(self, place: cst.BaseStatement, line: str) -> None:
        """``line`` before ``place``, said once per body: two scaled backward passes under their
        own tests before one read (``if doc: ...scale...``, then ``if wiki: ...scale...``) unscale
        under either test, ``if (doc) or (wiki):``, as the step goes through the scaler (a second
        ``unscale_`` before the update raises); under opposite tests, or where one has none, with
        no test."""
        lines = self.insert_before.setdefault(id(place), (place, []))[1]
        test, body = _test_and_body(line)
        for index, other in enumerate(lines):
            other_test, other_body = _test_and_body(other)
            if textwrap.dedent(body) != textwrap.dedent(other_body):
                continue
            if not test or not other_test or _opposite(test, other_test):
                lines[index] = textwrap.dedent(body)
            elif test != other_test:
                either = other_test if ") or (" in other_test else f"({other_test})"
                lines[index] = f"if {either} or ({test}):\n{other_body}"
            return
        lines.append(line)

    def replace(self, node: cst.CSTNode, replacement: Replacement) -> None:
        self.replacements[id(node)] = (node, replacement)

    def kind(self, node: cst.CSTNode, code: str, message: str, fix: str) -> None:
        self.kinds[id(node)] = (code, message, fix)

    def unsafe_at(self, node: cst.CSTNode, reason: str, among: int = 2) -> None:
        """Record ``reason`` as being about ``node`` only: the fix there says it; the others say
        they go with it. ``among``: how many calls like ``node`` the file has; of one alone (an
        `initialize`'s O2 level) the reason is the whole rewrite's."""
        self.unsafe.append(reason)
        if among > 1:
            self.unsafe_sites.setdefault(reason, []).append(node)

    def reasons_for(self, fixed: cst.CSTNode, reasons: list[str]) -> str:
        """Why the fix of ``fixed`` is unsafe: the reasons about it or about the whole rewrite,
        then the lines whose own reasons it shares a fate with (the file's fixes go together)."""
        fixed_nodes = [node for node, _ in self.replacements.values()]

        def about(anchor: cst.CSTNode, node: cst.CSTNode) -> bool:
            return self.tree.inside(anchor, node) or self.tree.inside(node, anchor)

        own, elsewhere = [], set()
        for reason in reasons:
            anchors = [a for a in self.unsafe_sites.get(reason, []) if any(about(a, node) for node in fixed_nodes)]
            if not anchors or any(about(anchor, fixed) for anchor in anchors):
                own.append(reason)
            else:
                elsewhere.update(line for line in map(self.tree.line, anchors) if line is not None)
        if elsewhere:
            lines = ", ".join(map(str, sorted(elsewhere)))
            own.append(f"it is applied together with the unsafe fix{'es' if len(elsewhere) > 1 else ''} "
                       f"at line{'s' if len(elsewhere) > 1 else ''} {lines}")
        return "; ".join(own)

    def touched(self, statement: cst.CSTNode) -> bool:
        return any(id(node) in self.replacements for node in descendants(statement))

    def window(self, block: cst.CSTNode, current: cst.CSTNode) -> list[cst.BaseStatement]:
        """The statements just before ``current`` in ``block`` that no other fix touches and that
        define nothing nor suspend: where an autocast region may start. A helper defined in the
        loop (``def debatch(fea): ...``, read by the lines after it) computes nothing where it is
        defined, and an import binds the same name inside a ``with``: the region may go above
        either, to the forward pass it sits after."""
        body = list(block.body)
        end = body.index(current)
        start = end
        while start > 0 and not self.touched(body[start - 1]) and not contains(body[start - 1], SUSPENDS) and (
                not defines(body[start - 1]) or _binds_in_place(body[start - 1], block)):
            start -= 1
        return body[start:end]

    def leave_marker(self, statement: cst.CSTNode, step: str) -> None:
        """A ``# TODO(ampmigrate): ...`` comment on the replacement of ``statement``, wrapped to the
        file's line length; AMP017 reports it until done."""
        node, replacement = self.replacements[id(statement)]
        if isinstance(replacement, cst.RemovalSentinel):
            replacement = nodes.with_leading(cst.SimpleStatementLine([cst.Pass()]), statement)
        placed = list(replacement.nodes) if isinstance(replacement, cst.FlattenSentinel) else [replacement]
        placed[0] = placed[0].with_changes(leading_lines=[*placed[0].leading_lines, *self._marker_lines(statement, step)])
        self.replace(node, cst.FlattenSentinel(placed) if len(placed) > 1 else placed[0])

    def _marker_lines(self, statement: cst.CSTNode, step: str, deeper: int = 0) -> list[cst.EmptyLine]:
        indent = self.tree.line_indent(statement) + deeper
        # within 88 columns with the indent and `#   ` (a continuation's prefix, the longer one)
        lines = textwrap.wrap(f"{MANUAL_STEP_MARKER} {step}", width=max(40, 88 - indent - 4), break_on_hyphens=False, break_long_words=False)
        return [cst.EmptyLine(comment=cst.Comment(f"# {text}" if i == 0 else f"#   {text}")) for i, text in enumerate(lines)]

    def _mark_where_moved(self, statement: cst.BaseStatement, step: str) -> bool:
        """``statement``, removed from its place, kept in another fix (an autocast region that
        took it in): the marker goes on it there."""
        for node, replacement in list(self.replacements.values()):
            parts = replacement.nodes if isinstance(replacement, cst.FlattenSentinel) else (
                () if isinstance(replacement, cst.RemovalSentinel) else (replacement,))
            if node is statement or not any(inner is statement for part in parts for inner in descendants(part)):
                continue
            commented = statement.with_changes(leading_lines=[*statement.leading_lines, *self._marker_lines(statement, step, 4)])
            new = [part.deep_replace(statement, commented) for part in parts]
            self.replace(node, cst.FlattenSentinel(new) if isinstance(replacement, cst.FlattenSentinel) else new[0])
            return True
        return False

    def mark(self, statement: cst.BaseStatement, reason: str, step: str) -> None:
        """``reason`` makes the rewrite unsafe at ``statement``, which reads differently from how it
        ran on apex whether or not a fix touches it: a marker there says ``step`` (``place_marks``)."""
        self.unsafe.append(reason)
        self.marked_reasons.append(reason)
        self.unsafe_sites.setdefault(reason, []).append(statement)
        self.marks.append((statement, step))

    def place_marks(self) -> None:
        """The markers ``mark`` asked for, on the statement's fix (its inner fixes are composed
        into it later), or on the statement as it is, reported as what to do there."""
        for statement, step in dict.fromkeys(self.marks):  # once, where two scaled backward passes ask
            if id(statement) not in self.replacements:
                self.replace(statement, statement)
                self.kind(statement, SCALE_LOSS, "gradients read here were unscaled by apex", step)
            elif isinstance(self.replacements[id(statement)][1], cst.RemovalSentinel) and self._mark_where_moved(statement, step):
                continue
            self.leave_marker(statement, step)

    def place_insertions(self, scaler: str | None) -> None:
        """Put the planned lines (``scaler.unscale_``, a disabled scaler in ``__init__``) before their
        statements, keeping any fix inside them: innermost first, so that an outer statement's
        lines (a disabled scaler before the epoch loop) keep those placed inside it (an ``unscale_``)."""
        for statement, lines in sorted(self.insert_before.values(), key=lambda entry: -len(self.tree.ancestors(entry[0]))):
            own = self.replacements.get(id(statement))
            if own is not None:
                replaced = own[1]
                body = [] if isinstance(replaced, cst.RemovalSentinel) else list(replaced.nodes) if isinstance(replaced, cst.FlattenSentinel) else [replaced]
            else:
                inner = {id(node): new for node, new in self.replacements.values() if self.tree.inside(node, statement)}
                body = [statement.visit(ReplaceByIdentity(inner))] if inner else [statement]
                if inner:
                    self.composed.add(id(statement))
            new = nodes.parse_statements("\n".join(lines) + "\n", self.tree.module)
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) and body:
                # a definition keeps its comments, a blank line above it (a class attribute before a method)
                kept = body[0].leading_lines if body[0].leading_lines else (cst.EmptyLine(indent=False),)
                placed = [*new, body[0].with_changes(leading_lines=kept), *body[1:]]
            else:
                placed = [nodes.with_leading(new[0], statement), *new[1:], *(part.with_changes(leading_lines=()) if i == 0 else part for i, part in enumerate(body))]
            self.replace(statement, cst.FlattenSentinel(placed))
            if id(statement) not in self.kinds:
                self.kind(
                    statement,
                    SCALE_LOSS,
                    "gradients read after `amp.scale_loss` were unscaled by apex",
                    f"Call `{scaler}.unscale_(optimizer)` before reading them",
                )

    def compose_nested(self) -> None:
        """A replacement that keeps original statements (the body of a ``scale_loss`` block)
        carries the replacements planned inside them; innermost first."""
        ancestors = {key: self.tree.ancestors(node) for key, (node, _) in self.replacements.items()}
        nested: dict[int, list[int]] = {}  # a replaced node -> the replaced nodes inside it
        for key, found in ancestors.items():
            for ancestor in found:
                if id(ancestor) in self.replacements:
                    nested.setdefault(id(ancestor), []).append(key)
        for key in sorted(self.replacements, key=lambda key: -len(ancestors[key])):
            node, replacement = self.replacements[key]  # composed already, if it was inside another
            inner = {inside: self.replacements[inside][1] for inside in nested.get(key, ())}
            if not inner or id(node) in self.composed or isinstance(replacement, cst.RemovalSentinel):
                continue
            swap = ReplaceByIdentity(inner)
            parts = [part.visit(swap) for part in (replacement.nodes if isinstance(replacement, cst.FlattenSentinel) else [replacement])]
            dropped = set(inner) - swap.swapped
            if all(isinstance(inner[key], cst.RemovalSentinel) for key in dropped):  # else `check_disjoint` reports it
                self.replacements[id(node)] = (node, cst.FlattenSentinel(parts) if isinstance(replacement, cst.FlattenSentinel) else parts[0])
                self.composed.add(id(node))

    def fold_identical_arms(self, unscaled: Callable[[cst.Call], bool] = lambda call: False) -> None:
        """``if self.opt.apex: scaler.scale(loss).backward()`` beside ``else:`` the same line, once
        both arms are rewritten alike (a plain backward put through the scaler), or beside an
        ``else: loss.backward()`` that ``unscaled`` knows runs only where the scaler is off (a
        disabled scaler's ``scale`` hands the loss back): one line, as a person would write it.
        Only under a test that reads the same each time (``is_pure``), and only where the ``if``
        and ``else:`` lines carry no comment."""
        for node in list(descendants(self.tree.module)):
            if type(node) is not cst.If or not isinstance(node.orelse, cst.Else) or not nodes.is_pure(node.test) \
                    or self.touched(node.test) or getattr(self.tree.parent.get(id(node)), "orelse", None) is node:
                continue  # an `elif` stays: it is no statement
            if not (isinstance(node.body, cst.IndentedBlock) and isinstance(node.orelse.body, cst.IndentedBlock)):
                continue  # an arm on its header's line (`else: loss.backward()`) stays as written
            touched = [self.touched(node.body), self.touched(node.orelse.body)]
            said = [line.comment for line in node.orelse.leading_lines] + [node.body.header.comment, node.orelse.body.header.comment]
            arms = [self._rendered(block.body[0]) if isinstance(block, cst.IndentedBlock) and len(block.body) == 1 else None
                    for block in (node.body, node.orelse.body)]
            if not any(touched) or any(comment is not None for comment in said) or None in arms:
                continue
            if all(touched):
                if nodes.code(arms[0]) != nodes.code(arms[1]):
                    continue
            elif not _through_the_scaler((node.body, node.orelse.body)[touched.index(False)].body[0], arms[touched.index(True)], unscaled):
                continue  # the untouched arm's own statement: ``unscaled`` places it in the file
            inside = [key for key, (replaced, _) in self.replacements.items() if self.tree.inside(replaced, node)]
            kind = next(self.kinds[key] for key in inside if key in self.kinds)
            for key in inside:
                del self.replacements[key]
            self.replace(node, nodes.with_leading(arms[touched.index(True)], node))
            self.kinds[id(node)] = kind

    def _rendered(self, statement: cst.CSTNode) -> cst.CSTNode | None:
        """``statement`` as the rewrite writes it (one statement; None where it goes or splits)."""
        if id(statement) in self.replacements:
            replacement = self.replacements[id(statement)][1]
        else:
            inner = {key: replacement for key, (replaced, replacement) in self.replacements.items()
                     if self.tree.inside(replaced, statement)}
            replacement = statement.visit(ReplaceByIdentity(inner))
        return None if isinstance(replacement, (cst.RemovalSentinel, cst.FlattenSentinel)) else replacement

    def indent_as_around(self) -> None:
        """The blocks the rewrite writes indented as the block each replaced statement is in (``block_indents``)."""
        default = self.tree.module.default_indent
        own = None  # the file's own default-indented statements: walked for only where a block differs
        for key, (node, replacement) in self.replacements.items():
            unit = self.tree.indent_unit(node)
            if unit != default:
                own = by_default(self.tree.module) if own is None else own
                self.replacements[key] = (node, indented_as_around(replacement, unit, own))

    def continue_moved_lines(self) -> None:
        """Lines a backslash continues follow their statement to where the rewrite put it (``backslash_lines``)."""
        default, before = self.tree.module.default_indent, None
        for key, (node, replacement) in self.replacements.items():
            if continued_lines(replacement):
                before = statement_depths(self.tree.module, 0, default) if before is None else before
                self.replacements[key] = (node, moved_with_their_statements(replacement, self.tree.line_indent(node), before, default))

    def check_disjoint(self) -> None:
        for node, _ in self.replacements.values():
            ancestor = self.tree.parent.get(id(node))
            while ancestor is not None:
                if id(ancestor) in self.replacements and id(ancestor) not in self.composed:
                    raise Unplannable(node, "two rewrites would overlap here")
                ancestor = self.tree.parent.get(id(ancestor))


def _through_the_scaler(plain: cst.CSTNode, scaled: cst.CSTNode, unscaled: Callable[[cst.Call], bool]) -> bool:
    """Whether ``plain`` is ``loss.backward()`` where the scaler is off (``unscaled``) and
    ``scaled`` is ``scaler.scale(loss).backward()`` of the same loss: the same pass either way."""
    plain_call, scaled_call = (_backward_call(statement) for statement in (plain, scaled))
    if plain_call is None or scaled_call is None or not unscaled(plain_call):
        return False
    scaling = scaled_call.func.value
    return (type(scaling) is cst.Call and isinstance(scaling.func, cst.Attribute) and scaling.func.attr.value == "scale"
            and len(scaling.args) == 1 and scaling.args[0].keyword is None and not scaling.args[0].star
            and nodes.code(scaling.args[0].value) == nodes.code(plain_call.func.value))


def _backward_call(statement: cst.CSTNode) -> cst.Call | None:
    """The ``x.backward()`` call (no arguments) that ``statement`` is, else None."""
    if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1 or type(statement.body[0]) is not cst.Expr:
        return None
    call = statement.body[0].value
    if type(call) is cst.Call and not call.args and isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
        return call
    return None


def _binds_in_place(statement: cst.BaseStatement, block: cst.CSTNode) -> bool:
    """A function defined in a function's block, with no decorator to run where it is defined; or
    a line of a function's block that imports (``import ipdb; ipdb.set_trace()``): in a ``with``
    block it binds the same local name at the same moment."""
    if isinstance(block, cst.Module):
        return False
    if type(statement) is cst.SimpleStatementLine:
        return not any(isinstance(small, (cst.Global, cst.Nonlocal)) for small in statement.body)
    return type(statement) is cst.FunctionDef and not statement.decorators


def _test_and_body(line: str) -> tuple[str, str]:
    """``("a", "    body")`` for ``"if a:\n    body"``; ``("", line)`` for a line under no test."""
    head, _, body = line.partition(":\n")
    return (head[3:], body) if body and head.startswith("if ") else ("", line)


def _opposite(test: str, other: str) -> bool:
    return test == f"not {other}" or other == f"not {test}" or test == f"not ({other})" or other == f"not ({test})"
