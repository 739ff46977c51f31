"""The words of a training step: which calls create a scaler or an autocast region, which names
are optimizers, which reads see gradients, which calls pull a tensor to the host, which ``if``
tests are flags. Plain functions on nodes; names resolved through imports where they can be."""
from __future__ import annotations

import functools
import re

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.names import may_resolve_within, qualified_names
from migrate.tree_walk import descendants, kept_per_tree, walk

GRAD_SCALERS = frozenset(
    {
        "torch.amp.GradScaler",
        "torch.GradScaler",
        "torch.cuda.amp.GradScaler",
        "torch.cpu.amp.GradScaler",
        "torch.amp.grad_scaler.GradScaler",
        "torch.cuda.amp.grad_scaler.GradScaler",
        "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
    }
)
AUTOCASTS = frozenset(
    {"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast",
     "torch.amp.autocast_mode.autocast"}
)
# Autocast whose default dtype is bfloat16: the CPU one.
_CPU_AUTOCASTS = frozenset({"torch.cpu.amp.autocast"})

_OPTIMIZER_NAME = re.compile(r"(optim|(^|_)opt($|_|\d))", re.IGNORECASE)
_NOT_OPTIMIZER = re.compile(r"(sched|lr|warmup)", re.IGNORECASE)
# Calls that read gradients: clipping and gradient norms.
_GRAD_READING_CALL = re.compile(r"(clip_grad|grad_norm|clip_gradient|gradient_norm)", re.IGNORECASE)
# What may touch scaled gradients: linear (averaging across ranks, in-place scaling) or clearing.
GRAD_NEUTRAL_USES = frozenset({"all_reduce", "all_gather", "reduce", "broadcast", "reduce_scatter", "div_", "mul_",
                               "add_", "copy_", "zero_", "detach_", "requires_grad_", "fill_", "set_"})
# A pull to the host of a tensor: ``loss.item()``, ``out.cpu()``.
PULL_METHODS = frozenset({"item", "cpu", "tolist", "numpy"})
# What moves a tensor without computing anything from the step (a batch put on the device).
_MOVES = frozenset({"to", "cuda", "float", "half", "long", "int", "double", "bfloat16", "contiguous", "next",
                    "non_blocking", "view", "reshape", "squeeze", "unsqueeze", "permute"})


def resolved(visitor: cst.MetadataDependent, node: cst.CSTNode, names: frozenset[str]) -> bool:
    return may_resolve_within(visitor, node, _packages(names)) and bool(qualified_names(visitor, node) & names)


@functools.lru_cache(maxsize=None)
def _packages(names: frozenset[str]) -> frozenset[str]:
    return frozenset(name.split(".")[0] for name in names)


# What an attribute resolves to through an import ends with the attribute's own name
# (``amp.GradScaler`` may be ``torch.cuda.amp.GradScaler``, never ``torch.autocast``): asked of
# every call, ``is_grad_scaler`` and ``autocast_call`` look up the names of a bare name only.
_GRAD_SCALER_CLASSES = frozenset(name.rsplit(".", 1)[1] for name in GRAD_SCALERS)


def is_grad_scaler(visitor: cst.MetadataDependent, call: cst.Call) -> bool:
    if type(call.func) is cst.Attribute:
        return call.func.attr.value in _GRAD_SCALER_CLASSES
    return resolved(visitor, call.func, GRAD_SCALERS) or nodes.call_name(call) in _GRAD_SCALER_CLASSES


