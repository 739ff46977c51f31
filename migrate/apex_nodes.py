"""Small helpers the apex rewrites share: source text of nodes, building statements, purity."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import libcst as cst

from migrate import line_wrap
from migrate.tree_walk import children, descendants, kept_per_tree
from migrate.types import ImportChange

_EMPTY = cst.Module(body=[])

# Expression node types whose evaluation has no side effect we care about (no calls).
_PURE = (
    cst.Name,
    cst.Attribute,
    cst.Integer,
    cst.Float,
    cst.SimpleString,
    cst.ConcatenatedString,
    cst.FormattedString,
    cst.FormattedStringExpression,
    cst.FormattedStringText,
    cst.BinaryOperation,  # arithmetic and `"O%d" % level` on plain values
    cst.Comparison,
    cst.ComparisonTarget,
    cst.BooleanOperation,
    cst.UnaryOperation,
    cst.Subscript,
    cst.SubscriptElement,
    cst.Index,
    cst.IfExp,
)
# Calls that read settled state, the same each time in a run: `if torch.cuda.is_available():`.
_PURE_CALLS = frozenset(
    {"is_available", "is_initialized", "device_count", "get_world_size", "get_rank", "is_bf16_supported",
     "hasattr", "isinstance", "getattr"}
)


@kept_per_tree  # the same nodes are asked for again and again
def code(node: cst.CSTNode) -> str:
    """The source text of ``node`` alone (without the whitespace that belongs to its parent)."""
    dotted = _dotted(node)
    return dotted if dotted is not None else _EMPTY.code_for_node(node)


def _dotted(node: cst.CSTNode) -> str | None:
    """The text of a plain dotted name (``self.scaler``: no brackets, no spaces), which most asked
    for are, without libcst's code generation; None for anything else."""
    if type(node) is cst.Name:
        return None if node.lpar else node.value
    if type(node) is not cst.Attribute or node.lpar or not _tight(node.dot):
        return None
    base = _dotted(node.value)
    return None if base is None else f"{base}.{node.attr.value}"


def _tight(dot: cst.Dot) -> bool:
    before, after = dot.whitespace_before, dot.whitespace_after
    return (type(before) is cst.SimpleWhitespace and not before.value
            and type(after) is cst.SimpleWhitespace and not after.value)


def is_pure(expression: cst.BaseExpression) -> bool:
    """Whether evaluating ``expression`` twice is the same as once: names, attributes, operators,
    and availability checks such as ``torch.cuda.is_available()`` or ``is_apex_available()``."""
    return not any(
        isinstance(node, cst.BaseExpression) and not isinstance(node, _PURE)
        and not (isinstance(node, cst.Call) and _reads_settled_state(call_name(node)))
        for node in descendants(expression)
    )


def _reads_settled_state(name: str) -> bool:
    return name in _PURE_CALLS or (name.startswith("is_") and name.endswith("_available"))  # `is_apex_available()`


def bound_texts(target: cst.BaseExpression) -> list[str]:
    """The text of each name, attribute or item an assignment target binds:
    ``loss, (aux, self.total) = ...`` binds ``loss``, ``aux`` and ``self.total``."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [text for element in target.elements for text in bound_texts(element.value)]
    if isinstance(target, cst.StarredElement):
        return bound_texts(target.value)
    return [code(target)]


def not_a_definition(node: cst.CSTNode) -> bool:
    """For ``descendants``: code in a nested function, class or lambda does not run where it stands."""
    return not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda))


def own_code(root: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``root`` and the nodes under it that run where they stand: none in a function, class or
    lambda defined under it (``root`` may itself be a function, whose body is walked)."""
    return descendants(root, lambda node: node is root or not_a_definition(node))


def call_name(call: cst.Call) -> str:
    """``f`` for ``f(x)``, ``clip_grad_norm_`` for ``torch.nn.utils.clip_grad_norm_(x)``, else ""."""
    func = call.func
    kind = type(func)  # exact types: isinstance of a libcst node is slow, and this is asked of every call
    if kind is cst.Name:
        return func.value
    if kind is cst.Attribute:
        return func.attr.value
    return ""


def receiver(call: cst.Call) -> str | None:
    """``opt`` in ``opt.zero_grad()``; None where the call is not on an attribute."""
    return code(call.func.value) if isinstance(call.func, cst.Attribute) else None


