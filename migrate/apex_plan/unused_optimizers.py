"""An ``amp.initialize`` given optimizers that nothing uses after it (a test script built with
the training script's set-up: ``optimizer = make_optimizer(cfg, model)``, ``scheduler =
make_lr_scheduler(cfg, optimizer)``, ``model, optimizer = amp.initialize(model, optimizer,
opt_level=level)``, then only the evaluation): nothing can step them or scale a loss for them,
so the call only readied its models for inference, as one given no optimizer does."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.syntax import in_assignment_target, read_names
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import InitializeSite
from migrate.step_model.shapes import parameters_of
from migrate.tree_walk import descendants


def optimizers_unused(tree: FileTree, init: InitializeSite) -> bool:
    """Whether ``init``'s optimizers are locals of its function that nothing reads after it: the
    names given and bound back, with every local made from them before it (a scheduler), read
    nowhere else in the function (nor by a function defined in it), and kept on no object."""
    function = tree.function(init.statement)
    given = nodes.argument(init.call, 1, "optimizers")
    if function is None or given is None or nodes.is_none(given.value) or not isinstance(init.statement.body[0], cst.Assign):
        return False
    names = _plain_names(given.value)
    targets = init.statement.body[0].targets
    if names is None or len(targets) != 1 or not isinstance(targets[0].target, (cst.Tuple, cst.List)):
        return False
    bound = _plain_names(cst.Tuple(targets[0].target.elements[1:]))
    if bound is None or names & init.model_codes:
        return False
    locals_ = _bound_locals(function)
    if (names | bound) - ({"_"} | locals_) or _declared(function) & (names | bound):
        return False  # a parameter or a global: the caller, or another function, holds it too
    held = _made_from(function, init.statement, names)
    for node in descendants(function.body):
        if type(node) is not cst.Name or node.value not in held | bound or tree.inside(node, init.call):
            continue
        parent = tree.parent.get(id(node))
        if in_assignment_target(parent, tree.parent):
            continue  # bound here, not read
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            continue
        statement = tree.statement(node)
        if statement is not init.statement and _only_makes_locals(statement) and tree.line(statement) < tree.line(init.statement):
            continue  # `scheduler = make_lr_scheduler(cfg, optimizer)`: one of `held`
        return False
    return True


def _plain_names(expression: cst.BaseExpression) -> set[str] | None:
    """The names ``expression`` lists (``optimizer``, ``[opt_g, opt_d]``), or None for anything else."""
    elements = [e.value for e in expression.elements] if isinstance(expression, (cst.Tuple, cst.List)) else [expression]
    if not elements or not all(isinstance(e, cst.Name) for e in elements):
        return None
    return {e.value for e in elements}


def _bound_locals(function: cst.FunctionDef) -> set[str]:
    """The names the function's own lines assign (not its parameters)."""
    return {text for node in descendants(function.body, nodes.not_a_definition)
            if type(node) in (cst.AssignTarget, cst.AugAssign, cst.AnnAssign) for text in nodes.bound_texts(node.target)}


def _declared(function: cst.FunctionDef) -> set[str]:
    """The names of the function's parameters and of its ``global`` / ``nonlocal`` lines."""
    found = {param.name.value for param in parameters_of(function)}
    for node in descendants(function.body, nodes.not_a_definition):
        if type(node) in (cst.Global, cst.Nonlocal):
            found |= {item.name.value for item in node.names}
    return found


def _made_from(function: cst.FunctionDef, init_statement: cst.CSTNode, names: set[str]) -> set[str]:
    """``names`` with every local a plain assignment makes from them (``scheduler =
    make_lr_scheduler(cfg, optimizer)``, and what is made from that in turn)."""
    held = set(names)
    assignments = [node for node in descendants(function.body, nodes.not_a_definition)
                   if type(node) is cst.Assign and node is not init_statement.body[0]]
    changed = True
    while changed:
        changed = False
        for assign in assignments:
            if read_names(assign.value) & held:
                made = {text for target in assign.targets for text in nodes.bound_texts(target.target)}
                if not made <= held:
                    held |= made
                    changed = True
    return held


def _only_makes_locals(statement: cst.CSTNode) -> bool:
    """A line of one assignment to plain names: what it makes is followed as a local, nothing else
    keeps what it reads (``self.optimizer = optimizer``, ``register(optimizer)`` do)."""
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and isinstance(statement.body[0], cst.Assign)
            and all(_plain_names(target.target) is not None for target in statement.body[0].targets))

