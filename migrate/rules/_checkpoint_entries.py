"""What a checkpoint's save writes (AMP107): the entries of the dict it saves, with those added
to it later, and the ``state_dict()`` calls an entry holds."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.step_model import Steps


def state_dicts(value: cst.BaseExpression) -> list[cst.Call]:
    """The ``x.state_dict()`` calls an entry's value is: itself, or either arm of a conditional
    (``model.module.state_dict() if ddp else model.state_dict()``)."""
    if isinstance(value, cst.IfExp):
        return state_dicts(value.body) + state_dicts(value.orelse)
    if isinstance(value, cst.Call) and nodes.call_name(value) == "state_dict" and isinstance(value.func, cst.Attribute):
        return [value]
    return []


def _dict_call(value: cst.BaseExpression) -> bool:
    return (isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict"
            and all(arg.keyword is not None or arg.star == "**" for arg in value.args))


def optimizers_container(steps: Steps, key: cst.BaseExpression | None, value: cst.BaseExpression) -> bool:
    """Whether an entry keyed as an optimizer's holds a dict the function fills: the optimizers'
    states gathered by a loop (``state["optimizers"] = optimizer_states``)."""
    if key is None or "optim" not in nodes.code(key).lower() or not isinstance(value, cst.Name):
        return False
    bound = steps.assigned(value.value)
    return bool(bound) and isinstance(bound[-1].value, (cst.Dict, cst.DictComp))


def entries_saved(steps: Steps, event) -> list[tuple[cst.BaseExpression | None, cst.BaseExpression]] | None:
    """The ``(key, value)`` entries of the dictionary a save call writes, with those added to it
    later (their key: the target's text, ``state['scaler']``); a ``**`` entry's key is None."""
    call = event.node
    first = call.args[0].value if call.args else None
    name = None
    if isinstance(first, (cst.Name, cst.Attribute)):
        name = nodes.code(first)
        bound = [a for a in steps.assigned(name) if isinstance(a.value, cst.Dict) or _dict_call(a.value)]
        if not bound:
            return None
        first = bound[-1].value
    if _dict_call(first):  # `dict(model=model.state_dict(), optimizer=optimizer.state_dict())`
        found = [(cst.SimpleString(repr(arg.keyword.value)) if arg.keyword else None, arg.value) for arg in first.args]
    elif isinstance(first, cst.Dict):
        found = [(getattr(element, "key", None), element.value) for element in first.elements]
    else:
        return None
    if name is not None:
        found += [(cst.SimpleString(repr(target)), assignment.value) for assignment, target in steps.items_assigned(name)]
    return found
