"""What removing an apex import guarded by ``try``/``except ImportError`` changes for a run without apex.

``try: from apex import amp`` / ``except ImportError: has_apex = False``: where apex was not
installed, the ``except`` branch turned mixed precision off (or a flag it sets stopped a run that
asked for it, read only in an ``assert`` or in an ``if`` that raises). Native torch.amp needs no
install, so those runs now use mixed precision, or go on: the import's fix says so.
"""
from __future__ import annotations

import functools

import libcst as cst

from migrate.apex_nodes import apex_import, code, import_error_fallback
from migrate.tree_walk import children, descendants

__all__ = ["arm_change", "fallback_change", "fallback_change_first"]


def fallback_change(module: cst.Module, node: cst.Try) -> str | None:
    """What removing the apex import that ``node`` guards changes for a run without apex: its
    ``except`` branch's assignments turned mixed precision off, or, where the flags they set are
    read only to stop a run (``assert not fp16 or has_apex``, ``if not is_apex_available(): raise``),
    stopped a run asking for it.
    Where the ``try`` also imports other things of apex's, it fails without apex until their own
    fixes remove them too: the change is said to come then. None where the file imports apex
    outside any guard as well: no run took the ``except`` branch."""
    fallback, skipped = import_error_fallback(node), _skipped_without_apex(node)
    if fallback is None and not skipped or _imports_apex_anyway(module):
        return None
    others = _other_apex_imports(module, node)
    when, then = ((f"behaviour change once this `try`'s other apex imports ({', '.join(f'`{name}`' for name in others)}) "
                   "go too", "then") if others else ("behaviour change", "now"))
    lines = [line for handler in node.handlers for line in handler.body.body]
    flags = {target.target.value for line in lines if isinstance(line, cst.SimpleStatementLine) for small in line.body
             if isinstance(small, cst.Assign) for target in small.targets if isinstance(target.target, cst.Name)}
    flags |= {target.target.value for small in skipped for target in small.targets if isinstance(target.target, cst.Name)}
    stop = _read_only_to_stop(module, flags) if flags else None
    if stop is not None:
        listed = ", ".join(f"`{flag}`" for flag in sorted(flags))
        stopped = f"an `assert` on {listed} stopped" if stop == "assert" else f"a test of {listed} raised and stopped"
        return (f"{when}: where apex was not installed, {stopped} runs asking for mixed precision; "
                f"native torch.amp needs no install, so those runs {then} go on")
    # `has_apex = False` before the `try` and `has_apex = True` after the import in it: the failed import skipped it
    what = f"`{fallback}`" if fallback is not None else f"skipping `{'; '.join(code(small) for small in skipped)}` after the import"
    return (f"{when}: where apex was not installed, {what} turned mixed precision off; "
            f"native torch.amp needs no install, so those runs {then} use it")


def fallback_change_first(first_source: str | None, module: cst.Module, node: cst.Try) -> str | None:
    """``fallback_change`` of a ``try`` whose apex import a fix of an earlier round removed, asked
    of the file as it was before any fix (``first_source``), where a ``try`` with the same handlers
    guarded an apex import: what showed what the ``except`` branch did (``if amp is None: raise``,
    an unguarded ``import apex``) may be gone with it."""
    first = _parsed(first_source) if first_source else None
    handlers = [code(handler) for handler in node.handlers]
    for candidate in descendants(first) if first is not None else ():
        if type(candidate) is cst.Try and [code(handler) for handler in candidate.handlers] == handlers and any(
                type(small) in (cst.Import, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar)
                and any(apex_import(small, alias) for alias in small.names)
                for line in candidate.body.body if type(line) is cst.SimpleStatementLine for small in line.body):
            return fallback_change(first, candidate)
    return fallback_change(module, node)


def arm_change(first_source: str | None, module: cst.Module, dropped: cst.CSTNode | None) -> str | None:
    """What keeping apex's arm of an availability test (``if amp is None: ...``) changes for a run
    without apex, where ``dropped`` is the arm that ran there: it raised and stopped the run, or it
    ran instead; nothing where the file imports apex outside any guard as well (as it was before
    any fix, ``first_source``), as it then never ran without apex."""
    first = _parsed(first_source) if first_source else None
    if _imports_apex_anyway(first if first is not None else module) is not None:
        return None
    lines = [line for line in getattr(getattr(dropped, "body", None), "body", ()) if type(line) is cst.SimpleStatementLine]
    if lines and any(type(small) is cst.Raise for small in lines[-1].body):
        return ("behaviour change: where apex was not installed, this test raised and stopped the run; "
                "native torch.amp needs no install, so those runs now go on")
    return ("behaviour change: where apex was not installed, the other arm ran; "
            "native torch.amp needs no install, so those runs now take apex's")


@functools.lru_cache(maxsize=2)  # a file's first text, asked of by each later round's findings
def _parsed(source: str) -> cst.Module | None:
    try:
        return cst.parse_module(source)
    except (cst.ParserSyntaxError, RecursionError):
        return None


def _imports_apex_anyway(module: cst.Module) -> str | None:
    """A line of the module's own (not in a ``try``, an ``if`` or a function) importing apex
    (``import apex``, ``from apex import pyprof``): without apex the file never ran, so no run
    took the ``except`` branch."""
    for line in module.body:
        for small in line.body if type(line) is cst.SimpleStatementLine else ():
            if type(small) is cst.ImportFrom and small.module is not None and not small.relative and (
                    code(small.module) == "apex" or code(small.module).startswith("apex.")):
                return code(small)
            if type(small) is cst.Import and any(apex_import(small, alias) is not None for alias in small.names):
                return code(small)
    return None


