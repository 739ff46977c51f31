"""The test under which a scaled backward ran, said again where its optimizer steps."""
from __future__ import annotations

import ast

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Step
from migrate.apex_plan.syntax import backward_calls, calls
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.step_sites import steps_in_file
from migrate.apex_plan.vocabulary import (
    EACH,
    HOLDS_GRADIENTS,
    HOLDS_GRADIENTS_EACH,
    alias_present,
    attribute_set,
    grouped_text,
    negated,
    normal,
)
from migrate.flow.bindings import bindings
from migrate.step_model.shapes import parameters_of
from migrate.step_model.vocabulary import joined_by
from migrate.tree_walk import descendants


def flag_spellings(tree: FileTree, test: cst.BaseExpression, base_bindings: tuple = ()) -> frozenset[str]:
    """``test`` (the flag an ``if`` around ``initialize`` tests) and the names the code copies its
    value into, in the function holding that ``if``: ``self.fp16 = fp16`` where the class binds
    ``self.fp16`` nowhere else, ``use_amp = args.fp16`` where the function binds ``use_amp``
    nowhere else; in either case the flag itself is not bound again there. A test of a copy
    (``if not self.fp16: loss.backward()`` in another method) is a test of the flag, as is one
    of a parameter every call hands the flag (``_parameters_given``), or of the flag's object kept
    on ``self`` (``_kept_options``)."""
    text = nodes.code(test)
    function = tree.function(tree.parent.get(id(test)))
    if not isinstance(test, (cst.Name, cst.Attribute)) or function is None or bindings(function, text):
        return frozenset({text} | _parameters_given(tree, frozenset({text})))
    owner = tree.owner_class(function)
    found = {text} | _kept_options(tree, function, test, base_bindings)
    for node in descendants(function.body, nodes.not_a_definition):
        if not (isinstance(node, cst.Assign) and len(node.targets) == 1 and nodes.code(node.value) == text):
            continue
        copy = nodes.code(node.targets[0].target)
        if isinstance(node.targets[0].target, cst.Name):
            scope = function
        elif copy.startswith("self.") and owner is not None and copy.count(".") == 1:
            scope = owner
        else:
            continue
        if len(bindings(scope, copy, methods=True)) == 1:
            found.add(copy)
    return frozenset(found | _parameters_given(tree, frozenset(found)))


def _kept_options(tree: FileTree, function: cst.FunctionDef, test: cst.BaseExpression, base_bindings: tuple) -> set[str]:
    """``self.opt.apex`` for the flag ``opt.apex``, ``opt`` a parameter of ``function`` (bound
    nowhere else there) that its class keeps as ``self.opt``: ``self.opt = opt`` there, the class's
    one binding of it; or, where the class binds ``self.opt`` nowhere, ``function`` is ``__init__``
    and hands ``opt`` to its base's (``BaseModel.__init__(self, opt)``, ``super().__init__(opt)``),
    which keeps that parameter as ``self.opt`` (``migrate.base_bindings``). Nothing in the file
    may bind the flag itself."""
    owner = tree.owner_class(function)
    if not (type(test) is cst.Attribute and type(test.value) is cst.Name) or owner is None:
        return set()
    held, rest = test.value.value, test.attr.value
    if held not in {param.name.value for param in parameters_of(function)} or bindings(function, held):
        return set()
    kept = set()
    if [nodes.code(b) for b in bindings(owner, f"self.{held}", methods=True)] == [f"self.{held} = {held}"]:
        kept.add(f"self.{held}")
    elif function.name.value == "__init__" and isinstance(function.body, cst.IndentedBlock):
        bases = {nodes.code(base.value) for base in owner.bases}
        for line in function.body.body:
            call = line.body[0].value if type(line) is cst.SimpleStatementLine and type(line.body[0]) is cst.Expr else None
            if type(call) is not cst.Call or not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "__init__"):
                continue
            called = nodes.code(call.func.value)
            base = next(iter(bases)) if called.startswith("super(") and len(bases) == 1 else called
            args = call.args[1:] if called in bases else call.args  # `Base.__init__(self, opt)`
            if base not in bases or any(arg.keyword is not None or arg.star for arg in args):
                continue
            given = [i for i, arg in enumerate(args) if nodes.code(arg.value) == held]
            kept.update(f"self.{attribute}" for name, attribute, position in base_bindings
                        if name == base and position in given and not bindings(owner, f"self.{attribute}", methods=True))
    flags = {f"{spelling}.{rest}" for spelling in kept}
    return {flag for flag in flags if not bindings(tree.module, flag, methods=True)} if flags else set()


