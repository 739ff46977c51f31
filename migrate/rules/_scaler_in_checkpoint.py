"""AMP107's fix: the GradScaler's state saved beside the optimizer's, in the checkpoint's own dict.

Safe only where the scaler is certain to exist when the checkpoint is written: every binding of
its name that the save can see makes a GradScaler, and one of them runs first on every path (a
top-level statement of the module, of the function before the save, or of ``__init__`` for
``self.scaler``), or it is a parameter annotated as a GradScaler, with no default. Any other
parameter, a scaler made in a branch, or one local to another function: no fix.
"""
from __future__ import annotations

from typing import Callable

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.flow.bindings import bindings, bound_value
from migrate.step_model.shapes import parameters_of
from migrate.tree_walk import descendants

_KEYS = ("scaler", "grad_scaler", "amp_scaler")


def scaler_in_reach(call: cst.Call, parent_of: Callable[[cst.CSTNode], cst.CSTNode | None],
                    candidates: list[str]) -> str | None:
    """The one name among ``candidates`` that holds a GradScaler wherever ``call`` runs;
    ``parent_of`` gives a node's parent (the rule's ``ParentNodeProvider``)."""
    chain = [call]
    while (parent := parent_of(chain[-1])) is not None:
        chain.append(parent)
    chain.reverse()  # from the module down to the call
    if not isinstance(chain[0], cst.Module):
        return None
    found = [name for name in dict.fromkeys(candidates) if _holds_scaler(chain, name)]
    return found[0] if len(found) == 1 else None


def with_scaler_entry(saved: cst.Dict, scaler: str, module: cst.Module) -> cst.Dict | None:
    """``saved`` with ``"scaler": scaler.state_dict()`` added last, written as its entries are.
    None: every key this would use is taken."""
    keys = {nodes.literal_string(e.key) for e in saved.elements if isinstance(e, cst.DictElement)}
    key = next((k for k in _KEYS if k not in keys), None)
    entries = [e for e in saved.elements if isinstance(e, cst.DictElement)]
    if key is None or len(entries) != len(saved.elements) or not entries:
        return None
    quote = next((q for e in entries if isinstance(e.key, cst.SimpleString)
                  for q in ("'", '"') if e.key.value.startswith(q)), '"')
    last = entries[-1]
    added = last.with_changes(key=cst.SimpleString(f"{quote}{key}{quote}"),
                              value=nodes.parse_expression(f"{scaler}.state_dict()", module))
    separator = entries[-2].comma if len(entries) > 1 else cst.MaybeSentinel.DEFAULT
    if not isinstance(separator, cst.Comma):
        separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return saved.with_changes(elements=[*entries[:-1], last.with_changes(comma=separator), added])


def one_per_line(saved: cst.Dict, module: cst.Module) -> cst.Dict:
    """The dict with each entry on its own line, indented one level below the statement."""
    indent = module.default_indent
    line = cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(), indent=True,
        last_line=cst.SimpleWhitespace(indent))
    closing = cst.ParenthesizedWhitespace(first_line=cst.TrailingWhitespace(), indent=True,
                                          last_line=cst.SimpleWhitespace(""))
    elements = [e.with_changes(comma=cst.Comma(whitespace_after=line if i < len(saved.elements) - 1 else closing))
                for i, e in enumerate(saved.elements)]
    return saved.with_changes(lbrace=cst.LeftCurlyBrace(whitespace_after=line), elements=elements,
                              rbrace=cst.RightCurlyBrace())


def _holds_scaler(chain: list[cst.CSTNode], name: str) -> bool:
    functions = [n for n in chain if isinstance(n, (cst.FunctionDef, cst.Lambda))]
    if name.startswith("self.") and name.count(".") == 1:
        return bool(functions) and _attribute_holds_scaler(chain, functions[-1], name)
    if not name.isidentifier():
        return False
    for function in reversed(functions):
        if isinstance(function, cst.Lambda):
            return False
        taken = _parameter(function, name)
        if taken is not None:  # `scaler: torch.amp.GradScaler`, with no default: every caller passes one
            return (taken.default is None and taken.annotation is not None
                    and nodes.code(taken.annotation.annotation).endswith("GradScaler"))
        bound = _bindings(function.body, name)
        if _declares_global(function, name):
            break
        if bound:
            return _all_scalers(bound) and _made_first(function.body.body, bound, chain, later=False)
    module = chain[0]
    bound = _bindings(module, name)
    for function in descendants(module):
        if isinstance(function, cst.FunctionDef) and _declares_global(function, name):
            bound += _bindings(function.body, name)  # `global scaler` there: it binds this one
    return bool(bound) and _all_scalers(bound) and _made_first(module.body, bound, chain, later=True)


def _attribute_holds_scaler(chain: list[cst.CSTNode], method: cst.FunctionDef, name: str) -> bool:
    params = method.params.params
    if not params or params[0].name.value != "self":
        return False
    at = chain.index(method)
    owner = chain[at - 2] if at >= 2 else None  # ClassDef > IndentedBlock > FunctionDef
    if not isinstance(owner, cst.ClassDef):
        return False
    bound = _bindings(owner.body, name, methods=True)
    init = next((s for s in owner.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
    if not bound or not _all_scalers(bound) or init is None or not isinstance(init.body, cst.IndentedBlock):
        return False
    return any(_binds(statement, name) for statement in init.body.body)


def _bindings(root: cst.CSTNode, name: str, *, methods: bool = False) -> list[cst.CSTNode]:
    """The values bound to ``name`` in ``root`` (``flow.bindings``), each binding whose value
    cannot be seen (a loop target, ``with ... as``, unpacking) as itself."""
    return [bound_value(binding, name) for binding in bindings(root, name, methods=methods)]


def _all_scalers(values: list[cst.CSTNode]) -> bool:
    return all(isinstance(v, cst.Call) and nodes.call_name(v).endswith("GradScaler") for v in values)


def _binds(statement: cst.CSTNode, name: str) -> bool:
    return (isinstance(statement, cst.SimpleStatementLine)
            and any(isinstance(small, cst.Assign) and any(nodes.code(t.target) == name for t in small.targets)
                    for small in statement.body))


def _made_first(body, bound: list[cst.CSTNode], chain: list[cst.CSTNode], *, later: bool) -> bool:
    """Whether a top-level statement of ``body`` binds the scaler before the one holding the save;
    ``later``: a function or class defined there runs after them all (a module's top level)."""
    body = list(body.body) if isinstance(body, cst.IndentedBlock) else list(body)
    holding = next((i for i, statement in enumerate(body) if statement in chain), None)
    made = [i for i, statement in enumerate(body)
            if isinstance(statement, cst.SimpleStatementLine)
            and any(isinstance(small, cst.Assign) and small.value in bound for small in statement.body)]
    if not made:
        return False
    if holding is None:
        return False
    if later and isinstance(body[holding], (cst.FunctionDef, cst.ClassDef)):
        return True  # the save runs when the function is called, after the module has run
    return min(made) < holding


def _parameter(function: cst.FunctionDef, name: str) -> cst.Param | None:
    params = function.params
    every = parameters_of(function) + [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    return next((p for p in every if p.name.value == name), None)


def _declares_global(function: cst.FunctionDef, name: str) -> bool:
    return any(isinstance(node, (cst.Global, cst.Nonlocal)) and any(n.name.value == name for n in node.names)
               for node in descendants(function.body))