def _other_apex_imports(module: cst.Module, node: cst.Try) -> list[str]:
    """What ``node``'s body imports of apex's besides ``amp`` (``apex.parallel.DistributedDataParallel``);
    for ``import apex``, what the file reads of it besides ``amp`` (``apex.parallel``)."""
    found = [imported for line in node.body.body if isinstance(line, cst.SimpleStatementLine)
             for small in line.body if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar)
             for alias in small.names if (imported := apex_import(small, alias)) is not None]
    others = []
    for bound, change in found:
        if change.module == "apex" and change.obj is None:
            others += [f"apex.{name}" for name in sorted(_attributes_read(module, bound) - {"amp"})]
        elif not (change.module.split(".")[:2] == ["apex", "amp"] or (change.module == "apex" and change.obj == "amp")):
            others.append(f"{change.module}.{change.obj}" if change.obj else change.module)
    return others


def _attributes_read(module: cst.Module, name: str) -> set[str]:
    """The attributes of ``name`` the file reads: ``{"amp", "parallel"}`` for ``apex.amp.initialize``, ``apex.parallel.X``."""
    return {node.attr.value for node in descendants(module) if type(node) is cst.Attribute
            and type(node.value) is cst.Name and node.value.value == name}


def _skipped_without_apex(node: cst.Try) -> list[cst.Assign]:
    """The assignments in ``node``'s body after its apex import, which a failed import skipped."""
    body = [line for line in node.body.body if isinstance(line, cst.SimpleStatementLine)]
    at = next((i for i, line in enumerate(body) for small in line.body if isinstance(small, (cst.Import, cst.ImportFrom))
               and not isinstance(small.names, cst.ImportStar) and any(apex_import(small, alias) for alias in small.names)), None)
    return [] if at is None else [small for line in body[at + 1:] for small in line.body if isinstance(small, cst.Assign)]


def _read_only_to_stop(module: cst.Module, names: set[str]) -> str | None:
    """Whether ``names`` are read somewhere in ``module``, and only to stop a run: in an ``assert``'s
    test, in the test of an ``if`` whose block raises (``if args.fp16 and not has_apex: raise``), or
    returned by a function (``def is_apex_available(): return _has_apex``) whose every call is read
    so (``if not is_apex_available(): raise ImportError(...)``). ``"assert"`` where each read is
    an ``assert``'s, ``"raise"`` where any is an ``if``'s; None where one is read otherwise. Where
    the fallback binds apex's own name (``amp = None``), its uses (``amp.initialize``) test nothing."""
    parents = _parents(module)
    reads = _reads(module, names, parents)
    returned = [read for read in reads if _returned(read, parents)]
    reads = [read for read in reads if not _returned(read, parents)]
    # a function returning the flag stands for it where that is all it reads of it
    otherwise = {id(_function_of(read, parents)) for read in reads}
    returned_by = {function.name.value for read in returned
                   if (function := _function_of(read, parents)) is not None and id(function) not in otherwise}
    calls = [node for node in descendants(module) if type(node) is cst.Call and type(node.func) is cst.Name
             and node.func.value in returned_by]
    if not reads and not calls:
        return None
    stops = {_stops(node, parents) for node in (*reads, *calls)}
    return None if None in stops else "raise" if "raise" in stops else "assert"


def _reads(root: cst.CSTNode, names: set[str], parents: dict[int, cst.CSTNode]) -> list[cst.Name]:
    """The reads of ``names`` in ``root`` that test them: not ``flag = False``, which binds, nor
    ``from apex import amp``, nor ``amp.initialize``, a use of the module a fallback's ``amp =
    None`` stands in for."""
    bound = {id(target.target) for target in descendants(root) if type(target) is cst.AssignTarget}
    return [node for node in descendants(root) if type(node) is cst.Name and node.value in names and id(node) not in bound
            and type(parent := parents.get(id(node))) not in (cst.ImportAlias, cst.AsName)
            and not (type(parent) is cst.Attribute and (parent.value is node or parent.attr is node))
            and not (type(parent) is cst.Arg and parent.keyword is node)]  # `args.amp`, `f(amp=...)`: other names


def _function_of(node: cst.CSTNode, parents: dict[int, cst.CSTNode]) -> cst.FunctionDef | None:
    while (node := parents.get(id(node))) is not None and type(node) is not cst.FunctionDef:
        pass
    return node


def _returned(read: cst.Name, parents: dict[int, cst.CSTNode]) -> bool:
    """``return flag`` (``return not flag``)."""
    parent = parents.get(id(read))
    if type(parent) is cst.UnaryOperation:
        parent = parents.get(id(parent))
    return type(parent) is cst.Return


def _parents(module: cst.Module) -> dict[int, cst.CSTNode]:
    return {id(child): node for node in descendants(module) for child in children(node)}


def _stops(node: cst.CSTNode, parents: dict[int, cst.CSTNode]) -> str | None:
    """``"assert"`` where ``node`` is read in an ``assert``'s test, ``"raise"`` in the test of an
    ``if`` whose block raises; else None."""
    inner, outer = node, parents.get(id(node))
    while outer is not None and not isinstance(outer, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
        inner, outer = outer, parents.get(id(outer))
    if type(outer) is cst.Assert:
        return "assert"
    if type(outer) is cst.If and inner is outer.test and any(
            type(line) is cst.SimpleStatementLine and any(type(small) is cst.Raise for small in line.body) for line in outer.body.body):
        return "raise"
    return None