def _parameters_given(tree: FileTree, spellings: frozenset[str]) -> set[str]:
    """The parameters of the file's functions that every call of the file gives one of
    ``spellings`` (``scaled_backward(loss, opt, use_amp)`` for ``def scaled_backward(loss,
    optimizer, mixed=True)``), bound nowhere else in the function, and a parameter of no other
    function: a test of the parameter there is a test of the flag."""
    functions = [node for node in descendants(tree.module) if type(node) is cst.FunctionDef]
    named: dict[str, int] = {}
    for function in functions:
        for param in parameters_of(function):
            named[param.name.value] = named.get(param.name.value, 0) + 1
    found = set()
    for function in functions:
        calls = tree.calls_of(function)
        for param in parameters_of(function):
            name = param.name.value
            if named[name] != 1 or bindings(function, name) or not calls:
                continue
            given = [tree.arguments(function, call).get(name) for call in calls]
            if all(value is not None and nodes.code(value) in spellings for value in given):
                found.add(name)
    return found


def in_failing_arm(tree: FileTree, node: cst.CSTNode, flags: set[str] | frozenset[str], within: cst.CSTNode | None = None) -> bool:
    """Whether ``node`` sits where one of ``flags`` fails: ``else:`` of ``if flag:``, or the body
    of ``if not flag:`` (up to ``within``, when given)."""
    child, parent = node, tree.parent.get(id(node))
    while parent is not None and parent is not within:
        if isinstance(parent, cst.If):
            test = nodes.code(parent.test)
            if (test in flags and child is parent.orelse) or (test.startswith("not ") and test[4:] in flags and child is parent.body):
                return True
        child, parent = parent, tree.parent.get(id(parent))
    return False


def where_absent(tree: FileTree, node: cst.CSTNode, alias: str) -> bool:
    """Whether ``node`` sits where what received the scaler is None (``else:`` of ``if self.amp
    is not None:``, or the body of ``if self.amp is None:``): apex was off there."""
    absent = {normal(f"{alias} is None"), normal(f"not {alias}")}
    child, parent = node, tree.parent.get(id(node))
    while parent is not None:
        if isinstance(parent, cst.If) and child is parent.body and normal(nodes.code(parent.test)) in absent:
            return True
        child, parent = parent, tree.parent.get(id(parent))
    return in_failing_arm(tree, node, {alias, alias_present(alias)})


def never_runs(tree: FileTree, node: cst.CSTNode) -> bool:
    """Whether ``node`` sits where a parameter of its function fails (``if not mixed:``, or ``else:``
    of ``if mixed:``) that every call of the file leaves at a ``True`` default and the function
    never binds (``def scaled_backward(loss, opt, mixed=True)`` called as ``scaled_backward(loss,
    opt)``). A function the file never calls may be called from elsewhere: not assumed."""
    function = tree.function(node)
    if function is None:
        return False
    on = tree.per_scope(("left on", id(function)), lambda: _left_on(tree, function))
    return bool(on) and in_failing_arm(tree, node, on, within=function)


def _left_on(tree: FileTree, function: cst.FunctionDef) -> frozenset[str]:
    """The parameters of ``function`` defaulting to ``True`` that no call of the file gives and
    the function never binds; none where the file never calls it."""
    calls = tree.calls_of(function)
    if not calls:
        return frozenset()
    return frozenset(param.name.value for param in parameters_of(function)
                     if param.default is not None and nodes.code(param.default) == "True" and not bindings(function, param.name.value)
                     and all(param.name.value not in tree.arguments(function, call) for call in calls))


