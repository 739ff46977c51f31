"""Whether a value computed in the training loop steers the training: it reaches the argument of
a scheduler's step (``scheduler.step(val_loss)``, ReduceLROnPlateau) or the test of a branch
that leaves the loop (an early stop), directly or through what the loop computes from it (``bad
+= 1`` under ``if val_loss > best:``). An evaluation apex ran in float16 that steers so must run
so still, or the decay step and the stopping epoch can move."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.syntax import assigned_names, read_names
from migrate.tree_walk import descendants

# a leaving statement: where a branch whose test reads the value ends the loop or the function
_LEAVES = (cst.Break, cst.Return)


def steers_training(loop: cst.For | cst.While, names: set[str], objects: set[str]) -> bool:
    """Whether ``names`` (bound in ``loop``) reach an argument of a step (an optimizer's takes none
    but a closure) or the test of a branch of ``loop`` holding a ``break`` or ``return``;
    ``objects``: the names the file binds itself (``objects_of``), which may hold a value."""
    reached, holders = _reached(loop, names, objects)
    for node in descendants(loop.body, nodes.not_a_definition):
        if type(node) is cst.Call and isinstance(node.func, cst.Attribute) and node.func.attr.value == "step":
            if any(_reads(arg.value, reached, holders) for arg in node.args):
                return True
        elif type(node) in (cst.If, cst.While) and _reads(node.test, reached, holders) and _leaves(node.body):
            return True
    return False


def _reached(loop: cst.For | cst.While, names: set[str], objects: set[str]) -> tuple[set[str], set[str]]:
    """``names`` and every name the loop binds from them: by an assignment reading them, under a
    branch testing them (``if val_loss < best: best, bad = val_loss, 0 else: bad += 1``), or as
    an object whose method is handed them (``meter.update(val_loss)``, later ``meter.average()``),
    one the file makes (``objects``): not a module (``torch.save(checkpoint, path)`` keeps nothing
    in ``torch``, which a star import may bring). Such holders, the second set, give the value
    back only through their attributes: ``if writer:`` tests no value ``writer.add_scalar`` took."""
    reached, holders = set(names), set()
    changed = True
    while changed:
        changed = False
        for node in descendants(loop.body, nodes.not_a_definition):
            held = set()
            if type(node) in (cst.Assign, cst.AugAssign, cst.AnnAssign) and node.value is not None \
                    and _reads(node.value, reached, holders):
                made = assigned_names(node)
            elif type(node) is cst.If and _reads(node.test, reached, holders):
                made = assigned_names(node.body) | (assigned_names(node.orelse) if node.orelse is not None else set())
            elif type(node) is cst.Call and type(node.func) is cst.Attribute and type(node.func.value) is cst.Name \
                    and node.func.value.value in objects and any(_reads(arg.value, reached, holders) for arg in node.args):
                made = held = {node.func.value.value}  # `meter.update(val_loss)`: it may keep it (`meter.average()`)
            else:
                continue
            if not made <= reached:
                reached |= made
                holders |= held - names
                changed = True
    return reached, holders


def _reads(expression: cst.CSTNode, reached: set[str], holders: set[str]) -> bool:
    """Whether ``expression`` reads a reached value: a reached name, or an attribute of a holder."""
    read = read_names(expression) & reached
    return bool(read - holders) or any(type(node) is cst.Attribute and type(node.value) is cst.Name
                                       and node.value.value in read for node in descendants(expression))


def _leaves(block: cst.CSTNode) -> bool:
    return any(isinstance(node, _LEAVES) for node in descendants(block, nodes.not_a_definition))


def objects_of(module: cst.Module) -> set[str]:
    """The names the file binds itself: by an assignment or as a parameter, in any scope; not by an
    import (a module, or what one holds), nor by a star import, which binds no name it shows."""
    names = set()
    imported = set()
    for node in descendants(module):
        if type(node) in (cst.AssignTarget, cst.AugAssign, cst.AnnAssign):
            names.update(nodes.bound_texts(node.target))
        elif type(node) is cst.Param:
            names.add(node.name.value)
        elif type(node) in (cst.Import, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
            imported.update(nodes.code(alias.asname.name) if alias.asname else nodes.code(alias.name).split(".")[0]
                            for alias in node.names)
    return names - imported