def autocast_call(visitor: cst.MetadataDependent, call: cst.Call) -> tuple[str | None, bool | None] | None:
    """``(dtype, enabled)`` of an autocast construction, or None when ``call`` is none."""
    if type(call.func) is cst.Attribute and call.func.attr.value != "autocast":
        return None
    names = qualified_names(visitor, call.func)
    if not (names & AUTOCASTS or (not names and nodes.call_name(call) == "autocast")):
        return None
    device_arg = nodes.argument(call, 0, "device_type")
    device = nodes.literal_string(getattr(device_arg, "value", None))
    # torch.autocast(device_type, dtype, enabled) or torch.cuda.amp.autocast(enabled, dtype)
    new_style = bool(names & {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"}) or (
        not names & AUTOCASTS and device_arg is not None and literal_bool(device_arg.value) is None)
    dtype_arg = nodes.argument(call, 1 if new_style else None, "dtype")
    if dtype_arg is not None:
        dtype = dtype_of(dtype_arg.value)
    elif names & _CPU_AUTOCASTS or (new_style and device == "cpu"):
        dtype = "bfloat16"
    elif new_style and device not in ("cuda", None):
        dtype = None  # another device: its own default
    else:
        dtype = "float16"
    enabled_arg = nodes.argument(call, 2 if new_style else 0, "enabled")
    enabled = True if enabled_arg is None else literal_bool(enabled_arg.value)
    return dtype, enabled


def dtype_of(node: cst.BaseExpression) -> str | None:
    """``"float16"`` for ``torch.float16``/``torch.half``, ``"bfloat16"`` for ``torch.bfloat16``, else None."""
    text = nodes.code(node)
    if re.fullmatch(r"(torch\.)?bfloat16|[\"']bfloat16[\"']", text):
        return "bfloat16"
    if re.fullmatch(r"(torch\.)?(float16|half)|[\"'](float16|half)[\"']", text):
        return "float16"
    return None


def literal_bool(node: cst.BaseExpression) -> bool | None:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None


# A factory of loss scalers: `get_grad_scaler()`, `build_scaler(cfg)`, timm's `NativeScaler()`
# (not scikit-learn's StandardScaler and kin, which scale features).
_SCALER_FACTORY = re.compile(r"((grad|loss|amp|native)_?\w*scaler|^(get|build|make|create)_scaler)", re.IGNORECASE)
_FEATURE_SCALER = re.compile(r"(standard|minmax|robust|maxabs)", re.IGNORECASE)
# What runs a backward pass itself: `accelerator.backward(loss)`, `model_engine.backward(loss)`.
_RUNS_BACKWARD = ("accelerator", "engine", "fabric", "trainer", "strategy", "scaler")


def calls_a_loss_scaler(call: cst.Call, scalers: set[str] | frozenset[str] = frozenset()) -> bool:
    """Whether ``call`` calls a loss scaler object with the loss and the optimizer (timm's
    ``loss_scaler(loss, optimizer, clip_grad=..., parameters=...)``)."""
    func = call.func
    if type(func) is not cst.Name and type(func) is not cst.Attribute:
        return False
    positional = [arg for arg in call.args if arg.keyword is None]
    text = nodes.code(func)
    return len(positional) >= 1 and (text in scalers or scaler_like(text)) \
        and (len(positional) >= 2 or nodes.argument(call, None, "optimizer") is not None)


def makes_a_scaler(call: cst.Call) -> bool:
    name = nodes.call_name(call)
    return bool(_SCALER_FACTORY.search(name)) and not _FEATURE_SCALER.search(name)


# The frameworks whose backward pass scales the loss in float16 mixed precision, by the text
# of what runs it, and the call of theirs that unscales before it clips.
_SCALING_FRAMEWORKS = (("accelerator", "Accelerate", "clip_grad_norm_"), ("fabric", "Fabric", "clip_gradients"))


def scaling_framework(receiver: str) -> tuple[str, str] | None:
    """``(framework, its clip)`` for what runs ``receiver.backward(loss)`` (``accelerator``,
    ``self.fabric``) or ``self.manual_backward(loss)`` (``"self"``: Lightning), where float16
    mixed precision scales the loss inside it; None for a DeepSpeed engine or an unknown one,
    which keep their gradients to themselves."""
    if receiver == "self":
        return "Lightning", "self.clip_gradients(optimizer, gradient_clip_val=...)"
    lowered = receiver.rsplit(".", 1)[-1].lower()
    for word, framework, clip in _SCALING_FRAMEWORKS:
        if word in lowered:
            return framework, f"{receiver}.{clip}(...)"
    return None


def made_by_a_factory(visitor: cst.MetadataDependent, call: cst.Call, scalers: set[str]) -> bool:
    """Whether ``call``, the value of an assignment, makes a loss scaler that is not torch's own
    ``GradScaler``: ``NativeScaler()``, ``get_grad_scaler(cfg)``; not a call of one
    (``loss_scaler(loss, optimizer)``)."""
    return makes_a_scaler(call) and not is_grad_scaler(visitor, call) and not calls_a_loss_scaler(call, scalers) \
        and nodes.code(call.func) not in scalers


def made_scaler_enabled(call: cst.Call) -> bool | None:
    """Whether a scaler a factory makes is enabled: as its ``enabled=`` says; always for timm's
    ``NativeScaler`` family and a ``...GradScaler(...)`` (a ``GradScaler`` without it is on);
    not known for another factory (``get_grad_scaler(cfg)`` may return a disabled one)."""
    given = nodes.argument(call, None, "enabled")
    if given is not None:
        return literal_bool(given.value)
    name = nodes.call_name(call).lower()
    return True if "native" in name or name.endswith("gradscaler") else None


def runs_backward_itself(receiver: cst.BaseExpression) -> bool:
    """Whether ``receiver.backward(loss)`` is a framework's backward (Accelerate, DeepSpeed, Fabric),
    not ``tensor.backward(gradient)``."""
    text = nodes.code(receiver)
    last = text.rsplit(".", 1)[-1].lower()
    # `model.backward(loss)`: a DeepSpeed engine is often kept under the model's name
    return text == "self" or any(word in text.lower() for word in _RUNS_BACKWARD) or last in ("model", "net", "module")


def scaler_like(text: str) -> bool:
    return bool(re.search(r"(^|_)scaler$", text.rsplit(".", 1)[-1], re.IGNORECASE))


def model_like(text: str, models: set[str]) -> bool:
    """``model``, ``self.net``, ``student_model``, or anything whose ``parameters()`` the file uses."""
    last = text.rsplit(".", 1)[-1].lower()
    return text in models or "model" in last or last == "net" or last.endswith("_net")


def optimizer_like(text: str) -> bool:
    last = text.rsplit(".", 1)[-1]
    return bool(_OPTIMIZER_NAME.search(last)) and not _NOT_OPTIMIZER.search(last)


def reads_gradients(call_or_attribute: cst.CSTNode) -> bool:
    if isinstance(call_or_attribute, cst.Call):
        return bool(_GRAD_READING_CALL.search(nodes.call_name(call_or_attribute)))
    return isinstance(call_or_attribute, cst.Attribute) and call_or_attribute.attr.value == "grad"


def moves_only(call: cst.Call) -> bool:
    return nodes.call_name(call) in _MOVES


def joined_by(test: cst.BaseExpression, operator: type) -> set[str]:
    """The texts of the conditions ``test`` joins with ``operator`` (``cst.And`` or ``cst.Or``),
    itself among them: ``{(a) or (b), a, b}`` for ``(a) or (b)``; parentheses are not kept."""
    found = {nodes.code(test.with_changes(lpar=(), rpar=()) if getattr(test, "lpar", None) else test)}
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, operator):
        found |= joined_by(test.left, operator) | joined_by(test.right, operator)
    return found