def is_main_guard(node: cst.CSTNode) -> bool:
    """``if __name__ == "__main__":`` with no ``else``: the body runs whenever the file runs as a script."""
    if not (isinstance(node, cst.If) and node.orelse is None and isinstance(node.test, cst.Comparison)
            and len(node.test.comparisons) == 1 and isinstance(node.test.comparisons[0].operator, cst.Equal)):
        return False
    sides = {code(node.test.left), code(node.test.comparisons[0].comparator)}
    return "__name__" in sides and any(literal_string(side) == "__main__" for side in (
        node.test.left, node.test.comparisons[0].comparator))


def argument(call: cst.Call, position: int | None, keyword: str) -> cst.Arg | None:
    """The argument bound to a parameter given by position (None: keyword-only) and keyword."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg
    if position is None:
        return None
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    return positional[position] if position < len(positional) else None


def keyword_names(call: cst.Call) -> set[str]:
    return {arg.keyword.value for arg in call.args if arg.keyword is not None}


def has_star(call: cst.Call) -> bool:
    return any(arg.star for arg in call.args)


def is_none(node: cst.BaseExpression | None) -> bool:
    """The literal ``None``."""
    return isinstance(node, cst.Name) and node.value == "None"


def literal_string(node: cst.BaseExpression | None) -> str | None:
    """The value of a plain string literal, else None."""
    if isinstance(node, cst.SimpleString) and "f" not in node.prefix.lower():
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def number_text(node: cst.BaseExpression | None) -> str | None:
    """A number literal as Python source (``128.0``), also from a numeric string (``"128.0"``)."""
    if isinstance(node, (cst.Integer, cst.Float)):
        return node.value
    text = literal_string(node)
    if text is None:
        return None
    try:
        return repr(float(text))
    except ValueError:
        return None


def number_value(node: cst.BaseExpression | None) -> float | None:
    """The value of a number written as arithmetic on literals (``2.**24``, ``2 ** 16``, ``-1``,
    ``"128.0"``); None for anything else, or a power too large to mean a loss scale."""
    text = number_text(node)
    if text is not None:
        return float(text)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        value = number_value(node.expression)
        return None if value is None else -value
    if isinstance(node, cst.BinaryOperation):
        left, right = number_value(node.left), number_value(node.right)
        if left is None or right is None:
            return None
        operator = type(node.operator)
        if operator is cst.Power:
            try:
                return float(left) ** right if abs(right) <= 128 and left > 0 else None
            except OverflowError:
                return None
        if operator is cst.Multiply:
            return left * right
        if operator is cst.Divide and right:
            return left / right
        if operator is cst.Add:
            return left + right
        if operator is cst.Subtract:
            return left - right
    return None


def parse_statements(source: str, module: cst.Module, unit: str | None = None) -> list[cst.BaseStatement]:
    """Statements parsed with the file's own indentation (``unit``, that of the block they go in,
    where it differs from the file's default) and line endings."""
    text = source.replace("    ", unit or module.default_indent).replace("\n", module.default_newline)
    parsed = cst.parse_module(text, config=_parsing_config(module))
    body = list(parsed.body)
    if parsed.header and body:  # comment lines before the first statement are its own, not a file header
        body[0] = body[0].with_changes(leading_lines=[*parsed.header, *body[0].leading_lines])
    return body


def parse_expression(source: str, module: cst.Module) -> cst.BaseExpression:
    return cst.parse_expression(source, config=_parsing_config(module))


@kept_per_tree  # libcst makes and checks a new one at each ask: a large apex file's plan parses thousands of statements
def _parsing_config(module: cst.Module) -> cst.PartialParserConfig:
    return module.config_for_parsing


def with_trailing_comment(statement: cst.BaseStatement, replaced: cst.CSTNode) -> cst.BaseStatement:
    """``statement`` ending with the comment that ended the line of ``replaced``, if it has none of its own."""
    comment = getattr(getattr(replaced, "trailing_whitespace", None), "comment", None)
    if comment is None or not isinstance(statement, cst.SimpleStatementLine) or statement.trailing_whitespace.comment:
        return statement
    return statement.with_changes(trailing_whitespace=replaced.trailing_whitespace)


def with_inner_comments_above(statement: cst.BaseStatement, replaced: cst.CSTNode) -> cst.BaseStatement:
    """``statement`` with the comments inside ``replaced`` (between the lines of a call written over
    several) as comment lines above it; those above ``replaced`` and ending its line are not inner."""
    inner = list(_comments(replaced.body)) if isinstance(replaced, cst.SimpleStatementLine) else []
    if not inner:
        return statement
    return statement.with_changes(leading_lines=[*statement.leading_lines, *(cst.EmptyLine(comment=c) for c in inner)])