class StepConditions(Step):
    """The test under which a scaled backward ran, said again where its optimizer steps."""

    def step_condition(self, conditions: list[str | None], call: cst.Call, optimizer: str,
                       at: cst.CSTNode | None = None, skipped: cst.CSTNode | None = None) -> str | None:
        """The test under which the scaled backward ran, when the step sits outside that ``if``.

        None when no test is needed: no branch, or the branch's test is the flag the scaler
        was created with (a disabled scaler steps the optimizer plainly). Tests that an ``if``
        around the step ``at`` already makes are left out. A None condition is asked as whether
        the optimizer holds gradients: a test that cannot be asked again, or (``skipped``, the
        step) a way to the step that runs no backward pass.
        """
        if self.setup.in_block:
            # The block that creates the scaler may not have run: there apex was off, and the
            # optimizer steps plainly. Where the step goes through what received the scaler
            # (`self.amp = self.scaler if use_amp else None`), that is what may be missing.
            scaler = self.scaler_of(call)
            conditions = [*conditions, attribute_set(scaler) if scaler in (self.setup.scaler, *self.setup.extra_scalers) else alias_present(scaler)]
        held = self._held_at(at) if at is not None else set()
        kept: dict[str | None, str | None] = {}  # each test once, by how Python reads it
        for condition in conditions:
            key = None if condition is None else normal(condition)
            if key not in held:
                kept.setdefault(key, condition)
        conditions = list(kept.values())
        if not conditions or (len(conditions) == 1 and conditions[0] in self.setup.guard_tests):
            return None
        if None in conditions:
            # `if torch.isnan(loss).any(): skip` cannot be asked again at the step. Whether the
            # optimizer holds gradients can: a skipped batch leaves none after `zero_grad()`,
            # where `scaler.step` would find nothing scaled and fail. That is the same question
            # where nothing else gives the optimizer gradients.
            why = (f"a way to `{optimizer}.step()` at line {self.tree.line(skipped)} runs no backward pass" if skipped is not None
                   else f"the scaled backward runs under a test that calls something (line {self.tree.line(call)})")
            if any(delayed_unscale(scale) is not None for scale in self.sites.calls["scale_loss"]):
                # a skipped last micro-batch: apex stepped with the gradients a `delay_unscale`
                # pass left scaled; the scaler unscales them
                self.draft.unsafe.append(
                    f"{why} and `delay_unscale` keeps gradients scaled: where the pass before the step is skipped, apex stepped "
                    "with the scaled gradients of the passes before it; the scaler unscales them"
                )
            elif not self.tree.per_scope(("only scaled gradients", self.setup.guard_tests), self._only_scaled_gradients):
                self.draft.unsafe.append(f"{why}: `{optimizer}` steps through the scaler where it holds gradients, else plainly as apex did")
            conditions = [c for c in conditions if c is not None]
            listed = any(index == EACH for _, index in steps_in_file(self.tree.module, optimizer))  # a list, stepped in a loop
            conditions.insert(0, (HOLDS_GRADIENTS_EACH if listed else HOLDS_GRADIENTS).format(optimizer=optimizer))
        return " and ".join(f"({c})" if " " in c and len(conditions) > 1 and not c.startswith("any(") else c for c in reversed(conditions))

    def clearers(self) -> frozenset[str]:
        """What a ``zero_grad()`` is called on to clear the gradients the scaler steps: a model
        ``initialize`` was given, or an optimizer a loss is scaled for."""
        return self.tree.per_scope(("clearers", id(self.sites), self.setup.model_codes), lambda: frozenset(self.setup.model_codes) | {
            nodes.code(optimizer.value) for call in self.sites.calls["scale_loss"]
            if (optimizer := nodes.argument(call, 1, "optimizers")) is not None})

    def _only_scaled_gradients(self) -> bool:
        """Whether an optimizer holds gradients at its step exactly where a scaled backward ran
        since they were cleared: every ``zero_grad()`` of the file leaves None, one clears what
        ``initialize`` was given, and every backward pass that can run while the scaler is on is
        apex's scaled one, or a warm-up pass whose gradients are cleared right after it; and none
        is written by hand."""
        clearers = self.clearers()
        zero_grads = calls(self.tree.module, lambda name: name == "zero_grad", nested=True)
        if not any(nodes.receiver(call) in clearers for call in zero_grads) or not all(map(leaves_none, zero_grads)):
            return False
        if any(type(node) in (cst.AssignTarget, cst.AugAssign) and isinstance(node.target, cst.Attribute)
               and node.target.attr.value == "grad" for node in descendants(self.tree.module)):
            return False  # gradients written by hand (`p.grad = g`)
        withs = self.sites.scale_loss_statements
        # a call of the file's own `backward(loss)` helper is not a backward pass: those in its body are asked
        return all(self.tree.inside_any(backward, withs) or in_failing_arm(self.tree, backward, self.setup.guard_tests)
                   or never_runs(self.tree, backward) or self.warm_up(backward) or self.tree.helper(backward) is not None
                   for backward in backward_calls(self.tree.module, nested=True))

    def warm_up(self, backward: cst.Call) -> bool:
        """A warm-up backward pass (``cleared_right_after``) in the function of ``initialize``:
        no step sees its gradients; where it runs after ``initialize``, its forward pass goes
        under autocast (``AutocastPlanning.plan_warm_up``), as apex cast it."""
        function = self.tree.function(backward)
        return (any(self.tree.function(call) is function for call in self.sites.calls["initialize"])
                and cleared_right_after(self.tree, backward, self.clearers()))

    def _held_at(self, node: cst.CSTNode) -> set[str]:
        """The tests (``normal``) that hold where ``node`` runs: those of each ``if`` whose body
        holds it, and each part they join with ``and``."""
        held: set[str] = set()
        inner, above = node, self.tree.parent.get(id(node))
        while above is not None:
            if isinstance(above, cst.If) and above.body is inner:
                held |= {normal(text) for text in joined_by(above.test, cst.And)}
            inner, above = above, self.tree.parent.get(id(above))
        return held

    def branch_condition(self, branch: cst.If | cst.Else) -> str | None:
        """When the body of ``branch`` runs: ``test``, ``not (a) and b`` for an elif, ``not (test)`` for else.

        None when a test of the chain has side effects (calls), so it cannot be evaluated again.
        """
        own = branch.test if isinstance(branch, cst.If) else None
        earlier = []
        link = branch
        while True:
            above = self.tree.parent.get(id(link))
            if not (isinstance(above, cst.If) and above.orelse is link):
                break
            earlier.insert(0, above.test)
            link = above
        tests = [*earlier, *([own] if own is not None else [])]
        if not all(nodes.is_pure(test) for test in tests):
            return None
        parts = [negated(t) for t in earlier] + ([nodes.code(own)] if own is not None else [])
        return " and ".join(grouped_text(p) if len(parts) > 1 else p for p in parts)