def conjuncts(test: cst.BaseExpression) -> list[tuple[str, bool]]:
    """Each condition ``test`` joins with ``and``, normalised (``normalised_test``): for
    ``not loss_scaler and use_apex_amp``, ``[("loss_scaler", False), ("use_apex_amp", True)]``."""
    inner = test.with_changes(lpar=(), rpar=()) if getattr(test, "lpar", None) else test
    if isinstance(inner, cst.BooleanOperation) and isinstance(inner.operator, cst.And):
        return conjuncts(inner.left) + conjuncts(inner.right)
    return [normalised_test(test)]


def normalised_test(test: cst.BaseExpression) -> tuple[str, bool]:
    """``x``, ``x is not None``, ``x is None``, ``not x``: the flag ``x`` and whether the arm runs when set."""
    polarity = True
    while True:
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, polarity = test.expression, not polarity
            continue
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            target = test.comparisons[0]
            other = nodes.code(target.comparator)
            if other in ("None", "False", "True"):
                negative = isinstance(target.operator, (cst.Is, cst.Equal)) == (other != "True")
                test, polarity = test.left, polarity != negative
                continue
        break
    if (attribute := _attribute_tested(test)) is not None:
        return re.sub(r"^self\.", "", attribute), polarity
    if getattr(test, "lpar", None):
        test = test.with_changes(lpar=[], rpar=[])  # `(a and b)` over two lines is `a and b`
    text = re.sub(r"\(\s+|\s+\)", lambda m: m.group().strip(), " ".join(nodes.code(test).split()))
    return re.sub(r"^self\.", "", text), polarity


