"""The GradScaler handed to the functions that use it, as a person would write it: where
``main()`` ran ``amp.initialize`` and ``train()`` scaled the loss, ``main`` makes the scaler and
calls ``train(..., scaler=scaler)``, and ``train`` takes ``*, scaler: torch.amp.GradScaler``,
instead of a module global assigned through ``global scaler`` and a disabled one standing in at
module level until ``main`` has run.

Only where the file shows every way the scaler travels: each function using it is a plain
module-level function, undecorated, defined once, and named nowhere but in calls made by the
function that makes the scaler, after the statement that makes it (a top-level statement of that
function, so the scaler exists at every such call), or in calls made by another such function,
which then takes the scaler to hand it on; or a function defined inside the one making it, which
sees the scaler already, defined or called there after it is made. Anything else keeps the global.

A function that only builds (``build(args)`` initializes and ends ``return model, optimizer``,
its one caller unpacking them: ``model, optimizer = build(args)``) returns the scaler with them,
and that caller hands it on as if it had made it.
"""
from __future__ import annotations

from collections.abc import Mapping

import libcst as cst
from libcst.metadata import PositionProvider

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Step
from migrate.apex_plan.syntax import body_through_withs
from migrate.apex_plan.vocabulary import HELPER_SCALER, SCALE_LOSS, STATE_DICT, Unplannable
from migrate.tree_walk import descendants

_NO_SPACE = cst.SimpleWhitespace("")
_SPACE = cst.SimpleWhitespace(" ")


