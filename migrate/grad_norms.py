"""Functions that return the norm of their first argument's gradients: ``get_grad_norm(params)``.

A training loop that logs the gradient norm at every micro-batch (``norm = get_grad_norm(
amp.master_params(optimizer))``, the step every fourth) read true gradients under apex. Natively
they stay multiplied by the loss scale until the step, and ``unscale_`` may run once per step;
but a norm of the scaled gradients is the true norm times the scale, so the value divided by
``scaler.get_scale()`` is exact. That holds only for a function whose result scales as its
gradients do (degree one): a norm, a maximum, a sum of absolute values; not a count of
non-finite entries, not anything that writes to the gradients.

Each function is read with ``ast``, tracking how each value's size grows with the gradients':
``p.grad`` grows as ``s``, ``x.norm(k)`` as its argument, ``x ** e`` as the ``e``-th power (``e``
may name a parameter: ``total ** (1. / norm_type)`` undoes ``norm ** norm_type``), a sum only
of terms that grow alike. The result must grow as ``s`` on every ``return``. Anything else done
with a gradient-derived value (a call not known to be homogeneous, a write, a ``try``) and the
function is not counted: a norm may be missed, never invented.
"""
from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from fractions import Fraction
from pathlib import Path

from migrate import disk_reads, quiet
from migrate.module_paths import PROJECT_FOLDERS_UP, find_on_disk, parsed_module

__all__ = ["SETTING", "defined_norms", "elsewhere", "is_gradient_norm"]

SETTING = "gradient-norm-helpers"  # the names a file imports that return a gradient norm (not a user setting)


# Methods and functions whose result grows as their (first) argument does, and by what power.
_SAME = frozenset({"norm", "abs", "detach", "float", "double", "item", "max", "amax", "sum", "clone", "cpu",
                   "to", "flatten", "view", "reshape", "contiguous", "vector_norm", "stack", "cat", "tensor",
                   "as_tensor", "fabs"})
_POWERS = {"sqrt": Fraction(1, 2), "square": Fraction(2)}
_METADATA = frozenset({"device", "dtype", "shape", "is_sparse", "ndim"})  # fields that do not grow
_OWN_FUNCTIONS = frozenset({"max", "sum", "float", "abs"})  # builtins of the same kind


class _NotANorm(Exception):
    """Raised on the first thing the reading cannot vouch for."""


# A growth: a coefficient and symbols raised to integer powers (``norm_type``), as ``(c, ((name, power), ...))``.
_Growth = tuple


def _growth(number: Fraction, symbols: Mapping[str, int] | None = None) -> _Growth:
    return number, tuple(sorted((name, power) for name, power in (symbols or {}).items() if power))


def _times(a: _Growth, b: _Growth) -> _Growth:
    symbols = dict(a[1])
    for name, power in b[1]:
        symbols[name] = symbols.get(name, 0) + power
    return _growth(a[0] * b[0], symbols)


def _inverse(a: _Growth) -> _Growth:
    if a[0] == 0:
        raise _NotANorm
    return _growth(1 / a[0], {name: -power for name, power in a[1]})


_ONE = _growth(Fraction(1))
_ZERO = "zero"  # a literal 0: a sum may start from it whatever its terms grow as