def _comments(nodes: Sequence[cst.CSTNode]) -> Iterator[cst.Comment]:
    for node in nodes:
        if isinstance(node, cst.Comment):
            yield node
        else:
            yield from _comments(children(node))


def line_limit(module: cst.Module) -> int:
    """How long a line a fix may write in ``module``: its longest, or 88 if that is shorter."""
    return line_wrap.line_limit(module.code)


def one_argument_a_line(call: cst.Call, indent: str) -> cst.Call:
    """``call`` with each argument on a line of its own, ``indent`` deeper than the statement,
    with a trailing comma and the closing parenthesis under the statement, as a formatter lays
    out a call too long for one line."""
    line = cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(indent))
    closing = cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(""))
    args = [arg.with_changes(comma=cst.Comma(whitespace_after=closing if index == len(call.args) - 1 else line),
                             whitespace_after_arg=cst.SimpleWhitespace(""))
            for index, arg in enumerate(call.args)]
    return call.with_changes(whitespace_before_args=line, args=args)


def is_docstring(statement: cst.CSTNode) -> bool:
    """A line holding only a string: a module's, class's or function's docstring where it comes first."""
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def is_import_line(statement: cst.CSTNode) -> bool:
    """A line of imports only (``import a, b``; ``from x import y; import z``)."""
    return isinstance(statement, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body)


def with_leading(statement: cst.BaseStatement, leading: cst.CSTNode) -> cst.BaseStatement:
    """``statement`` carrying the comments and blank lines that stood above ``leading``."""
    return statement.with_changes(leading_lines=getattr(leading, "leading_lines", ()))


@kept_per_tree  # the rules of one run and the apex plan ask of the same module
def apex_imports(module: cst.Module) -> dict[str, list[ImportChange]]:
    """Every import of an ``apex`` module in the file, by the local name it binds.

    A fix hands the ones it stops using to ``remove_imports``; the engine removes an import
    only when nothing uses it any more, so ``from apex import amp, optimizers`` keeps what is left.
    """
    found: dict[str, list[ImportChange]] = {}
    for node in _import_statements(module):
        if isinstance(node.names, cst.ImportStar):
            continue
        for alias in node.names:
            imported = apex_import(node, alias)
            if imported is not None:
                found.setdefault(imported[0], []).append(imported[1])
    return found


def apex_imports_binding(module: cst.Module, name: str) -> list[cst.Import | cst.ImportFrom]:
    """The import statements of ``module`` that bind ``name`` to something of apex's."""
    return [node for node in _import_statements(module) if not isinstance(node.names, cst.ImportStar)
            and any((found := apex_import(node, alias)) is not None and found[0] == name for alias in node.names)]


def apex_import(statement: cst.Import | cst.ImportFrom, alias: cst.ImportAlias) -> tuple[str, ImportChange] | None:
    """The name ``alias`` of ``statement`` binds and the import change that removes it, when it
    imports from apex: ``("amp", ImportChange("apex", "amp"))`` for ``from apex import amp``."""
    if type(statement) is cst.Import:
        name = alias.evaluated_name
        if name == "apex" or name.startswith("apex."):
            return alias.evaluated_alias or name.split(".")[0], ImportChange(name, None, alias.evaluated_alias)
    elif not (statement.relative or statement.module is None):
        module = code(statement.module)
        if module == "apex" or module.startswith("apex."):
            return alias.evaluated_alias or alias.evaluated_name, ImportChange(module, alias.evaluated_name, alias.evaluated_alias)
    return None


# What holds statements: a compound statement's blocks and branches. Expressions never do.
_HOLDS_STATEMENTS = (cst.BaseCompoundStatement, cst.BaseSuite, cst.Else, cst.ExceptHandler, cst.ExceptStarHandler,
                     cst.Finally, cst.MatchCase)


def _import_statements(module: cst.Module) -> Iterator[cst.Import | cst.ImportFrom]:
    """Every import statement of ``module``, nested ones included, in source order; only the
    statements are read, never the expressions (nine nodes in ten)."""
    pending: list[cst.CSTNode] = list(reversed(module.body))
    while pending:
        node = pending.pop()
        if type(node) is cst.SimpleStatementLine or type(node) is cst.SimpleStatementSuite:
            yield from (small for small in node.body if type(small) is cst.Import or type(small) is cst.ImportFrom)
        elif isinstance(node, _HOLDS_STATEMENTS):
            pending.extend(reversed([child for child in children(node, tokens=False)
                                     if isinstance(child, (cst.BaseStatement, *_HOLDS_STATEMENTS))]))