def leaves_none(zero_grad: cst.Call) -> bool:
    """Whether ``zero_grad(...)`` sets the gradients to None (torch's default), not to zeros."""
    given = nodes.argument(zero_grad, 0, "set_to_none")
    return given is None or nodes.code(given.value) == "True"


def cleared_right_after(tree: FileTree, backward: cst.Call, clearers: frozenset[str]) -> bool:
    """Whether the gradients of the backward pass ``backward`` are cleared before anything reads
    them: ``loss.backward()`` on a line of its own, followed in its block, past lines that neither
    step, clip, read gradients nor pass backward again, by ``model.zero_grad()`` of one of
    ``clearers`` (a warm-up pass that allocates memory). No step ever sees them."""
    line = tree.statement(backward)
    block = tree.parent.get(id(line))
    if not isinstance(line, cst.SimpleStatementLine) or not hasattr(block, "body") or not isinstance(block.body, (list, tuple)):
        return False
    following = list(block.body)[list(block.body).index(line) + 1:]
    for statement in following:
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        cleared = calls(statement, lambda name: name == "zero_grad")
        if any(nodes.receiver(call) in clearers and leaves_none(call) for call in cleared) and len(statement.body) == 1:
            return True
        touches = calls(statement, lambda name: name in ("step", "backward", "unscale_") or "clip" in name, nested=True)
        if touches or any(type(node) is cst.Attribute and node.attr.value == "grad" for node in descendants(statement)):
            return False
    return False


