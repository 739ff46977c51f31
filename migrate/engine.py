"""Run rules over one file's text: one parse, one metadata resolution, fixes applied to a fixed point.

Every round parses the current text once, lets all rules visit it together
(``MetadataWrapper.visit_batched``), replaces the reported nodes whose fixes are allowed in one
transformer pass (the outermost wins where fixes nest; the inner ones come back next round),
then schedules the applied fixes' imports once. Rounds repeat on the new text until nothing
changes, so a second run changes nothing; the fixes of later rounds are listed with the first's
(``migrate.follow_ups``). Output that does not compile is never returned.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, ParentNodeProvider

from migrate import import_changes, line_wrap, noqa, quiet
from migrate.follow_ups import Applied, follow_up_diagnostics
from migrate.metadata import FILE_SETTING, release, resolve
from migrate.parsing import parse_module
from migrate.positions import positions_by_statement
from migrate.prefilter import trigger_words
from migrate.rule import Replacement, Report, Rule, RuleContext, RuleCrashed, visitor_names
from migrate.tree_walk import children_kept, walk_batched
from migrate.types import (
    ERROR_CODE, INTERNAL_ERROR_CODE, UNUSED_NOQA_CODE, Diagnostic, Fix, Position, Related, Safety,
)

__all__ = ["EngineResult", "run_rules"]

_MAX_ROUNDS = 8


class EngineResult(NamedTuple):
    """The text after fixes, the findings located in the original text, and an error if any.

    ``remaining`` are the findings still there after the fixes, located in the returned text.
    """

    source: str
    diagnostics: tuple[Diagnostic, ...]
    error: str | None = None
    remaining: tuple[Diagnostic, ...] = ()


class _RoundFailed(Exception):
    """A rule or a fix failed; the file keeps its original text."""


@quiet.trees_kept()  # the cut into pieces and the findings' positions read one ast tree of a text
def run_rules(
    source: str,
    filename: str,
    rules: Sequence[type[Rule]],
    *,
    fix: bool = True,
    unsafe_fixes: bool = False,
    settings: dict | None = None,
    edits: bool = False,
) -> EngineResult:
    """Report what ``rules`` find in ``source`` and, if ``fix``, apply the fixes allowed.

    Safe fixes are always allowed, unsafe ones only with ``unsafe_fixes``. Diagnostics carry
    positions in ``source``; ``applied`` says whether their fix is in the returned text
    (or would be, with ``fix=False``). A file with nothing to do comes back as the same string.
    ``edits``: give each fix its text edits (``Fix.edits``), worked out one fix at a time.
    """
    context = RuleContext(filename=filename, unsafe_fixes=unsafe_fixes, settings=dict(settings or {}), first_source=source)
    if noqa.skips_file(source):
        return EngineResult(source, ())
    try:
        module = _parse(source, rules)
    except cst.ParserSyntaxError as error:
        message = f"cannot parse ({error.message}); fix the syntax error, then run again"
        return _failed(source, filename, ERROR_CODE, message, (error.editor_line, error.editor_column))
    except (RecursionError, MemoryError) as error:  # pathologically nested code
        return _failed(source, filename, ERROR_CODE, f"cannot parse: {type(error).__name__}; the file was left untouched")
    ran = frozenset(rule.CODE for rule in rules)  # a directive for a rule that ran but found nothing is unused
    selected, rules = rules, [rule for rule in rules if rule.may_apply(source)]  # decided on the original text, for all rounds
    try:
        visited = _visit(module, source, rules, context)
    except _RoundFailed as failure:
        return _failed(source, filename, INTERNAL_ERROR_CODE, str(failure))

    diagnostics = tuple(
        _diagnostic(report, visited.positions, filename, unsafe_fixes) for report in visited.reports
    )
    if edits:
        diagnostics = _with_edits(diagnostics, visited, filename)
    unused = _unused_noqa(visited, ran)
    diagnostics += tuple(_unused_diagnostic(item, filename, source if edits else None) for item in unused)
    if not fix or not any(d.applied for d in diagnostics):
        return EngineResult(source, diagnostics, remaining=tuple(d for d in diagnostics if not d.applied))

    try:
        fixed, visited, rounds = _fix_to_fixed_point(source, visited, rules, context)
        # The fixed text may call for rules the original did not (the apex rewrite makes a
        # GradScaler, and the checkpoint rules now apply): they lint it in this run, so what it
        # reports as remaining is what the next run reports.
        # Its visit is also what judges the noqa directives the fixes wrote.
        while late := [rule for rule in selected if rule not in rules and rule.may_apply(fixed)]:
            rules = [rule for rule in selected if rule in rules or rule in late]
            fixed, visited, more = _fix_to_fixed_point(fixed, _visit(_parse(fixed, rules), fixed, rules, context), rules, context)
            rounds += more
    except _RoundFailed as failure:
        return _failed(source, filename, INTERNAL_ERROR_CODE, f"{failure}; the file was left unchanged", diagnostics=diagnostics)
    remaining = tuple(
        _diagnostic(report, visited.positions, filename, unsafe_fixes)._replace(applied=False)
        for report in visited.reports
    )
    if edits:
        remaining = _with_edits(remaining, visited, filename)
    fixed = noqa.remove_unused(fixed, _unused_noqa(visited, ran))
    if fixed == source:
        return EngineResult(source, diagnostics, remaining=remaining)
    problem = _compile_error(fixed, filename)
    if problem is not None:
        if _compile_error(source, filename) is not None:
            return _failed(source, filename, ERROR_CODE, f"does not compile: {problem}", diagnostics=diagnostics)
        message = f"the fixes produced code that does not compile ({problem}); the file was left unchanged"
        return _failed(source, filename, INTERNAL_ERROR_CODE, message, diagnostics=diagnostics)
    diagnostics += follow_up_diagnostics(
        source, diagnostics, rounds, lambda report, positions: _diagnostic(report, positions, filename, unsafe_fixes))
    return EngineResult(fixed, diagnostics, remaining=remaining)


def _parse(text: str, rules: Sequence[type[Rule]]) -> cst.Module:
    """``text``'s tree, without the top-level definitions none of ``rules`` reads (``migrate.unread``)."""
    return parse_module(text, words=trigger_words(rules))


