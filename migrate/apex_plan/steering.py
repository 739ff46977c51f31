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


def steers_training(loop: cst.For | cst.While, names: set[str]) -> bool:
    """Whether ``names`` (bound in ``loop``) reach an argument of a step (an optimizer's takes none
    but a closure) or the test of a branch of ``loop`` holding a ``break`` or ``return``."""
    reached = _reached(loop, names)
    for node in descendants(loop.body, nodes.not_a_definition):
        if type(node) is cst.Call and isinstance(node.func, cst.Attribute) and node.func.attr.value == "step":
            if any(read_names(arg.value) & reached for arg in node.args):
                return True
        elif type(node) in (cst.If, cst.While) and read_names(node.test) & reached and _leaves(node.body):
            return True
    return False


def _reached(loop: cst.For | cst.While, names: set[str]) -> set[str]:
    """``names`` and every name the loop binds from them: by an assignment reading them, under a
    branch testing them (``if val_loss < best: best, bad = val_loss, 0 else: bad += 1``), or as
    an object whose method is handed them (``meter.update(val_loss)``, later ``meter.average()``)."""
    reached = set(names)
    changed = True
    while changed:
        changed = False
        for node in descendants(loop.body, nodes.not_a_definition):
            if type(node) in (cst.Assign, cst.AugAssign, cst.AnnAssign) and node.value is not None \
                    and read_names(node.value) & reached:
                made = assigned_names(node)
            elif type(node) is cst.If and read_names(node.test) & reached:
                made = assigned_names(node.body) | (assigned_names(node.orelse) if node.orelse is not None else set())
            elif type(node) is cst.Call and type(node.func) is cst.Attribute and type(node.func.value) is cst.Name \
                    and any(read_names(arg.value) & reached for arg in node.args):
                made = {node.func.value.value}  # `meter.update(val_loss)`: the object may keep it (`meter.average()`)
            else:
                continue
            if not made <= reached:
                reached |= made
                changed = True
    return reached


def _leaves(block: cst.CSTNode) -> bool:
    return any(isinstance(node, _LEAVES) for node in descendants(block, nodes.not_a_definition))

