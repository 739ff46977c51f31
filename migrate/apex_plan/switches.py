"""The argparse switches a file reads as bools: ``enabled=args.fp16`` needs no ``bool(...)``
where ``--fp16`` is ``action="store_true"`` and ``args`` is what ``parse_args()`` returned."""
from __future__ import annotations

import libcst as cst

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