def tests_a_parameter(tree: FileTree, test_of: cst.If) -> bool:
    """Whether the ``if`` tests a parameter of its function itself (``if self.use_apex and
    training:``), whose value may differ from call to call (``__init__`` runs once an object)."""
    function = tree.function(test_of)
    if function is None or function.name.value == "__init__":
        return False
    parameters = {param.name.value for param in parameters_of(function)} - {"self", "cls"}
    read = {node.value for node in descendants(test_of.test)
            if type(node) is cst.Name and not isinstance(tree.parent.get(id(node)), cst.Attribute)}
    return bool(parameters & read)


def flag_if(tree: FileTree, initialize_statement: cst.CSTNode, initialize_calls: list[cst.Call]) -> cst.If | None:
    """The ``if flag:`` whose body holds ``initialize``, where its test says whether apex ran at
    all: None where the test may change, runs in a loop (``if epoch == 0:`` is a trigger), is an
    ``elif``'s, or another arm initializes too (the test then picks the options)."""
    block = tree.parent.get(id(initialize_statement))
    owner = tree.parent.get(id(block))
    if not isinstance(owner, cst.If) or owner.body is not block or tree.changes_its_test(owner) or tree.in_loop(owner):
        return None
    above = tree.parent.get(id(owner))
    if isinstance(above, cst.If) and above.orelse is owner:
        return None
    if owner.orelse is not None and any(tree.inside(call, owner.orelse) for call in initialize_calls):
        return None
    return owner


def disabling_if(tree: FileTree, initialize_statement: cst.CSTNode, initialize_calls: list[cst.Call]) -> cst.If | None:
    """The ``flag_if`` of ``initialize``, where the scaler is made in that body and a disabled one
    stands in before: where its test was false, the scaler stayed disabled (an ``else:
    loss.backward()`` of the same test is no backward it must scale). None where the test reads a
    parameter of its function, whose value may differ from call to call."""
    owner = flag_if(tree, initialize_statement, initialize_calls) or _flag_if_around_the_call(tree, initialize_statement)
    return None if owner is None or tests_a_parameter(tree, owner) else owner


