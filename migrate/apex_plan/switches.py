"""The argparse switches a file reads as bools: ``enabled=args.fp16`` needs no ``bool(...)``
where ``--fp16`` is ``action="store_true"`` and ``args`` is what ``parse_args()`` returned; nor
does ``enabled=use_mixed_precision`` where every line binding it assigns a comparison."""
from __future__ import annotations

import libcst as cst

from migrate.apex_plan.vocabulary import is_boolean
from migrate.tree_walk import descendants


def boolean_options(module: cst.Module, switches: frozenset[str]) -> frozenset[str]:
    """The argparse switches (``action="store_true"``) read on what ``parse_args()`` returned
    (``args.fp16``), where no line of the file sets them otherwise (``args.fp16 =
    cfg["fp16"]``): a bool, as ``enabled=`` needs; not ``cfg.fp16`` of another object."""
    set_here = {target.target.attr.value for node in descendants(module) if type(node) is cst.Assign
                for target in node.targets if isinstance(target.target, cst.Attribute)}
    set_here |= {node.target.attr.value for node in descendants(module)
                 if type(node) in (cst.AugAssign, cst.AnnAssign) and isinstance(node.target, cst.Attribute)}
    # the names every assignment of which is `parser.parse_args()` (`args, _ =
    # parser.parse_known_args()` too): not one rebound to a config (`args = load(args)`)
    parsing: dict[str, bool] = {}
    for node in descendants(module):
        if type(node) is not cst.Assign:
            continue
        parses = type(node.value) is cst.Call and isinstance(node.value.func, cst.Attribute) \
            and node.value.func.attr.value in ("parse_args", "parse_known_args")
        for target in node.targets:
            names = [e.value for e in target.target.elements] if isinstance(target.target, (cst.Tuple, cst.List)) else [target.target]
            for index, bound in enumerate(names):
                if isinstance(bound, cst.Name):
                    parsing[bound.value] = parsing.get(bound.value, True) and parses and index == 0
    parsed = {name for name, only in parsing.items() if only}
    return frozenset(f"{name}.{option}" for name in parsed for option in switches - set_here)


# where a name is bound other than by `name = value`: it may then hold anything
_OTHER_BINDINGS = {cst.Param: "name", cst.AugAssign: "target", cst.AnnAssign: "target", cst.For: "target",
                   cst.CompFor: "target", cst.AsName: "name", cst.NamedExpr: "target", cst.FunctionDef: "name",
                   cst.ClassDef: "name", cst.ImportAlias: "name"}


def boolean_names(module: cst.Module) -> frozenset[str]:
    """The plain names every binding of which in the file assigns a bool as written
    (``vocabulary.is_boolean``: a comparison, a negation, a bool literal, ``bool(...)``) (``use_mixed_precision = cfg.DTYPE == "float16"``): a bool, as ``enabled=`` needs."""
    verdict: dict[str, bool] = {}
    for node in descendants(module):
        if type(node) is cst.Assign:
            for target in node.targets:
                bound = target.target
                for name in [bound] if isinstance(bound, cst.Name) else descendants(bound, lambda _: True):
                    if type(name) is cst.Name:
                        verdict[name.value] = verdict.get(name.value, True) and bound is name and is_boolean(node.value)
        elif type(node) in _OTHER_BINDINGS or type(node) in (cst.Global, cst.Nonlocal):
            held = getattr(node, _OTHER_BINDINGS[type(node)]) if type(node) in _OTHER_BINDINGS else node
            for name in [held] if type(held) is cst.Name else descendants(held, lambda _: True):
                if type(name) is cst.Name:
                    verdict[name.value] = False
    return frozenset(name for name, boolean in verdict.items() if boolean)