def _attribute_tested(test: cst.BaseExpression) -> str | None:
    """``o.a`` for ``getattr(o, "a", None)`` and ``hasattr(o, "a")``: the test that an attribute set
    only in some runs (``self.scaler``, made under ``if use_amp:``) holds something, spelled as
    ``if self.scaler is not None:`` spells it."""
    if not (isinstance(test, cst.Call) and isinstance(test.func, cst.Name) and test.func.value in ("getattr", "hasattr")):
        return None
    wanted = 3 if test.func.value == "getattr" else 2
    if len(test.args) != wanted or any(arg.keyword or arg.star for arg in test.args):
        return None
    name = test.args[1].value
    if not (isinstance(name, cst.SimpleString) and name.value[1:-1].isidentifier()) or (
            wanted == 3 and not nodes.is_none(test.args[2].value)):
        return None
    return f"{nodes.code(test.args[0].value)}.{name.value[1:-1]}"


# Flags a trainer sets every n steps: `if self.control.should_log:`, `if log_now:`.
_INTERVAL_FLAG = re.compile(r"(should_(log|save|evaluate|eval)|log_now|do_log|is_log(ging)?_step)$")
# Helpers that test a step count: `if divisible_by(step, 10):`, `if every_n_steps(i, 100):`.
_INTERVAL_CALL = re.compile(r"(divisible|every_n|is_log(ging)?_step|should_log)", re.IGNORECASE)


@kept_per_tree  # asked of every value a flag was given, at each `if` testing the flag
def has_modulo(test: cst.BaseExpression) -> bool:
    """Whether ``test`` runs its arm every n steps: a ``%``, or a flag a trainer sets that way."""
    finder = _FindModulo()
    walk(test, finder)
    return finder.found or any(_INTERVAL_FLAG.search(nodes.code(name)) for name in _flags(test)) or any(
        type(node) is cst.Call and _INTERVAL_CALL.search(nodes.call_name(node)) for node in descendants(test))


class _FindModulo(cst.CSTVisitor):
    found = False

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        self.found = self.found or isinstance(node.operator, cst.Modulo)