def _flag_if_around_the_call(tree: FileTree, initialize_statement: cst.CSTNode) -> cst.If | None:
    """``if self.use_amp: self.setup_amp()`` where ``setup_amp``'s own body runs ``initialize``:
    the method's one call, and the name read nowhere else in the file, so the method runs only
    where that test holds (``flag_if``'s conditions, on the ``if`` around the call)."""
    method = tree.function(initialize_statement)
    if method is None or tree.parent.get(id(initialize_statement)) is not method.body:
        return None
    name = method.name.value
    calls = tree.calls_of(method)
    named = [node for node in descendants(tree.module) if type(node) is cst.Name and node.value == name]
    if len(calls) != 1 or len(named) != 2:  # the definition's name and the call's
        return None
    line = tree.parent.get(id(calls[0]))
    statement = tree.parent.get(id(line))
    if not (isinstance(line, cst.Expr) and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return None
    return flag_if(tree, statement, calls)


def unscaled_there(tree: FileTree, call: cst.Call, node: cst.CSTNode) -> bool:
    """Whether ``node`` runs only where ``amp.scale_loss`` ``call`` unscaled the gradients: after it,
    in the body of an ``if`` testing the opposite of its ``delay_unscale`` (``if backward_now:`` beside
    ``delay_unscale=not backward_now``), or after an ``if`` testing ``delay_unscale``'s value whose
    body leaves (``if not backward_now: return``); on names nothing binds again between the two."""
    delay = delayed_unscale(call)
    if delay is None:
        return True
    delayed = _forms(nodes.code(delay))
    guard = None
    child = node
    for ancestor in tree.ancestors(node):
        if isinstance(ancestor, cst.If) and tree.inside(node, ancestor.body) and delayed & _forms(f"not ({nodes.code(ancestor.test)})"):
            guard = ancestor
        elif isinstance(ancestor, (cst.IndentedBlock, cst.Module)) and child in ancestor.body:
            guard = next((s for s in ancestor.body[:ancestor.body.index(child)] if _leaves_when(s, delayed)), None)
        if guard is not None:
            break
        child = ancestor
    return guard is not None and _same_value_at(tree, delay, call, guard)


def on_delayed_passes(tree: FileTree, call: cst.Call, node: cst.CSTNode) -> bool:
    """Whether ``node`` runs only where ``amp.scale_loss`` ``call`` delayed unscaling: in the body of
    an ``if`` testing its ``delay_unscale`` value (``if not backward_now: return``), after it. There
    apex neither unscaled nor checked for overflow: ending the iteration there loses no update."""
    delay = delayed_unscale(call)
    if delay is None:
        return False
    delayed = _forms(nodes.code(delay))
    guard = next((ancestor for ancestor in tree.ancestors(node) if isinstance(ancestor, cst.If)
                  and tree.inside(node, ancestor.body) and delayed & _forms(nodes.code(ancestor.test))), None)
    return guard is not None and _same_value_at(tree, delay, call, guard)


def delayed_unscale(call: cst.Call) -> cst.BaseExpression | None:
    """``amp.scale_loss``'s ``delay_unscale`` value where it may keep the gradients scaled on
    leaving; None where it is absent or plainly off."""
    delay = nodes.argument(call, 4, "delay_unscale")
    return None if delay is None or nodes.code(delay.value).strip() in ("False", "0", "None") else delay.value


def _leaves_when(statement: cst.CSTNode, delayed: set[str]) -> bool:
    """``if <delayed>: ... return`` (or ``continue``, ``break``, ``raise``) with no ``else``."""
    if not (isinstance(statement, cst.If) and statement.orelse is None and delayed & _forms(nodes.code(statement.test))):
        return False
    last = statement.body.body[-1] if isinstance(statement.body, cst.IndentedBlock) else statement.body
    smalls = last.body if isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else ()
    return bool(smalls) and isinstance(smalls[-1], (cst.Return, cst.Continue, cst.Break, cst.Raise))


def _same_value_at(tree: FileTree, delay: cst.BaseExpression, call: cst.Call, test_if: cst.If) -> bool:
    """Whether ``test_if`` (a test of ``delay``'s value) reads what ``delay`` read at ``call``: no
    call in it, one function, the ``if`` after the call, and no binding of its names between."""
    statement, function = tree.statement(call), tree.function(call)
    if not nodes.is_pure(test_if.test) or function is None or tree.function(test_if) is not function \
            or tree.order[id(statement)] > tree.order[id(test_if)]:
        return False
    names = {nodes.code(n) for n in descendants(delay) if isinstance(n, (cst.Name, cst.Attribute))}
    between = range(tree.order[id(statement)], tree.order[id(test_if)])
    return not any(tree.order[id(tree.statement(binding))] in between for name in names for binding in bindings(function, name))


_FLIPPED = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
            ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}


def _forms(test: str) -> set[str]:
    """The ways of writing what ``test`` says, as Python reads them: double negations dropped
    (``not (not x)`` is ``x``), and for ``not`` of one comparison the other operator
    (``i % n != 0`` for ``not (i % n == 0)``)."""
    try:
        expression = ast.parse(test.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return set()
    while isinstance(expression, ast.UnaryOp) and isinstance(expression.op, ast.Not) \
            and isinstance(expression.operand, ast.UnaryOp) and isinstance(expression.operand.op, ast.Not):
        expression = expression.operand.operand
    forms = {ast.dump(expression)}
    inner = expression.operand if isinstance(expression, ast.UnaryOp) and isinstance(expression.op, ast.Not) else None
    if isinstance(inner, ast.Compare) and len(inner.ops) == 1 and type(inner.ops[0]) in _FLIPPED:
        forms.add(ast.dump(ast.Compare(inner.left, [_FLIPPED[type(inner.ops[0])]()], inner.comparators)))
    return forms