class ScalerParameterPlanning(Step):
    """Whether the scaler can be handed on as a parameter (``receivers``), and the edits that
    do it (``plan_parameters``): a keyword-only parameter on each receiver, a keyword argument
    at each of its calls."""

    def receivers(self, maker: cst.FunctionDef | None, made_at: cst.CSTNode,
                  sites: list[cst.CSTNode]) -> tuple[cst.FunctionDef, ...] | None:
        """The functions to hand the scaler made by ``made_at`` (a statement of ``maker``) to: those
        using it, and the plain functions on the way there (``main`` makes it, ``train`` calls
        ``train_epoch``, which calls ``train_step``, which scales); None where one of them could be
        reached another way. A function nested in ``maker`` sees its scaler already: it only has
        to be called after ``made_at``, by ``maker``."""
        if maker is None or not self._straight_in(made_at, maker):
            return None
        users = list({id(f): f for f in (self.tree.function(site) for site in sites) if f is not maker}.values())
        if not users or None in users:
            return None
        after = self.tree.order[id(made_at)]
        receiving: list[cst.FunctionDef] = []
        pending = list(users)
        while pending:
            user = pending.pop(0)
            nested = self._nested_in(user, maker)
            if not nested:
                if not self._plain_function(user):
                    return None
                receiving.append(user)
            elif self.tree.order[id(user)] > after:
                continue  # defined after the scaler is made: however it is called, it sees it
            calls = self._references(user.name.value, self.tree.parent.get(id(user)))
            if not calls or None in calls:
                return None
            for call in calls:
                if self.tree.inside(call, maker):
                    if self.tree.order[id(self.tree.statement(call))] <= after:
                        return None
                    continue
                caller = self.tree.function(call)
                if nested or caller is None:
                    return None
                if not any(caller is known for known in (*receiving, *pending)):
                    pending.append(caller)  # hands it on: takes it too
        return tuple(receiving)

    def received(self, entries: frozenset[str], sites: list[cst.CSTNode]) -> tuple[cst.FunctionDef, ...] | None:
        """The functions to hand a GradScaler made in another file to, which calls ``entries``
        (``migrate.apex_plan.handed_across``): those using it, and the plain functions on the way
        there from an entry, which this file never calls itself; None where one could be reached
        another way."""
        users = list({id(f): f for f in (self.tree.function(site) for site in sites)}.values())
        if not users or None in users:
            return None
        receiving: list[cst.FunctionDef] = []
        pending = list(users)
        while pending:
            user = pending.pop(0)
            if not self._plain_function(user):
                return None
            receiving.append(user)
            calls = self._references(user.name.value, self.tree.parent.get(id(user)))
            if user.name.value in entries:
                if calls:
                    return None  # called here too, where no scaler is handed to it
                continue
            if not calls or None in calls:
                return None
            for call in calls:
                caller = self.tree.function(call)
                if caller is None:
                    return None
                if not any(caller is known for known in (*receiving, *pending)):
                    pending.append(caller)  # hands it on: takes it too
        return tuple(receiving)

    def returned(self, builder: cst.FunctionDef | None, made_at: cst.CSTNode, sites: list[cst.CSTNode], scaler: str
                 ) -> tuple[cst.FunctionDef, tuple[cst.FunctionDef, ...], tuple[cst.FunctionDef, cst.Tuple, cst.Tuple]] | None:
        """Where ``builder`` makes the scaler (at ``made_at``) and returns a tuple from its last
        statement, its only return, to one caller unpacking it at a top-level statement: that
        caller, which gets the scaler back too, the functions it hands it to (``receivers``), and
        the builder with the two tuples the scaler joins. None where the scaler could be read
        before it exists there, or reach it another way."""
        if builder is None or not self._plain_function(builder) or not self._straight_in(made_at, builder):
            return None
        ending = builder.body.body[-1]
        returned = ending.body[0].value if isinstance(ending, cst.SimpleStatementLine) and isinstance(ending.body[0], cst.Return) else None
        own = descendants(builder, lambda node: node is builder or not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)))
        if (not _unpackable(returned) or sum(isinstance(node, cst.Return) for node in own) != 1
                or self.tree.order[id(made_at)] > self.tree.order[id(ending)]):
            return None
        calls = self._references(builder.name.value, self.tree.parent.get(id(builder)))
        unpacking = self.tree.statement(calls[0]) if len(calls) == 1 and calls[0] is not None else None
        assign = unpacking.body[0] if isinstance(unpacking, cst.SimpleStatementLine) and len(unpacking.body) == 1 else None
        if (not isinstance(assign, cst.Assign) or assign.value is not calls[0] or len(assign.targets) != 1
                or not _unpackable(assign.targets[0].target) or len(assign.targets[0].target.elements) != len(returned.elements)):
            return None
        caller = self.tree.function(unpacking)
        if caller is None or not self._straight_in(unpacking, caller) or any(
                type(node) is cst.Name and node.value == scaler for node in descendants(caller)):
            return None
        for site in sites:  # read where it exists: after it is made, after the call hands it back
            where = self.tree.function(site)
            since = made_at if where is builder else unpacking if where is caller else None
            if since is not None and self.tree.order[id(self.tree.statement(site))] <= self.tree.order[id(since)]:
                return None
        rest = [site for site in sites if self.tree.function(site) not in (builder, caller)]
        receivers = self.receivers(caller, unpacking, rest) if rest else ()
        return None if receivers is None else (caller, receivers, (builder, returned, assign.targets[0].target))

    def _straight_in(self, statement: cst.CSTNode, function: cst.FunctionDef) -> bool:
        """Whether ``statement`` runs whenever ``function`` gets that far (``body_through_withs``)."""
        return body_through_withs(self.tree.parent, statement) is function

    def _nested_in(self, function: cst.FunctionDef, maker: cst.FunctionDef) -> bool:
        """Defined inside ``maker``, through functions only (a class there has its own scope)."""
        node = self.tree.parent.get(id(function))
        while node is not None and node is not maker:
            if isinstance(node, (cst.ClassDef, cst.Lambda)):
                return False
            node = self.tree.parent.get(id(node))
        return node is maker

    def plan_parameters(self) -> None:
        scalers = (self.setup.scaler, *self.setup.extra_scalers)  # apex's per-loss scalers: one per loss id
        if self.setup.scaler_returned is not None:  # returned with what it built, and unpacked with it
            builder, returned, target = self.setup.scaler_returned
            for node, what in ((returned, "Return it"), (target, "Take it back")):
                elements = list(node.elements)
                for scaler in scalers:  # after the last, whose trailing comma (if any) now separates
                    last = elements[-1]
                    comma = last.comma if isinstance(last.comma, cst.Comma) else cst.Comma()
                    if isinstance(comma.whitespace_after, cst.SimpleWhitespace) and not comma.whitespace_after.value:
                        comma = comma.with_changes(whitespace_after=_SPACE)
                    elements[-1] = last.with_changes(comma=comma)
                    elements.append(cst.Element(cst.Name(scaler)))
                self.draft.replace(node, node.with_changes(elements=elements))
                self.draft.kind(node, SCALE_LOSS, f"`{builder.name.value}` makes the GradScaler that replaces `amp.initialize`",
                                f"{what} with the rest: `{', '.join(scalers)}`")
        taken = ", ".join(f"{scaler}: torch.amp.GradScaler" for scaler in scalers)
        for user in self.setup.scaler_receivers:
            params = user.params
            separator = self._separator([*params.posonly_params, *params.params], len(f", *, {taken}):"))
            for scaler in scalers:
                parameter = cst.Param(cst.Name(scaler), annotation=cst.Annotation(
                    cst.parse_expression("torch.amp.GradScaler"), whitespace_before_indicator=_NO_SPACE))
                params = _with_parameter(params, parameter, separator)
            self.draft.replace(user.params, params)
            self.draft.kind(user.params, SCALE_LOSS, f"`{user.name.value}` uses the GradScaler that replaces `amp.initialize`",
                            f"Take it as the parameter `{scalers[0]}`" if len(scalers) == 1 else
                            f"Take them as the parameters {', '.join(f'`{scaler}`' for scaler in scalers)}")
            for call in self._references(user.name.value, self.tree.module):
                self.pass_scaler(call, user.name.value)

    def pass_scaler(self, call: cst.Call, name: str) -> None:
        """``call`` of the function ``name``, which takes the GradScaler, passes it: ``scaler=scaler``."""
        scalers = (self.setup.scaler, *self.setup.extra_scalers)
        given = ", ".join(f"{scaler}={scaler}" for scaler in scalers)
        separator = self._separator(list(call.args), len(f", {given})"))
        args = list(call.args)
        for scaler in scalers:
            argument = cst.Arg(cst.Name(scaler), keyword=cst.Name(scaler),
                               equal=cst.AssignEqual(whitespace_before=_NO_SPACE, whitespace_after=_NO_SPACE))
            args = appended(args, argument, separator)
        self.draft.replace(call, call.with_changes(args=args))
        self.draft.kind(call, SCALE_LOSS, f"`{name}` uses the GradScaler made here", f"Pass it on: `{given}`")

    def helper_calls(self, spellings: Mapping[str, str]) -> list[cst.Call]:
        """The calls of another file's checkpoint helpers that take the scaler (``migrate.state_helpers``:
        ``save_checkpoint(...)``, ``utils.load_checkpoint(...)``, as this file spells them)."""
        if not spellings:
            return []
        return [node for node in descendants(self.tree.module) if isinstance(node, cst.Call) and nodes.code(node.func) in spellings]

    def plan_helper_arguments(self, calls: list[cst.Call], spellings: Mapping[str, str]) -> None:
        """Each call of another file's checkpoint helper passes the GradScaler, whose state the
        helper saves or loads where apex's was: ``save_checkpoint(..., scaler=scaler)``."""
        if calls and (self.setup.o0 or self.setup.scaler is None or self.setup.extra_scalers):
            raise Unplannable(calls[0], f"`{nodes.code(calls[0].func)}` in {spellings[nodes.code(calls[0].func)]} keeps "
                              "apex's loss-scaler state, and this file has no single GradScaler to hand it")
        given = f"{HELPER_SCALER}={self.setup.scaler}"
        for call in calls:
            argument = cst.Arg(nodes.parse_expression(self.setup.scaler, self.tree.module), keyword=cst.Name(HELPER_SCALER),
                               equal=cst.AssignEqual(whitespace_before=_NO_SPACE, whitespace_after=_NO_SPACE))
            args = appended(list(call.args), argument, self._separator(list(call.args), len(f", {given})")))
            self.draft.replace(call, call.with_changes(args=args))
            self.draft.kind(call, STATE_DICT, f"`{nodes.code(call.func)}` in {spellings[nodes.code(call.func)]} saves or "
                            "loads apex's loss-scaler state", f"Pass it the GradScaler: `{given}`")

    def _separator(self, items: list, added: int) -> cst.Comma:
        """The comma after the last of ``items`` (arguments or parameters) where something is
        added after it: a line break, aligned with the first item on its line, where ``added``
        more characters would pass the file's line length."""
        plain = cst.Comma(whitespace_after=_SPACE)
        if not items:
            return plain
        end = self.tree.provider.get_metadata(PositionProvider, items[-1]).end
        if end.column + added <= self.tree.line_limit:
            return plain
        first = next(item for item in items if self.tree.line(item) == end.line)
        column = self.tree.line_indent(first) - self.tree.line_indent(self.tree.statement(first))
        return cst.Comma(whitespace_after=cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(" " * column)))

    def _plain_function(self, function: cst.FunctionDef) -> bool:
        if self.tree.parent.get(id(function)) is not self.tree.module or function.decorators or function.params.posonly_params:
            return False
        name = function.name.value  # defined once: `_references` says so
        return name not in self.tree.assigned and name not in self.tree.imports

    def _references(self, name: str, scope: cst.CSTNode) -> list[cst.Call | None]:
        """Every use of ``name`` in the file but its definitions: the call it is the callee of,
        or None where it is read any other way (handed on, stored, rebound, declared global) or
        defined twice in ``scope``, the block its function is defined in."""
        def answer() -> list[cst.Call | None]:
            found: list[cst.Call | None] = []
            definitions = 0
            for node in descendants(self.tree.module):
                if type(node) is cst.Name and node.value == name:
                    holder = self.tree.parent.get(id(node))
                    if isinstance(holder, cst.FunctionDef) and holder.name is node:
                        definitions += self.tree.parent.get(id(holder)) is scope
                        continue
                    if isinstance(holder, cst.Attribute) and holder.attr is node:
                        continue  # `obj.train(...)`: another object's attribute
                    if isinstance(holder, cst.Arg) and holder.keyword is node:
                        continue  # `f(train=...)`: a keyword
                    found.append(holder if isinstance(holder, cst.Call) and holder.func is node else None)
            return found if definitions == 1 else [None]
        return self.tree.per_scope(("references", name, id(scope)), answer)