def _unused_noqa(visited: "_Visited", ran: frozenset[str]) -> list[noqa.Unused]:
    """The unused directives, when the unused-noqa rule is among those that ran."""
    if UNUSED_NOQA_CODE not in ran or not visited.directives:
        return []
    from migrate.rules import all_rules  # the catalogue: an AMP code no rule has is a typo

    known = {rule.CODE for rule in all_rules()} | {ERROR_CODE, INTERNAL_ERROR_CODE}
    return noqa.unused(visited.directives, ran, known)


def _unused_diagnostic(item: noqa.Unused, filename: str, text: str | None = None) -> Diagnostic:
    """``text``: the file's, to give the fix its edits."""
    directive = item.directive
    kept = [code for code in directive.codes or () if code not in item.codes]
    fix_message = f"Remove {', '.join(item.codes)} from the directive" if kept else "Remove the unused `noqa` directive"
    edits = ()
    if text is not None:
        from migrate.edits import text_edits

        edits = text_edits(text, noqa.remove_unused(text, [item]))
    return Diagnostic(
        code=UNUSED_NOQA_CODE,
        message=item.message,
        filename=filename,
        location=Position(directive.row, directive.start + 1),
        end_location=Position(directive.row, directive.end + 1),
        fix=Fix(applicability=Safety.SAFE, message=fix_message, edits=edits),
        applied=True,
    )


class _Visited(NamedTuple):
    """A module the rules visited, what they reported, and where its nodes are."""

    module: cst.Module
    reports: list[Report]  # those no directive suppresses
    positions: Mapping[cst.CSTNode, CodeRange]
    directives: noqa.Directives  # of this module's text, with the codes each suppressed


def _visit(module: cst.Module, text: str, rules: Sequence[type[Rule]], context: RuleContext) -> _Visited:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)  # the module is ours alone: no deep copy
    visitors = [rule_class(context) for rule_class in rules if visitor_names(rule_class) and rule_class.has_work_in(text)]
    directives = noqa.Directives(text)
    with children_kept() as kept:
        positions = positions_by_statement(module, text, kept)  # the walks' lists serve it later
        if not visitors:
            return _Visited(module, [], positions, directives)
        metadata: dict = {}
        try:
            # the providers know the run's settings and the file's name (a file's project is read from it)
            metadata = resolve(wrapper, visitors, {**context.settings, FILE_SETTING: context.filename}, positions)
            for visitor in visitors:  # what MetadataWrapper.visit_batched does, with metadata resolved here
                visitor.metadata = {key: metadata[key] for key in visitor.get_inherited_dependencies()}
            walk_batched(module, visitors, path=getattr(metadata.get(ParentNodeProvider), "path", None))
        except RuleCrashed as error:
            raise _RoundFailed(f"rule {error}") from error
        except Exception as error:  # a crashing rule or metadata provider must not cost the user their file
            raise _RoundFailed(f"a rule crashed: {type(error).__name__}: {error}") from error
        finally:
            for visitor in visitors:
                visitor.metadata = {}
            release(metadata)
    reports = [report for visitor in visitors if visitor.skipped is None for report in visitor.reports]
    if directives:
        reports = _unsuppressed(reports, positions, directives, rules)
    return _Visited(module, reports, positions, directives)


