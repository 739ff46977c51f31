"""What the deprecated-native-spelling rules share: find a deprecated ``torch.*.amp`` name by what it
resolves to, and rebuild the call under its ``torch.amp`` name.

Every spelling is found through imports: ``torch.cuda.amp.X``, ``import torch as th; th.cuda.amp.X``,
``from torch.cuda.amp import X [as Y]``, ``from torch.cuda import amp; amp.X``,
``import torch.cuda.amp as tca; tca.X``. A local ``amp`` or ``X`` is never touched.
"""
from __future__ import annotations

from typing import ClassVar

import libcst as cst

from migrate.names import import_binding, qualified_names, resolves_to
from migrate.rule import ImportChange, Rule, Safety
from migrate.types import FixSafety


class DeprecatedSpelling(Rule):
    """Base: set ``RENAMES`` (deprecated qualified name -> ``torch.amp`` name) and ``fixed_args``."""

    RENAMES: ClassVar[dict[str, str]] = {}
    # Native AMP under an old spelling is not apex: a plain run leaves such files alone (they
    # still work), `--select AMP02` modernises them.
    DEFAULT = False
    FIX_SAFETY = FixSafety.ALWAYS

    def __init__(self, context=None) -> None:
        super().__init__(context)
        self._handled: set[int] = set()  # references already reported as part of a call or decorator
        self._import_depth = 0

    def fixed_args(self, call: cst.Call) -> list[cst.Arg] | None:
        """The native call's arguments, or None where they cannot be carried over."""
        raise NotImplementedError

    def bare_decorator_args(self) -> list[cst.Arg] | None:
        """The native call's arguments when the deprecated name is a bare ``@decorator`` (None: no fix)."""
        return None

    def visit_Import(self, node: cst.Import) -> None:
        self._import_depth += 1

    def leave_Import(self, original_node: cst.Import) -> None:
        self._import_depth -= 1

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self._import_depth += 1

    def leave_ImportFrom(self, original_node: cst.ImportFrom) -> None:
        self._import_depth -= 1

    def visit_Decorator(self, node: cst.Decorator) -> None:
        deprecated = self._deprecated_name(node.decorator)
        if deprecated is not None and isinstance(node.decorator, (cst.Name, cst.Attribute)):
            self._handled.add(id(node.decorator))
            self._report_site(node.decorator, node.decorator, deprecated, self.bare_decorator_args())

    def visit_Call(self, node: cst.Call) -> None:
        deprecated = self._deprecated_name(node.func)
        if deprecated is not None:
            self._handled.add(id(node.func))
            self._report_site(node, node.func, deprecated, self.fixed_args(node))

    def visit_Name(self, node: cst.Name) -> None:
        self._report_reference(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._report_reference(node)

    def _deprecated_name(self, node: cst.BaseExpression) -> str | None:
        return resolves_to(self, node, *self.RENAMES)

    def _report_reference(self, node: cst.Name | cst.Attribute) -> None:
        """A use that is neither called nor a decorator (``isinstance``, a base class, an alias): report only."""
        if self._import_depth or id(node) in self._handled:
            return
        deprecated = self._deprecated_name(node)
        if deprecated is not None:
            native = self.RENAMES[deprecated]
            self.report(node, f"`{deprecated}` is deprecated; use `{native}` (this use needs a manual change)")

    def _report_site(
        self, node: cst.CSTNode, func: cst.BaseExpression, deprecated: str, args: list[cst.Arg] | None
    ) -> None:
        native_name = self.RENAMES[deprecated]
        message = f"`{deprecated}` is deprecated; use `{native_name}`"
        others = qualified_names(self, func) - {deprecated}
        if others:  # e.g. imported from torch.cuda.amp on one branch, from contextlib on the other
            self.report(node, message + f" (the name may also be {', '.join(sorted(others))} here: change it by hand)")
            return
        if args is None:
            self.report(node, message + " (its arguments need a manual change)")
            return
        native, add_imports, remove_imports = self._native_name(func, native_name)
        call = node.with_changes(func=native, args=args) if isinstance(node, cst.Call) else cst.Call(native, args)
        self.report(
            node,
            message,
            replacement=call,
            safety=Safety.SAFE,
            fix_message=f"Replace with `{native_name}`",
            add_imports=add_imports,
            remove_imports=remove_imports,
        )

    def _native_name(
        self, func: cst.BaseExpression, native_name: str
    ) -> tuple[cst.BaseExpression, tuple[ImportChange, ...], tuple[ImportChange, ...]]:
        """``native_name`` spelled through the file's own ``torch`` name when the old spelling used one."""
        native_path = native_name.split(".")
        root = func
        while isinstance(root, cst.Attribute):
            root = root.value
        if isinstance(root, cst.Name) and root is not func and "torch" in qualified_names(self, root):
            return _dotted(root, native_path[1:]), (), ()
        binding = import_binding(self, root) if isinstance(root, cst.Name) else None
        removes = (binding,) if binding is not None else ()
        return _dotted(cst.Name(native_path[0]), native_path[1:]), (ImportChange("torch"),), removes


def _dotted(base: cst.BaseExpression, attributes: list[str]) -> cst.BaseExpression:
    for attribute in attributes:
        base = cst.Attribute(value=base, attr=cst.Name(attribute))
    return base


def string_arg(value: str, keyword: str | None = None) -> cst.Arg:
    """``"value"`` as an argument, positional or ``keyword="value"``."""
    if keyword is None:
        return cst.Arg(cst.SimpleString(f'"{value}"'))
    no_space = cst.SimpleWhitespace("")
    return cst.Arg(
        cst.SimpleString(f'"{value}"'),
        keyword=cst.Name(keyword),
        equal=cst.AssignEqual(whitespace_before=no_space, whitespace_after=no_space),
    )


def as_keywords(args: list[cst.Arg] | tuple[cst.Arg, ...], parameters: tuple[str, ...]) -> list[cst.Arg] | None:
    """Positional arguments turned into keywords for ``parameters`` (None for ``*args`` or too many)."""
    converted = []
    for index, arg in enumerate(args):
        if arg.star == "*":
            return None
        if arg.keyword is None and not arg.star:
            if index >= len(parameters):
                return None
            no_space = cst.SimpleWhitespace("")
            arg = arg.with_changes(
                keyword=cst.Name(parameters[index]),
                equal=cst.AssignEqual(whitespace_before=no_space, whitespace_after=no_space),
            )
        converted.append(arg)
    return converted