def _unpackable(node: cst.CSTNode | None) -> bool:
    """A tuple (or list) of plain elements, that one more can be added to: ``model, optimizer``."""
    return (isinstance(node, (cst.Tuple, cst.List)) and bool(node.elements)
            and not any(isinstance(element, cst.StarredElement) for element in node.elements))


def _with_parameter(params: cst.Parameters, new: cst.Param, separator: cst.Comma) -> cst.Parameters:
    """``params`` taking ``new`` too: last, or keyword-only after parameters with defaults
    (``def train(model, amp=False, *, scaler)``), before ``**kwargs``; ``separator`` follows
    the last parameter before it, unless that one has a trailing comma (one parameter a line),
    whose layout the new one follows."""
    star = params.star_arg if isinstance(params.star_arg, (cst.Param, cst.ParamStar)) else None
    keyword_only = (star is not None or bool(params.kwonly_params) or params.star_kwarg is not None
                    or any(param.default is not None for param in params.params))
    if params.star_kwarg is not None:  # before `**kwargs`: the commas there stay as they are
        return params.with_changes(kwonly_params=[*params.kwonly_params, new]) if star is not None \
            else params.with_changes(star_arg=cst.ParamStar(), kwonly_params=[*params.kwonly_params, new])
    fields = [("params", params.params), ("star_arg", [star] if star is not None else []), ("kwonly_params", params.kwonly_params)]
    elements = [element for _, found in fields for element in found]
    if not elements:
        return params.with_changes(params=[new])
    last_field = next(name for name, found in reversed(fields) if found)
    last = elements[-1]
    if isinstance(last.comma, cst.Comma):
        between = next((e.comma for e in reversed(elements[:-1]) if isinstance(e.comma, cst.Comma)), separator)
        before, after = _commas_kept(between, last.comma)
        new = new.with_changes(comma=after)
    else:
        before = separator
    if last_field == "star_arg":
        params = params.with_changes(star_arg=last.with_changes(comma=before))
    else:
        found = list(getattr(params, last_field))
        params = params.with_changes(**{last_field: [*found[:-1], found[-1].with_changes(comma=before)]})
    if not keyword_only:
        return params.with_changes(params=[*params.params, new])
    if star is None:
        star_comma = _uncommented(before) if isinstance(last.comma, cst.Comma) else cst.Comma(whitespace_after=_SPACE)
        return params.with_changes(star_arg=cst.ParamStar(comma=star_comma), kwonly_params=[new])
    return params.with_changes(kwonly_params=[*params.kwonly_params, new])


