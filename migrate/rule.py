"""The base of every rule: a batchable libcst visitor that reports findings, with or without a fix.

All rules of a run visit one parsed module together, sharing one metadata resolution
(the engine calls ``MetadataWrapper.visit_batched``). A rule never edits the tree itself:
it reports ``(node, replacement)`` pairs and the imports the replacement needs, and the
engine applies the fixes it is allowed to apply, then schedules the imports once.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Mapping, NamedTuple, Union

import libcst as cst
from libcst.metadata import PositionProvider, QualifiedNameProvider, ScopeProvider

from migrate.types import FixSafety, ImportChange, Safety, holds_trigger  # ImportChange: re-exported for rules

Replacement = Union[cst.CSTNode, cst.RemovalSentinel, cst.FlattenSentinel]


class RuleCrashed(Exception):
    """A rule raised something other than ``SkipFile``: the message names the rule and the line."""


class SkipFile(Exception):
    """Raised by a rule that has nothing to do in this file (e.g. ``SkipFile("no apex import")``).

    Only that rule stops: its reports for the file are dropped, the other rules go on.
    """


class Report(NamedTuple):
    """What a rule found at one node; ``replacement`` is the fix, if the rule has one."""

    code: str
    node: cst.CSTNode
    message: str
    replacement: Replacement | None = None
    safety: Safety = Safety.SAFE
    fix_message: str = ""
    add_imports: tuple[ImportChange, ...] = ()
    remove_imports: tuple[ImportChange, ...] = ()
    why_unsafe: str = ""  # for an unsafe fix: how it may change behaviour
    related: tuple[tuple[cst.CSTNode, str], ...] = ()  # other places of the same cause, each with a word on it


class Valid(NamedTuple):
    """Source the rule must leave alone and report nothing on; ``framework`` names the training
    framework it is written for (``Rule.FRAMEWORKS``), where it shows one."""

    code: str
    framework: str | None = None


class Invalid(NamedTuple):
    """Source the rule must report; ``expected_replacement`` is the fixed source, if it fixes it.

    ``unsafe_fixes`` says the replacement is only produced with unsafe fixes enabled.
    """

    code: str
    expected_replacement: str | None = None
    unsafe_fixes: bool = False
    framework: str | None = None


@dataclass(frozen=True)
class RuleContext:
    """What a rule may know about the run: the file, and the options that change its output."""

    filename: str = "<stdin>"
    unsafe_fixes: bool = False
    settings: dict = field(default_factory=dict)
    first_source: str | None = None  # the text before any fix: a later round reads what a fix removed there


class Rule(cst.BatchableCSTVisitor):
    """Subclass this, set ``CODE``, ``MESSAGE``, ``VALID`` and ``INVALID``, and call ``report``.

    The class docstring is the rule's documentation, in this order: What it does, Why is this bad?,
    Fix safety (and Options, References when there are any). ``--explain`` prints it with
    ``INVALID[0]`` as the example, so the text cannot drift from the tests.
    """

    CODE: ClassVar[str] = ""
    MESSAGE: ClassVar[str] = ""
    VALID: ClassVar[list[Valid]] = []
    INVALID: ClassVar[list[Invalid]] = []
    # How the rule applies in each training framework it knows (a rule on training steps), by
    # name; its examples for one say ``framework=`` that name.
    FRAMEWORKS: ClassVar[dict[str, str]] = {}
    # Words a file must contain for this rule to have anything to do: any one of them, in any case,
    # as a word or a part of a snake_case name ("amp" is found in "use_amp" and "AMP_LEVEL", not in
    # "clamp"). Files holding none of the selected rules' words are skipped unparsed, and a rule
    # whose words a file lacks does not visit it. Empty: every file.
    TRIGGERS: ClassVar[tuple[str, ...]] = ()
    # True: the rule reports only in a file that calls ``.backward()`` or ``.step()`` through an
    # attribute, or casts to float16 (``.half()``, ``.to(torch.float16)``): where the step model has
    # events. A file whose only trigger words are such rules' words, and that does none of this, is
    # skipped unparsed (``migrate.prefilter``).
    NEEDS_A_STEP: ClassVar[bool] = False
    # Those of TRIGGERS the rule acts on only where a step is, as NEEDS_A_STEP says of them all:
    # AMP107 reads any file saying "GradScaler", and a "scaler" handed in only where it scales.
    STEP_TRIGGERS: ClassVar[tuple[str, ...]] = ()
    # False: run only when a --select prefix (or ALL) names the rule, not in a plain run.
    DEFAULT: ClassVar[bool] = True
    # How safe the fixes it offers are, as --list-rules shows it; checked against INVALID by the tests.
    FIX_SAFETY: ClassVar[FixSafety] = FixSafety.NO_FIX
    # What its fix does, in a few words, for --list-rules: "amp.scale_loss -> scaler.scale(loss)...".
    FIX: ClassVar[str] = ""
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ScopeProvider)

    def __init__(self, context: RuleContext | None = None) -> None:
        super().__init__()
        self.context = context or RuleContext()
        self.reports: list[Report] = []
        self.skipped: str | None = None  # the reason given with SkipFile, once raised

    def get_visitors(self) -> Mapping[str, Callable]:
        """The visit/leave methods, each stopping this rule alone when it raises ``SkipFile``.

        libcst looks them up with ``inspect.getmembers`` over some 1,600 stubs on every instance,
        which costs more than parsing a small file; the names are found once per class instead.
        """
        return {name: self._until_skipped(getattr(self, name)) for name in visitor_names(type(self))}

    def _until_skipped(self, method: Callable) -> Callable:
        @functools.wraps(method)
        def guarded(node: cst.CSTNode) -> None:
            if self.skipped is not None:
                return None
            try:
                return method(node)
            except SkipFile as skip:
                self.skipped = str(skip) or type(self).__name__
                self.reports.clear()
                return None
            except Exception as error:
                raise RuleCrashed(
                    f"{self.CODE} ({type(self).__name__}.{method.__name__}) crashed{self._line_of(node)}: "
                    f"{type(error).__name__}: {error}"
                ) from error

        return guarded

    def _line_of(self, node: cst.CSTNode) -> str:
        try:
            where = self.get_metadata(PositionProvider, node, None)
        except KeyError:  # the rule does not ask for positions
            where = None
        return f" at line {where.start.line}" if where is not None else ""

    @classmethod
    def name(cls) -> str:
        return cls.__name__

    @classmethod
    def may_apply(cls, source: str) -> bool:
        """Whether ``source`` contains one of ``TRIGGERS`` (always True without triggers)."""
        return not cls.TRIGGERS or holds_trigger(source, cls.TRIGGERS)

    @classmethod
    def has_work_in(cls, text: str) -> bool:
        """Whether one round's text can hold anything for the rule, asked of every round once
        ``may_apply`` has chosen the rule on the file's original text. A rule that visits
        comments, and so makes the walk meet every token, says no when its text is not there."""
        return True

    @classmethod
    def fixable(cls) -> bool:
        return cls.FIX_SAFETY is not FixSafety.NO_FIX

    def report(
        self,
        node: cst.CSTNode,
        message: str | None = None,
        *,
        replacement: Replacement | None = None,
        safety: Safety = Safety.SAFE,
        fix_message: str = "",
        add_imports: tuple[ImportChange, ...] = (),
        remove_imports: tuple[ImportChange, ...] = (),
        why_unsafe: str = "",
        related: tuple[tuple[cst.CSTNode, str], ...] = (),
    ) -> None:
        """Report ``node``; an unsafe ``replacement`` must say ``why_unsafe`` (shown to the user)."""
        self.reports.append(
            Report(
                code=self.CODE,
                node=node,
                message=message or self.MESSAGE,
                replacement=replacement,
                safety=safety,
                fix_message=fix_message,
                add_imports=tuple(add_imports),
                remove_imports=tuple(remove_imports),
                why_unsafe=why_unsafe,
                related=tuple(related),
            )
        )


@functools.lru_cache(maxsize=None)
def visitor_names(visitor_class: type) -> tuple[str, ...]:
    """The ``visit_*``/``leave_*`` methods a visitor class defines (libcst's empty stubs left out).

    Read from the class dictionaries along the MRO rather than ``dir()``: ``dir()`` and a
    ``getattr`` for each of libcst's 1,600 stubs cost more than a millisecond per class.
    """
    candidates = {name for klass in visitor_class.__mro__ for name in _defined_visitor_names(klass)}
    return tuple(
        sorted(
            name
            for name in candidates
            if callable(getattr(visitor_class, name)) and not getattr(getattr(visitor_class, name), "_is_no_op", False)
        )
    )


@functools.lru_cache(maxsize=None)
def _defined_visitor_names(klass: type) -> tuple[str, ...]:
    """The ``visit_*``/``leave_*`` names ``klass`` itself defines, other than no-op stubs."""
    return tuple(
        name
        for name, value in vars(klass).items()
        if name.startswith(("visit_", "leave_")) and not getattr(value, "_is_no_op", False)
    )
