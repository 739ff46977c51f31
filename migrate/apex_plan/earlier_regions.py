"""Whether a loss was computed inside an autocast region the rewrite already planned.

A domain-adaptation trainer's net returns every loss: the main loss's scaled backward pass gets
the region around the forward pass, and each discriminator loss is then scaled in a loop over
the discriminators' optimizers, reading the same dict. That loss needs no marker asking for its
forward pass to go under autocast: it is there already.
"""
from __future__ import annotations

import builtins

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.loss_slice import moves_data
from migrate.apex_plan.syntax import assigned_names, read_names
from migrate.apex_plan.tree import FileTree
from migrate.flow.bindings import bound_value
from migrate.flow.reaching import binding_nodes, reaching
from migrate.tree_walk import descendants


def computed_in_a_region(tree: FileTree, regions: set[int], loss: cst.BaseExpression, statement: cst.CSTNode,
                         depth: int = 2) -> bool:
    """Whether what ``loss`` reads was computed, on every way to ``statement``, by a statement
    of an autocast region (``regions``, by id), or taken from such a value by a loop
    (``for key, value in losses.items()``); builtins and globals count for nothing."""
    graph = tree.control_flow(statement, exceptions=False)
    if not graph.holds(statement):
        return False
    seen = False
    for name in sorted(read_names(loss)):
        found = reaching(graph, name, statement)
        if not found.bindings:
            continue
        if found.from_outside:
            return False
        for binding in found.bindings:
            if in_a_region(tree, regions, binding):
                continue
            if not (depth and type(binding) is cst.For and computed_in_a_region(tree, regions, binding.iter, binding, depth - 1)):
                return False
        seen = True
    return seen


def in_a_region(tree: FileTree, regions: set[int], statement: cst.CSTNode | None) -> bool:
    """Whether ``statement`` is, or is in, a statement that became an autocast region."""
    while statement is not None and not isinstance(statement, cst.FunctionDef):
        if id(statement) in regions:
            return True
        statement = tree.parent.get(id(statement))
    return False


def continues_a_region(tree: FileTree, regions: set[int], statements: list[cst.BaseStatement]) -> bool:
    """Whether ``statements`` (what a loss is computed from, with no forward pass beside it: a GAN's
    generator loss after the discriminator's step) compute from values an earlier region made
    (``output``, ``d_fake``) and otherwise only from data moved, objects made by a class (``nn.L1Loss()``,
    a loss network) or called, options (``args = parser.parse_args()``), imports and builtins: apex
    cast all of it, and an autocast around them casts the same. At least one value is a region's."""
    statements = [statement for statement in statements if assigned_names(statement)]  # not `opt.zero_grad()`
    graph = tree.control_flow(statements[0], exceptions=False) if statements else None
    if graph is None or not graph.holds(statements[0]):
        return False
    bound = set().union(*(assigned_names(statement) for statement in statements))
    from_a_region = False
    for name in sorted(set().union(*(_identifiers(tree, statement) for statement in statements)) - bound):
        found = reaching(graph, name, statements[0])
        if not found.bindings and name in _BUILTINS:
            continue
        if found.from_outside:  # a parameter, a global read in a function: whatever made it is not seen
            return False
        for binding in found.bindings:
            if in_a_region(tree, regions, binding):
                from_a_region = True
            elif not (moves_data(binding) or _not_a_computed_tensor(binding, name) or _over_data(tree, graph, binding)):
                return False
    return from_a_region


def _over_data(tree: FileTree, graph, binding: cst.CSTNode) -> bool:
    """A loop over data: ``for x, y in loader`` (``enumerate(tqdm(loader))``), where what its
    iterable reads is an object made by a class (``DataLoader(...)``), data moved or an import."""
    if type(binding) is not cst.For:
        return False
    for name in _identifiers(tree, binding.iter):
        found = reaching(graph, name, binding)
        if not found.bindings and name in _BUILTINS:
            continue
        if found.from_outside or not all(moves_data(bound) or _not_a_computed_tensor(bound, name) for bound in found.bindings):
            return False
    return True


def _identifiers(tree: FileTree, node: cst.CSTNode) -> set[str]:
    """The plain names ``node`` reads: not an attribute's name (``args.weight``: ``args``) nor a keyword."""
    return {name.value for name in descendants(node) if type(name) is cst.Name
            and not (type(parent := tree.parent.get(id(name))) is cst.Attribute and parent.attr is name)
            and not (type(parent) is cst.Arg and parent.keyword is name)}


_BUILTINS = frozenset(dir(builtins))


def _not_a_computed_tensor(binding: cst.CSTNode, name: str) -> bool:
    """An import, a definition, ``name = SomeClass(...)`` or ``name = parser.parse_args()``."""
    if type(binding) in (cst.FunctionDef, cst.ClassDef):
        return True
    if type(binding) is not cst.SimpleStatementLine:
        return False
    if all(type(small) in (cst.Import, cst.ImportFrom) for small in binding.body):
        return True
    values = [_made(bound_value(node, name)) for node in binding_nodes(binding, name)]
    return bool(values) and all(type(value) is cst.Call and (nodes.call_name(value)[:1].isupper() or nodes.call_name(value) == "parse_args")
                                and not any(_may_run_a_network(inner) for arg in value.args for inner in descendants(arg.value))
                                for value in values)


def _may_run_a_network(node: cst.CSTNode) -> bool:
    """``model(x)``, ``self.net(x)`` in ``Variable(model(x))``: a call of a lowercase name of the
    file or of ``self``; not ``torch.randn(...)`` nor a class (``TensorDataset(...)``)."""
    if type(node) is not cst.Call or nodes.call_name(node)[:1].isupper():
        return False
    func = node.func
    return type(func) is cst.Name or type(func) is cst.Attribute and type(func.value) is cst.Name and func.value.value == "self"


def _made(value: cst.CSTNode) -> cst.CSTNode:
    """``VGG19()`` for ``VGG19().cuda().eval()``: the object, moved or set to a mode."""
    while (type(value) is cst.Call and type(value.func) is cst.Attribute and value.func.attr.value in _SET_UP
           and type(value.func.value) is cst.Call):
        value = value.func.value
    return value


_SET_UP = frozenset({"to", "cuda", "cpu", "eval", "train", "requires_grad_"})
