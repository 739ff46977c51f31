"""What every planning step is given: the file's tree, its classified apex.amp sites, the
decisions taken before anything is written (``Setup``; None while the sites are still being
read), and the ``Draft`` the steps write to. Only the draft changes.
"""
from __future__ import annotations

from collections.abc import Mapping

from typing import NamedTuple

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.draft import Draft
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import CORE, Partner, Setup


class Sites:
    """The file's references to apex.amp, classified once (``classify.classify``), then only read."""

    def __init__(self) -> None:
        self.calls: dict[str, list[cst.Call]] = {kind: [] for kind in CORE}  # `amp.scale_loss(...)` and the rest, by kind
        self.blockers: list[tuple[cst.CSTNode, str]] = []  # what keeps the file from being planned, and why
        self.escapes: list[tuple[cst.CSTNode, str]] = []  # the amp module handed on, and under what name
        self.alias_of: dict[int, str] = {}  # a site called on what received it -> that expression
        self.stand_in_calls: set[int] = set()  # sites called on `self.amp` standing in for the module
        self.stand_in_assignments: list[cst.CSTNode] = []  # `self.amp = amp` where `self.amp` only stands in for the module
        self.stand_ins_assigned_once = True  # no stand-in is assigned anywhere else (but `None`)
        self.scale_pokes: list[tuple[cst.CSTNode, cst.BaseExpression, cst.CSTNode]] = []  # statement, scale, `amp._amp_state...`
        self.scale_reads: list[tuple[cst.BaseExpression, cst.CSTNode]] = []  # `amp._amp_state.loss_scalers[0]._loss_scale`, and its ref
        self.probes: list[tuple[cst.If, cst.CSTNode]] = []  # `if "state_dict" in amp.__dict__:` tests that go, and `amp.__dict__`
        self.module_reads: list[cst.CSTNode] = []  # statements that only touch apex's module (`amp.init()` unused, a log line)
        self.legacy_handles: list[cst.Call] = []  # `amp.init()` calls whose handle is never used
        self.ids: frozenset[int] = frozenset()  # every site's call
        self.scale_loss_statements: frozenset[int] = frozenset()  # the statements holding `amp.scale_loss`
        self.timm_scalers: list[cst.Call] = []  # timm's `ApexScaler()`: it calls `amp.scale_loss` itself
        self.timm_native: str | None = None  # the name timm's `NativeScaler` has in the file, if imported

    def all_calls(self) -> list[cst.Call]:
        return [call for kind in CORE for call in self.calls[kind]]


class Context(NamedTuple):
    tree: FileTree
    sites: Sites
    draft: Draft
    setup: Setup | None  # None while the plan reads the sites, before it decides
    exact_levels: frozenset[str]  # the opt levels the rewrite keeps: O0, O1 (and O2 where accepted as autocast)
    partner: Partner | None  # the other half of apex amp, in another file
    handed_elsewhere: tuple = ()  # ``migrate.forward_callers.Handed``: what other files hand the file's functions
    levels_elsewhere: Mapping[str, str] = {}  # ``migrate.level_settings``: option names the project sets to O2/O3, with where
    gradient_norms: frozenset[str] = frozenset()  # ``migrate.grad_norms``: names the file calls that return a gradient norm


class Step:
    """A family of planning steps: it reads the tree, the sites and the setup, and writes the draft."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self.tree, self.sites, self.draft, self.setup = context.tree, context.sites, context.draft, context.setup
        self.exact_levels, self.partner = context.exact_levels, context.partner
        self.handed_elsewhere = context.handed_elsewhere

    def scaler_of(self, call: cst.Call) -> str:
        """The scaler a site uses: what received the handed-on module, the one of its loss id, or the plan's."""
        return self.sites.alias_of.get(id(call)) or self.setup.loss_scalers.get(id(call), self.setup.scaler)

    def fitted(self, replaced: cst.CSTNode, new: cst.Call) -> cst.Call:
        """``new``, to stand where ``replaced`` stood, laid out one argument a line where its
        line would otherwise pass the file's line length."""
        line = self.tree.line(replaced)
        if line is None or "\n" in nodes.code(replaced):
            return new
        if len(self.tree.source_lines[line - 1]) - len(nodes.code(replaced)) + len(nodes.code(new)) <= self.tree.line_limit:
            return new
        return nodes.one_argument_a_line(new, self.tree.indent_unit(replaced))
