"""Shapes of code the walk recognises: a retry loop, an arm that ends the step, what a chain of
calls pulls to the host, which parameter of a helper each argument of a call gives a value, a
helper that evaluates."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.flow.bindings import bindings
from migrate.tree_walk import descendants, kept_per_tree
from migrate.step_model import vocabulary as words


def retries(loop: cst.For | cst.While) -> bool:
    """Whether ``loop`` is a retry loop: every pass that raises nothing leaves it at the end of its
    body (``while True: try: step(); break / except RuntimeError: ...``)."""
    statements = body(loop.body)
    last = statements[-1] if statements else None
    if isinstance(last, cst.Try):
        finishing = body(last.orelse.body) if last.orelse is not None else body(last.body)
        return ends_with_exit(finishing)
    return ends_with_exit(statements) and not any(isinstance(statement, cst.If) and ends_with_exit(body(statement.body))
                                                  for statement in statements[:-1])


def formatted_values(node: cst.CSTNode) -> list[cst.BaseExpression]:
    """The values a string formatting writes, each made a Python number by it (a tensor waits):
    ``"%.4f" % loss``, ``"%d %.4f" % (step, *losses)``, ``"{:.4f}".format(loss)``. Only names,
    attributes and subscripts, as ``print`` takes them: what a call computes is its own read."""
    if type(node) is cst.BinaryOperation and type(node.operator) is cst.Modulo and _text(node.left):
        right = node.right
        values = [e.value for e in right.elements] if type(right) is cst.Tuple else [right]
    elif type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value == "format" \
            and _text(node.func.value):
        values = [arg.value for arg in node.args]
    else:
        return []
    return [v for v in values if type(v) in (cst.Name, cst.Attribute, cst.Subscript)]


def _text(node: cst.BaseExpression) -> bool:
    """Whether ``node`` is a string written in the code: a literal, or literals joined or repeated."""
    if type(node) in (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString):
        return True
    if type(node) is cst.BinaryOperation and type(node.operator) in (cst.Add, cst.Multiply):
        return _text(node.left) or _text(node.right)
    return False


def ends_with_exit(body: list) -> bool:
    last = body[-1] if body else None
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Break, cst.Return))


def pulled_value(receiver: cst.BaseExpression) -> cst.BaseExpression:
    """What a chain of calls pulls to the host: the receiver of its first pull
    (``loss`` in ``loss.cpu().detach().numpy()``, ``loss.detach()`` in ``loss.detach().item()``)."""
    pulled, node = receiver, receiver
    while True:
        if type(node) is cst.Call and type(node.func) is cst.Attribute:
            if nodes.call_name(node) in words.PULL_METHODS and not node.args:
                pulled = node.func.value
            node = node.func.value
        elif type(node) is cst.Attribute and node.attr.value == "data":
            node = node.value
        else:
            return pulled


def parameters_of(function: cst.FunctionDef) -> list[cst.Param]:
    """Its named parameters: positional-only, plain and keyword-only (not ``*args``/``**kwargs``)."""
    return [*function.params.posonly_params, *function.params.params, *function.params.kwonly_params]


def parameters_given(helper: cst.FunctionDef, call: cst.Call) -> list[tuple[str, cst.BaseExpression]]:
    """``(parameter, argument)`` for each parameter of ``helper`` that ``call`` gives a value
    (``self`` left out of a method called as ``self.f(...)``, or of ``__call__`` called through
    an instance: ``metric(logits, labels)``)."""
    params = list(helper.params.posonly_params) + list(helper.params.params)
    bound = isinstance(call.func, cst.Attribute) or helper.name.value == "__call__"
    if bound and params and params[0].name.value in ("self", "cls"):
        params = params[1:]
    given: list[tuple[str, cst.BaseExpression]] = []
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    for param, arg in zip(params, positional):
        given.append((param.name.value, arg.value))
    by_name = {param.name.value for param in list(params) + list(helper.params.kwonly_params)}
    given += [(arg.keyword.value, arg.value) for arg in call.args if arg.keyword is not None and arg.keyword.value in by_name]
    return given


def flags_off(function: cst.FunctionDef, call: cst.Call) -> frozenset[str]:
    """The parameters of ``function`` that ``call`` leaves off (``False`` or ``None``): given so
    literally, or left at such a default (``def run_iteration(self, data, run_online_evaluation=False)``
    called as ``run_iteration(data)``), and never rebound in it. An ``if`` on one of them does
    not run its body in that call: an opt-in the caller did not take."""
    params = parameters_of(function)
    given = dict(parameters_given(function, call))
    off = set()
    for param in params:
        name = param.name.value
        value = given[name] if name in given else param.default
        if value is not None and nodes.code(value) in ("False", "None") and not bindings(function.body, name):
            off.add(name)
    return frozenset(off)


_NO_GRAD = ("no_grad", "inference_mode")


def evaluates(function: cst.FunctionDef) -> bool:
    """Whether ``function`` evaluates rather than trains: decorated ``@torch.no_grad()`` or
    ``@torch.inference_mode()``, or it calls ``.eval()`` and runs no backward pass."""
    if any(name in nodes.code(decorator.decorator) for decorator in function.decorators for name in _NO_GRAD):
        return True
    calls = [node for node in descendants(function.body, nodes.not_a_definition) if type(node) is cst.Call]
    names = {nodes.call_name(call) for call in calls if type(call.func) is cst.Attribute}
    return "eval" in names and "backward" not in names


def body(block: cst.BaseSuite) -> list:
    return list(block.body) if isinstance(block, cst.IndentedBlock) else [block]


def keyed_item(node: cst.BaseExpression) -> bool:
    """``stats["Batch Size"]``: an item of a record by name, which may hold anything."""
    return isinstance(node, cst.Subscript) and any(
        isinstance(element.slice, cst.Index) and isinstance(element.slice.value, cst.SimpleString) for element in node.slice)


_EXITS = frozenset({"exit", "_exit", "quit", "abort"})


def leaves(block: cst.BaseSuite) -> bool:
    """Whether ``block`` always ends the step: it raises, exits or returns (``if not
    math.isfinite(loss): print(loss); sys.exit(1)``), so it runs once at most."""
    statements = body(block)
    last = statements[-1] if statements else None
    if isinstance(last, cst.If):
        return leaves(last.body) and last.orelse is not None and (
            leaves(last.orelse.body) if isinstance(last.orelse, cst.Else) else leaves(cst.IndentedBlock(body=[last.orelse])))
    if isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        small = last.body[-1]
        if isinstance(small, (cst.Raise, cst.Return)):
            return True
        return isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and nodes.call_name(small.value) in _EXITS
    return False


def host_tensor(call: cst.Call) -> bool:
    """``torch.tensor(values)`` with no ``device=``: made on the host, from what ``values`` holds
    there (a list of device tensors is copied, each waited for)."""
    func = call.func  # asked of every call the walk meets: no code is generated to answer
    return (type(func) is cst.Attribute and func.attr.value == "tensor" and type(func.value) is cst.Name
            and func.value.value == "torch" and bool(call.args) and call.args[0].keyword is None
            and nodes.argument(call, None, "device") is None)


def on_the_host(value: cst.BaseExpression) -> bool:
    """Whether ``value`` is on the host: ``loss.item()``, ``out.cpu()``, ``float(x)``, or what a
    method or a torch function computes from such a value (``torch.argmax(out.cpu(), 1)``): the
    wait was where it was pulled, not where it is read."""
    if type(value) is cst.Call:
        name, func = nodes.call_name(value), value.func
        if name in words.PULL_METHODS or (type(func) is cst.Name and name in ("float", "int")) or host_tensor(value):
            return True
        if type(func) is cst.Attribute:
            return on_the_host(func.value) or (
                words.root_text(func) == "torch" and bool(value.args) and on_the_host(value.args[0].value))
        return False
    if type(value) is cst.BinaryOperation:
        return on_the_host(value.left) or on_the_host(value.right)
    return False


@kept_per_tree  # asked at each call of the function: a script's top level may call it thousands of times
def returns_only_host_values(function: cst.FunctionDef) -> bool:
    """Whether every ``return`` of ``function`` hands back a host value (``loss.item()``, a float)."""
    returns = [node.value for node in descendants(function.body, nodes.not_a_definition) if type(node) is cst.Return]
    return bool(returns) and all(returned is not None and on_the_host(returned) for returned in returns)