def _unsuppressed(
    reports: list[Report],
    positions: Mapping[cst.CSTNode, CodeRange],
    directives: noqa.Directives,
    rules: Sequence[type[Rule]],
) -> list[Report]:
    """The reports no directive suppresses. Suppressed findings go with their fixes; and when one
    of a ``FIX_GROUP``'s fixes is suppressed, the group's others are reported without theirs: they
    only work together (``scaler.scale(loss)`` needs the scaler made where ``amp.initialize`` was)."""
    group_of = {rule.CODE: getattr(rule, "FIX_GROUP", None) for rule in rules}
    kept, cut_groups = [], set()
    for report in reports:
        if not directives.suppresses(_row(positions, report), report.code):
            kept.append(report)
        elif report.replacement is not None and group_of.get(report.code):
            cut_groups.add(group_of[report.code])
    if not cut_groups:
        return kept
    note = "; not fixed: a `# noqa` suppresses another part of the same rewrite"
    return [
        report._replace(replacement=None, message=report.message + note, add_imports=(), remove_imports=())
        if report.replacement is not None and group_of.get(report.code) in cut_groups
        else report
        for report in kept
    ]


def _row(positions: Mapping[cst.CSTNode, CodeRange], report: Report) -> int:
    where = positions.get(report.node)
    return where.start.line if where is not None else 1


def _fix_to_fixed_point(
    text: str, visited: _Visited, rules: Sequence[type[Rule]], context: RuleContext
) -> tuple[str, _Visited, list[list[Applied]]]:
    """Apply fixes round after round; returns the final text with its own visit, and the fixes
    each round applied."""
    rounds: list[list[Applied]] = []
    for _ in range(_MAX_ROUNDS):
        allowed = [r for r in visited.reports if r.replacement is not None and _allowed(r.safety, context.unsafe_fixes)]
        if not allowed:
            return text, visited, rounds
        new_text, applied = _apply(visited.module, allowed, context.filename)
        if new_text == text:
            return text, visited, rounds
        rounds.append([Applied(report, text, visited.positions) for report in applied])
        text = new_text
        try:
            visited = _visit(_parse(text, rules), text, rules, context)
        except cst.ParserSyntaxError as error:
            raise _RoundFailed(f"the fixes produced code that does not parse ({error.message})") from error
    raise _RoundFailed(f"the fixes did not settle after {_MAX_ROUNDS} rounds")


def _apply(module: cst.Module, reports: list[Report], filename: str, *, alone: bool = False) -> tuple[str, list[Report]]:
    """Replace the reported nodes (by identity) in one pass, then schedule the imports once;
    returns the new text and the reports whose fixes it holds (a fix inside another waits).

    ``alone``: one fix of a file's several, for its edits (see ``import_changes.apply``).
    """
    replacer, before = _Replacer(reports), module.code
    try:
        module = module.visit(replacer)
    except Exception as error:
        raise _RoundFailed(f"a fix could not be applied: {type(error).__name__}: {error}") from error
    applied = [report for report in reports if id(report) in replacer.applied]
    # the lines the fixes wrote past the file's limit are laid out as a formatter would
    return line_wrap.fit_new_lines(before, import_changes.apply(module, applied, filename, alone=alone).code), applied