def appended(items: list, new, separator: cst.Comma) -> list:
    """``items`` (arguments or parameters) with ``new`` last, after ``separator``; a trailing
    comma (one item a line) stays last."""
    if not items:
        return [new]
    last = items[-1]
    if isinstance(last.comma, cst.Comma):
        between = items[-2].comma if len(items) > 1 and isinstance(items[-2].comma, cst.Comma) else last.comma
        before, after = _commas_kept(between, last.comma)
        return [*items[:-1], last.with_changes(comma=before), new.with_changes(comma=after)]
    # the space or line break before the closing parenthesis moves after the new item
    after = "whitespace_after_arg" if isinstance(last, cst.Arg) else "whitespace_after_param"
    closing = getattr(last, after)
    return [*items[:-1], last.with_changes(comma=separator, **{after: cst.SimpleWhitespace("")}), new.with_changes(**{after: closing})]


def _commas_kept(between: cst.Comma, last: cst.Comma) -> tuple[cst.Comma, cst.Comma]:
    """The commas after the last item and after the one added below it, one item a line: the last
    keeps its own comment (``data,  # the batches``) on a line break indented as ``between``'s
    (the one before it), and the new one ends the list as ``last`` did, with no comment."""
    own, lines = last.whitespace_after, between.whitespace_after
    if not (isinstance(own, cst.ParenthesizedWhitespace) and isinstance(lines, cst.ParenthesizedWhitespace)):
        return between, last
    kept = between.with_changes(whitespace_after=lines.with_changes(first_line=own.first_line, empty_lines=[]))
    return kept, _uncommented(last)


def _uncommented(comma: cst.Comma) -> cst.Comma:
    """``comma`` ending its line with no comment (a new item's: the comment was another's)."""
    space = comma.whitespace_after
    return comma.with_changes(whitespace_after=space.with_changes(first_line=cst.TrailingWhitespace())) \
        if isinstance(space, cst.ParenthesizedWhitespace) else comma