def root_name(node: cst.BaseExpression) -> str | None:
    """``apex`` for ``apex.amp.initialize``, ``amp`` for ``amp``; None for anything else."""
    while type(node) is cst.Attribute:  # asked of every name by several rules: no slow isinstance
        node = node.value
    return node.value if type(node) is cst.Name else None


def guarding_if(statement: cst.CSTNode, parent_of) -> cst.If | None:
    """The ``if <names and comparisons>:`` (no ``else``) whose whole body is ``statement``.

    Removing ``statement`` then removes the ``if`` too: evaluating such a test has no effect.
    ``parent_of`` maps a node to its parent (e.g. ParentNodeProvider metadata).
    """
    block = parent_of(statement)
    owner = parent_of(block) if block is not None else None
    if not isinstance(owner, cst.If) or owner.body is not block or owner.orelse is not None:
        return None
    if len(block.body) != 1 or not is_pure(owner.test):
        return None
    return owner


def import_error_fallback(node: cst.Try) -> str | None:
    """The assignments (``use_amp = False``) that ``node``'s ``except ImportError:`` branches make
    (or a bare ``except:``'s, an ``except Exception:``'s),
    as one line of code; None when they make none."""
    assignments = []
    for handler in filter(_catches_a_failed_import, node.handlers):
        for line in handler.body.body:
            if isinstance(line, cst.SimpleStatementLine):
                assignments += [code(small) for small in line.body if isinstance(small, (cst.Assign, cst.AnnAssign))]
    return "; ".join(assignments) or None


def catches_import_error(handler: cst.ExceptHandler) -> bool:
    """``except ImportError:`` or ``except (ModuleNotFoundError, X):``; a bare ``except:`` is not one."""
    return any(name in ("ImportError", "ModuleNotFoundError") for name in _caught(handler))


def _catches_a_failed_import(handler: cst.ExceptHandler) -> bool:
    """``except ImportError:``, or a handler that catches it among others (a bare ``except:``,
    ``except Exception:``)."""
    return handler.type is None or catches_import_error(handler) or any(
        name in ("Exception", "BaseException") for name in _caught(handler))


def guards_an_import(handler: cst.ExceptHandler) -> bool:
    """The handler of a ``try`` that checks an import: ``except ImportError:``, or one that catches
    it among others (a bare ``except:``, ``except Exception:``), or ``except NameError:`` (a name
    the ``try`` above it failed to import)."""
    return handler.type is None or catches_import_error(handler) or any(
        name in ("Exception", "BaseException", "NameError") for name in _caught(handler))


def _caught(handler: cst.ExceptHandler) -> list[str]:
    """The names of the exceptions ``handler`` names (none for a bare ``except:``)."""
    if handler.type is None:
        return []
    kinds = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
    return [code(kind.value if isinstance(kind, cst.Element) else kind) for kind in kinds]


# What `from apex.fp16_utils import *` binds: the package's names and its submodules.
FP16_UTILS_NAMES = frozenset(
    "FP16_Optimizer FP16Model network_to_half convert_network convert_module BN_convert_float tofp16 "
    "prep_param_lists model_grads_to_master_grads master_params_to_model_params to_python_float "
    "clip_grad_norm LossScaler DynamicLossScaler fp16util fp16_optimizer loss_scaler".split()
)


def reads_any(module: cst.Module, names: frozenset[str]) -> bool:
    """Whether ``module`` names one of ``names`` outside imports (not as an attribute: ``x.tofp16``),
    or in a string that may be code (``__all__``, ``eval``); not in a string standing alone as a
    statement (code commented out in ``'''...'''``, a docstring), which never runs."""
    attributes: set[int] = set()
    alone: set[int] = set()
    for node in descendants(module, lambda node: type(node) not in (cst.Import, cst.ImportFrom)):
        if type(node) is cst.Attribute:
            attributes.add(id(node.attr))
        elif type(node) is cst.Expr:
            alone.add(id(node.value))
        elif type(node) is cst.Name and node.value in names and id(node) not in attributes:
            return True
        elif type(node) is cst.SimpleString and id(node) not in alone and any(name in node.value for name in names):
            return True
    return False