class _Replacer(cst.CSTTransformer):
    """Swaps each reported node for its replacement; nodes inside a replaced one are left alone."""

    def __init__(self, reports: list[Report]) -> None:
        super().__init__()
        self._by_node: dict[int, Report] = {}
        for report in reports:  # the first fix reported for a node wins
            self._by_node.setdefault(id(report.node), report)
        self.applied: set[int] = set()
        self._placed: set[int] = set()  # statements a replacement put in

    def _report_for(self, node: cst.CSTNode) -> Report | None:
        report = self._by_node.get(id(node))
        return report if report is not None and report.node is node else None

    def on_visit(self, node: cst.CSTNode) -> bool:
        return self._report_for(node) is None

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Replacement:
        report = self._report_for(original_node)
        if report is None:
            if isinstance(updated_node, (cst.Module, cst.IndentedBlock)):
                body = self._without_placeholders(updated_node.body)
                if isinstance(updated_node, cst.IndentedBlock) and body and self._removed(original_node.body[0]):
                    body[0] = import_changes.without_leading_blank_lines(body[0])  # the block does not open on a blank line
                return updated_node.with_changes(body=body)
            return updated_node
        self.applied.add(id(report))
        replacement = report.replacement
        if isinstance(replacement, cst.FlattenSentinel):
            replacement = cst.FlattenSentinel([node.visit(_EmptyElseDropped()) for node in replacement.nodes])
        elif isinstance(replacement, cst.CSTNode):
            replacement = replacement.visit(_EmptyElseDropped())
        placed = replacement.nodes if isinstance(replacement, cst.FlattenSentinel) else [replacement]
        self._placed.update(map(id, placed))
        return replacement

    def _removed(self, statement: cst.CSTNode) -> bool:
        """A fix removes ``statement``, leaving nothing in its place."""
        report = self._report_for(statement)
        replacement = report.replacement if report is not None else None
        return isinstance(replacement, cst.RemovalSentinel) or isinstance(replacement, cst.FlattenSentinel) and not replacement.nodes

    def _without_placeholders(self, body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """A ``pass`` a fix put where it removed a statement only keeps the block non-empty, or
        holds its comments (a TODO): where a statement follows, that one takes the comments."""
        kept: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []
        for index, statement in enumerate(body):
            placeholder = (
                id(statement) in self._placed and index + 1 < len(body)
                and isinstance(statement, cst.SimpleStatementLine)
                and all(isinstance(small, cst.Pass) for small in statement.body)
                and statement.trailing_whitespace.comment is None
            )
            if placeholder:
                carried.extend(statement.leading_lines)
                continue
            if carried:
                statement = statement.with_changes(leading_lines=[*carried, *statement.leading_lines])
                carried = []
            kept.append(statement)
        return kept


class _EmptyElseDropped(cst.CSTTransformer):
    """Drops an ``else:`` a fix emptied (libcst would write ``else: pass``): parsed code has no
    empty block, so one with no statement and no comment is a fix's."""

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        arm = updated_node.orelse
        if (isinstance(arm, cst.Else) and isinstance(arm.body, cst.IndentedBlock) and not arm.body.body
                and not any(line.comment for line in (*arm.leading_lines, *arm.body.footer))):
            return updated_node.with_changes(orelse=None)
        return updated_node


def _allowed(safety: Safety, unsafe_fixes: bool) -> bool:
    return safety is Safety.SAFE or unsafe_fixes


def _diagnostic(report: Report, positions: Mapping[cst.CSTNode, CodeRange], filename: str, unsafe_fixes: bool) -> Diagnostic:
    """A node that is not in the parsed tree (a rule's mistake) is placed at the file's start."""
    fix = None
    if report.replacement is not None:
        fix = Fix(applicability=report.safety, message=report.fix_message, why_unsafe=report.why_unsafe)
    start, end = _span(positions.get(report.node))
    related = tuple(Related(message, *_span(positions.get(node))) for node, message in report.related)
    return Diagnostic(
        code=report.code,
        message=report.message,
        filename=filename,
        location=start,
        end_location=end,
        fix=fix,
        applied=fix is not None and _allowed(report.safety, unsafe_fixes),
        related=related,
    )


def _span(where: CodeRange | None) -> tuple[Position, Position]:
    if where is None:
        return Position(1, 1), Position(1, 1)
    return Position(where.start.line, where.start.column + 1), Position(where.end.line, where.end.column + 1)


def _with_edits(diagnostics: tuple[Diagnostic, ...], visited: _Visited, filename: str) -> tuple[Diagnostic, ...]:
    """Each fix's edits: its replacement (and imports) applied alone to the visited text."""
    from migrate.edits import text_edits

    text = visited.module.code
    with_edits = []
    for diagnostic, report in zip(diagnostics, visited.reports):
        if diagnostic.fix is not None:
            try:
                edited = _apply(visited.module, [report], filename, alone=True)[0]
            except _RoundFailed:  # the fix cannot be applied alone: it comes without edits
                edited = text
            diagnostic = diagnostic._replace(fix=diagnostic.fix._replace(edits=text_edits(text, edited)))
        with_edits.append(diagnostic)
    return tuple(with_edits)


def _compile_error(source: str, filename: str) -> str | None:
    try:
        with quiet.warnings_off():
            compile(source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        line = getattr(error, "lineno", None)
        return f"{getattr(error, 'msg', error)} (line {line})" if line else str(error)
    return None


def _failed(
    source: str,
    filename: str,
    code: str,
    message: str,
    where: tuple[int, int] = (1, 1),
    diagnostics: tuple[Diagnostic, ...] = (),
) -> EngineResult:
    """The original text, untouched, with an error finding first and no fix marked applied."""
    unapplied = tuple(d._replace(applied=False) for d in diagnostics)
    at = Position(*where)
    error = Diagnostic(code=code, message=message, filename=filename, location=at, end_location=at)
    return EngineResult(source, (error, *unapplied), error=message, remaining=(error, *unapplied))