class _Reading:
    """One function's body, read once: which names hold the parameters, one parameter, a
    gradient-derived value (and how it grows), or a symbol usable as an exponent."""

    def __init__(self, function: ast.FunctionDef, norms: frozenset[str] = frozenset()) -> None:
        self.norms = norms  # the module's functions known to be norms (`def measure(p): return grad_norm(p)`)
        arguments = [*function.args.posonlyargs, *function.args.args]
        if not arguments:
            raise _NotANorm
        self.collections = {arguments[0].arg}  # names holding the parameters (filtered, listed)
        self.items: set[str] = set()  # a name bound to one parameter (`for p in parameters`)
        self.symbols = {a.arg: a.arg for a in (*arguments[1:], *function.args.kwonlyargs)}  # name -> the parameter it copies
        self.env: dict[str, frozenset] = {}  # a name -> how the values it may hold here grow
        self.jumped: list[dict[str, frozenset]] = []  # `env` at each `continue`/`break` of the loop read now
        self.returned: list = []
        self.block(function.body)

    # statements: `env` follows the flow (arms merged, a loop's body taken twice)

    def block(self, statements: list[ast.stmt]) -> None:
        for statement in statements:
            self.statement(statement)

    def statement(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return  # a docstring
        if isinstance(node, ast.Pass):
            return
        if isinstance(node, (ast.Continue, ast.Break)):
            self.jumped.append(dict(self.env))
            return
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self.bind(node.targets[0].id, node.value)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and isinstance(node.op, ast.Add):
            name = node.target.id
            if name in self.collections or name in self.items or name in self.symbols:
                raise _NotANorm
            self.env[name] = frozenset({self.alike([self.value(node.target), self.value(node.value)])})
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and not node.orelse:
            if not self.is_collection(node.iter):
                raise _NotANorm  # a loop over anything else: not read
            self.items.add(node.target.id)
            outer, self.jumped = self.jumped, []
            for _ in range(2):  # again, from what one pass leaves (`total += ...`)
                before = dict(self.env)
                self.block(node.body)
                for jumped in self.jumped:
                    self.env = _merged(self.env, jumped)
                self.env = _merged(before, self.env)
            self.jumped = outer
        elif isinstance(node, ast.If):
            self.value(node.test)  # a test may read, not write
            before = dict(self.env)
            self.block(node.body)
            taken, self.env = self.env, before
            self.block(node.orelse)
            self.env = _merged(taken, self.env)
        elif isinstance(node, ast.Return) and node.value is not None:
            self.returned.append(self.value(node.value))
        else:
            raise _NotANorm

    def bind(self, name: str, value: ast.expr) -> None:
        if name in self.collections or self.is_collection(value):
            if not self.is_collection(value):
                raise _NotANorm
            self.collections.add(name)
            return
        if name in self.items:
            raise _NotANorm
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("float", "int") \
                and len(value.args) == 1 and isinstance(value.args[0], ast.Name) and value.args[0].id in self.symbols:
            self.symbols[name] = self.symbols[value.args[0].id]  # `norm_type = float(norm_type)`
            return
        self.symbols.pop(name, None)
        self.env[name] = frozenset({self.value(value)})

    def is_collection(self, node: ast.expr) -> bool:
        """The parameters again: ``[parameters]``, ``list(filter(lambda p: p.grad is not None, parameters))``,
        ``[p for p in parameters if p.grad is not None]``."""
        if isinstance(node, ast.Name):
            return node.id in self.collections
        if isinstance(node, ast.List) and len(node.elts) == 1:
            return self.is_collection(node.elts[0])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("list", "tuple") and len(node.args) == 1:
            return self.is_collection(node.args[0])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "filter" and len(node.args) == 2:
            return self.is_collection(node.args[1])
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)) and len(node.generators) == 1:
            generator = node.generators[0]
            return (isinstance(node.elt, ast.Name) and isinstance(generator.target, ast.Name)
                    and node.elt.id == generator.target.id and self.is_collection(generator.iter))
        return False

    # expressions: None for a value that does not grow with the gradients

    def value(self, node: ast.expr):
        if isinstance(node, ast.Constant):
            return _ZERO if node.value == 0 and not isinstance(node.value, bool) else None
        if isinstance(node, ast.Name):
            if node.id in self.collections or node.id in self.items:
                raise _NotANorm  # the parameters themselves, as a value
            grows = self.env.get(node.id)
            if not grows:
                return None
            kinds = grows - {_ZERO, None}
            if len(kinds) > 1 or (None in grows and kinds):
                raise _NotANorm
            if not kinds:
                return _ZERO if grows == {_ZERO} else None
            return next(iter(kinds))
        if isinstance(node, ast.Attribute):
            if node.attr in _METADATA:
                return None
            if node.attr == "grad" and isinstance(node.value, ast.Name) and node.value.id in self.items:
                return _ONE
            if node.attr == "data":
                return self.value(node.value)
            if isinstance(node.value, ast.Name) and (node.value.id in self.items or node.value.id in self.collections):
                raise _NotANorm  # another field of a parameter
            if self.value(node.value) is not None:
                raise _NotANorm  # a field of a gradient-derived value
            return None
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.BinOp):
            return self.binary(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return self.value(node.operand)
        if isinstance(node, (ast.List, ast.Tuple)):
            return self.alike(self.value(element) for element in node.elts)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            for generator in node.generators:
                if not isinstance(generator.target, ast.Name) or not self.is_collection(generator.iter):
                    raise _NotANorm
                self.items.add(generator.target.id)
                for test in generator.ifs:
                    self.value(test)
            return self.value(node.elt)
        if isinstance(node, ast.Compare):
            parts = [self.value(node.left), *(self.value(part) for part in node.comparators)]
            if any(part is not None and part is not _ZERO for part in parts) and not all(
                    isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                raise _NotANorm
            return None
        if isinstance(node, ast.IfExp):
            self.value(node.test)
            return self.alike([self.value(node.body), self.value(node.orelse)])
        if isinstance(node, ast.Lambda):
            return None
        raise _NotANorm

    def call(self, node: ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if isinstance(func, ast.Name) and name in self.norms and node.args and self.is_collection(node.args[0]):
            self.constants(node.args[1:], node.keywords)
            return _ONE
        if name == "isinstance" or name == "len" and isinstance(func, ast.Name) and len(node.args) == 1 \
                and self.is_collection(node.args[0]):
            return None
        if isinstance(func, ast.Attribute):
            receiver = self.value(func.value) if not _is_module(func.value) else None
            if receiver not in (None, _ZERO):  # `p.grad.norm(2)`
                self.constants(node.args, node.keywords)
                if name in _SAME:
                    return receiver
                if name in _POWERS:
                    return _times(receiver, _growth(_POWERS[name]))
                if name == "pow" and len(node.args) == 1:
                    return _times(receiver, self.exponent(node.args[0]))
                raise _NotANorm
        if name in _SAME or name in _POWERS:
            if isinstance(func, ast.Name) and name not in _OWN_FUNCTIONS:
                return self.constants(node.args, node.keywords)
            if not node.args:
                return self.constants((), node.keywords)
            first = self.value(node.args[0])
            self.constants(node.args[1:], node.keywords)
            if first in (None, _ZERO):
                return first
            return _times(first, _growth(_POWERS[name])) if name in _POWERS else first
        return self.constants(node.args, node.keywords)

    def constants(self, args, keywords) -> None:
        """Arguments that must not grow with the gradients (anything may be done with those)."""
        for part in (*args, *(keyword.value for keyword in keywords)):
            if self.value(part.value if isinstance(part, ast.Starred) else part) not in (None, _ZERO):
                raise _NotANorm
        return None

    def binary(self, node: ast.BinOp):
        left, right = self.value(node.left), self.value(node.right)
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return self.alike([left, right])
        if isinstance(node.op, ast.Mult):
            if left is None or right is None:
                return right if left is None else left
            if _ZERO in (left, right):
                return _ZERO
            return _times(left, right)
        if isinstance(node.op, ast.Div):
            if right is None:
                return left
            if left is None or right is _ZERO:
                raise _NotANorm
            return _ZERO if left is _ZERO else _times(left, _inverse(right))
        if isinstance(node.op, ast.Pow) and right is None:
            if left in (None, _ZERO):
                return left
            return _times(left, self.exponent(node.right))
        raise _NotANorm

    def alike(self, values: Iterable):
        """Terms added or listed together must all grow alike (a literal 0 goes with any)."""
        kinds = {value for value in values if value is not _ZERO}
        if len(kinds) > 1:
            raise _NotANorm
        return next(iter(kinds)) if kinds else _ZERO

    def exponent(self, node: ast.expr) -> _Growth:
        """An exponent, as a growth: ``2``, ``0.5``, ``norm_type``, ``1. / norm_type``."""
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return _growth(Fraction(node.value).limit_denominator(1000))
        if isinstance(node, ast.Name) and node.id in self.symbols:
            return _growth(Fraction(1), {self.symbols[node.id]: 1})
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
            left, right = self.exponent(node.left), self.exponent(node.right)
            return _times(left, right if isinstance(node.op, ast.Mult) else _inverse(right))
        raise _NotANorm


def _merged(a: Mapping[str, frozenset], b: Mapping[str, frozenset]) -> dict[str, frozenset]:
    """What a name may hold where two ways meet (one unbound on a way: as the other says)."""
    return {name: a.get(name, frozenset()) | b.get(name, frozenset()) for name in {*a, *b}}


def _is_module(node: ast.expr) -> bool:
    """``torch``, ``torch.linalg``, ``math``: a function's owner, not a value."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in ("torch", "math", "np", "numpy")


def is_gradient_norm(function: ast.FunctionDef | ast.AsyncFunctionDef, norms: frozenset[str] = frozenset()) -> bool:
    """Whether ``function`` returns a value that grows exactly as the gradients of the
    parameters handed as its first argument (see the module's docstring); ``norms``: other
    functions of its module known to."""
    if isinstance(function, ast.AsyncFunctionDef) or function.decorator_list:
        return False
    try:
        reading = _Reading(function, norms)
    except (_NotANorm, RecursionError):
        return False
    grown = set(reading.returned) - {_ZERO}
    return grown == {_ONE}


def defined_norms(tree: ast.Module) -> frozenset[str]:
    """The top-level functions of ``tree`` that return a gradient norm, also through one another."""
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    found: frozenset[str] = frozenset()
    while True:
        more = frozenset(function.name for function in functions if is_gradient_norm(function, found))
        if more == found:
            return found
        found = more


@disk_reads.cached(maxsize=256)
def _norms_of(file: str, depth: int = 0) -> frozenset[str]:
    """The gradient-norm functions ``file`` defines, or imports by name from a module on disk and
    so exports (a package's ``__init__.py``: ``from .misc import get_grad_norm``)."""
    tree = parsed_module(file)
    if tree is None:
        return frozenset()
    found = set(defined_norms(tree))
    for node in tree.body if depth < _REEXPORT_DEPTH else ():
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            source = find_on_disk(Path(file), node.level, node.module.split("."), PROJECT_FOLDERS_UP)
            if source is not None:
                exported = _norms_of(str(source.resolve()), depth + 1)
                found.update(alias.asname or alias.name for alias in node.names if alias.name in exported)
    return frozenset(found)


_REEXPORT_DEPTH = 3  # re-exports followed through this many modules


def _norms_for(path: Path, text: str) -> tuple[str, ...]:
    """The names ``path`` imports by name from a module of its project found on disk that are
    functions returning a gradient norm (``from utils import get_grad_norm``); its own functions
    are the planner's to read (``FileTree.gradient_norms``)."""
    try:
        tree = quiet.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    found: set[str] = set()
    for node in tree.body:
        for inner in (node, *getattr(node, "body", ()), *getattr(node, "orelse", ())) if isinstance(node, (ast.Try, ast.If)) else (node,):
            if isinstance(inner, ast.ImportFrom) and inner.module is not None:
                file = find_on_disk(path.resolve(), inner.level, inner.module.split("."), PROJECT_FOLDERS_UP)
                if file is None:
                    continue
                norms = _norms_of(str(file))
                found.update(alias.asname or alias.name for alias in inner.names if alias.name in norms)
    return tuple(sorted(found))


def elsewhere(texts: Mapping[Path, str]) -> dict[Path, tuple[str, ...]]:
    """For each file of ``texts`` (those that say apex), the names it imports from another file
    of its project that return a gradient norm; files with none left out."""
    found = {}
    for path, text in texts.items():
        if "norm" not in text:
            continue
        names = _norms_for(path, text)
        if names:
            found[path] = names
    return found