def _flags(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(test, cst.BooleanOperation):
        return _flags(test.left) + _flags(test.right)
    return [test] if isinstance(test, (cst.Name, cst.Attribute)) else []


# A count of steps or epochs: `if global_step == 0:` and `if epoch == 0 and i == 0:` hold once.
_COUNTER = re.compile(r"(^|_)(i|it|iter|iters|iteration|idx|step|steps|epoch|batch_idx|n_iter|updates)$", re.IGNORECASE)


def holds_on_one_step(test: cst.BaseExpression) -> bool:
    """Whether ``test`` holds on one step of the count it reads: a counter equal to a value
    (``global_step == 0``, ``i == len(loader) - 1``); not ``rank == 0``, which holds on every step."""
    if isinstance(test, cst.BooleanOperation):
        left, right = holds_on_one_step(test.left), holds_on_one_step(test.right)
        return (left or right) if isinstance(test.operator, cst.And) else (left and right)
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1 or not isinstance(test.comparisons[0].operator, cst.Equal):
        return False
    sides = (test.left, test.comparisons[0].comparator)
    return any(isinstance(side, (cst.Name, cst.Attribute)) and _COUNTER.search(nodes.code(side).rsplit(".", 1)[-1])
               for side in sides)


def compares_time(test: cst.BaseExpression) -> bool:
    """``if now - last_print >= 30``, ``if time.time() - t0 > interval``: a test on elapsed time."""
    finder = _FindTimeComparison()
    walk(test, finder)
    return finder.found


class _FindTimeComparison(cst.CSTVisitor):
    found = False

    def visit_Comparison(self, node: cst.Comparison) -> None:
        ordered = any(isinstance(t.operator, (cst.GreaterThan, cst.GreaterThanEqual, cst.LessThan, cst.LessThanEqual))
                      for t in node.comparisons)
        self.found = self.found or (ordered and "time" in nodes.code(node).lower())


def root_text(node: cst.BaseExpression) -> str | None:
    """``loss`` for ``loss``, ``loss.detach()``, ``losses["ce"]``, ``self.loss``: the name a value
    is read through, without calls in between that compute something new."""
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            node = node.func.value
        elif isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Attribute) and not (isinstance(node.value, cst.Name) and node.value.value == "self"):
            node = node.value
        else:
            break
    if isinstance(node, (cst.Name, cst.Attribute)):
        return nodes.code(node)
    return None


def grad_attribute(node: cst.BaseExpression) -> cst.CSTNode | None:
    """The ``x.grad`` of ``x.grad`` or ``x.grad.data``, else None."""
    if isinstance(node, cst.Attribute) and node.attr.value == "data":
        node = node.value
    return node if isinstance(node, cst.Attribute) and node.attr.value == "grad" else None


# What a gradient tensor says about itself, not about its values: the loss scale changes none of it.
_GRAD_METADATA = frozenset({"dtype", "shape", "device", "is_cuda", "requires_grad", "layout", "ndim", "is_sparse"})
_GRAD_METADATA_CALLS = frozenset({"size", "dim", "numel", "type", "get_device", "is_contiguous"})


class GradientUses(cst.CSTVisitor):
    """Collects, as it walks, the ids of the ``x.grad`` attributes that read no gradient value:
    moved, averaged or cleared (``dist.all_reduce(p.grad)``, ``p.grad.zero_()``), or compared with
    None. A call or comparison is met before the attributes inside it, so ``visit_Attribute`` of a
    subclass already knows."""

    def __init__(self) -> None:
        super().__init__()
        self.unread: set[int] = set()

    def visit_Call(self, node: cst.Call) -> bool | None:
        if nodes.call_name(node) in _GRAD_METADATA_CALLS and isinstance(node.func, cst.Attribute):
            self.unread.add(id(grad_attribute(node.func.value)))  # `p.grad.size()`
        if nodes.call_name(node) in GRAD_NEUTRAL_USES:
            operands = [arg.value for arg in node.args]
            if isinstance(node.func, cst.Attribute):
                operands.append(node.func.value)
            self.unread.update(id(grad_attribute(operand)) for operand in operands)
        return None

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if len(node.comparisons) == 1 and nodes.code(node.comparisons[0].comparator) == "None":
            self.unread.add(id(node.left))  # `p.grad is not None`

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value in _GRAD_METADATA:
            self.unread.add(id(grad_attribute(node.value)))  # `p.grad.dtype`: the same whatever the scale


def unread_gradients(expression: cst.CSTNode) -> set[int]:
    """The ids of the ``x.grad`` attributes in ``expression`` that read no gradient value (``GradientUses``)."""
    uses = GradientUses()
    walk(expression, uses)
    return uses.unread


def reads_gradients_in(statement: cst.CSTNode) -> bool:
    """Whether ``statement`` reads gradients as the step model counts a read: a clip or a norm
    (``reads_gradients``), or an ``x.grad`` that ``unread_gradients`` does not leave out."""
    unread = unread_gradients(statement)
    return any(
        (isinstance(node, cst.Call) or isinstance(node, cst.Attribute) and id(node) not in unread) and reads_gradients(node)
        for node in descendants(statement, nodes.not_a_definition)
    )
