"""The words of the plan: constants, the plan itself, what a site is, and code-text helpers."""
from __future__ import annotations

import ast

from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import NamedTuple

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Report
from migrate.tree_walk import descendants
from migrate.types import ImportChange

CORE = ("initialize", "scale_loss", "master_params", "state_dict", "load_state_dict")


# apex.amp names handled by their own rules, independently of initialize (no scaler involved).
CAST_API = frozenset({
    "half_function", "float_function", "bfloat16_function", "promote_function", "register_half_function",
    "register_float_function", "register_bfloat16_function", "register_promote_function", "disable_casts", "lists",
})


INITIALIZE, SCALE_LOSS, MASTER_PARAMS, STATE_DICT = "AMP002", "AMP003", "AMP004", "AMP005"
# each core call of apex amp: the rule that reports it, and how a finding names it
CORE_FINDINGS = {
    "initialize": (INITIALIZE, "`amp.initialize`"),
    "scale_loss": (SCALE_LOSS, "`amp.scale_loss`"),
    "master_params": (MASTER_PARAMS, "`amp.master_params`"),
    "state_dict": (STATE_DICT, "`amp.state_dict`"),
    "load_state_dict": (STATE_DICT, "`amp.load_state_dict`"),
}


HELPER_NAME = "_scaler_state_from_apex"


MANUAL_STEP_MARKER = "TODO(ampmigrate):"  # a step the rewrite leaves to the user (reported by AMP017)


MASTER_COPIES = "under O2 `amp.master_params` are fp32 copies; natively they are the model's parameters"


def operand(expression: cst.BaseExpression) -> str:
    """``expression``'s code, parenthesised unless it binds tighter than any operator."""
    text = nodes.code(expression)
    simple = isinstance(expression, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) or bool(getattr(expression, "lpar", ()))
    return text if simple else f"({text})"


def conjunction(parts: list[str]) -> str | None:
    parts = distinct_tests(parts)  # `if level != 'O0':` around initialize adds the same test twice
    return " and ".join(_and_operand(p) if len(parts) > 1 else p for p in parts) or None


def distinct_tests(parts: list[str]) -> list[str]:
    """``parts`` less repeats however spelled (``level != 'O0'``, ``level != "O0"``), first spelling kept."""
    seen, kept = set(), []
    for part in parts:
        try:
            key = ast.dump(ast.parse(part.strip(), mode="eval"))
        except (SyntaxError, ValueError, RecursionError):
            key = part
        if key not in seen:
            seen.add(key)
            kept.append(part)
    return kept


def _and_operand(part: str) -> str:
    """``part`` as an operand of ``and``: in parentheses only where it binds more loosely
    (``a or b``, ``x if c else y``), not around ``level != "O0"`` or ``not args.fp32``."""
    try:
        tree = ast.parse(part.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return f"({part})"
    loose = isinstance(tree, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr))
    return f"({part})" if loose else part


def fitted_conjunction(parts: list[str], room: int, depth: int = 0) -> str | None:
    """``conjunction(parts)``, or where it is longer than ``room``, one part a line inside
    parentheses, as a formatter puts them (the lines at ``depth`` + 4 columns, the closing one at ``depth``)."""
    text = conjunction(parts)
    parts = distinct_tests(parts)
    if text is None or len(text) <= room or len(parts) < 2:
        return text
    grouped = [_and_operand(p) for p in parts]
    inner, outer = " " * (depth + 4), " " * depth
    return "(\n" + "".join(f"{inner}{'and ' if i else ''}{p}\n" for i, p in enumerate(grouped)) + f"{outer})"


def alias_present(alias: str) -> str:
    """The test that what received the scaler holds one: it may be None (``def run(...,
    amp=None)``, ``self.amp = amp if fp16 else None``), and an attribute of another object may
    never have been set (``args.amp = amp`` only under ``if args.fp16:``)."""
    owner = alias.rpartition(".")[0]
    return attribute_set(alias) if owner and owner != "self" else f"{alias} is not None"


def attribute_set(name: str) -> str:
    """The test that the attribute ``name`` (``self.scaler``) holds something: set in a block that
    may not have run, reading it would raise."""
    owner, _, attribute = name.rpartition(".")
    return f'getattr({owner}, "{attribute}", None) is not None'


COMPUTED_LEVEL = (
    "the opt_level is computed at run time: O0 and O1 keep their meaning (scaler and autocast are off for O0), "
    "O2 and O3 become O1"
)


HELPER_SOURCE = '''

def _scaler_state_from_apex(state, scaler):
    """``state`` for ``scaler``, converted where it is apex's loss-scaler state."""
    if not state:
        # a disabled scaler saved {}; loading nothing, apex kept its scale
        return scaler.state_dict()
    if "loss_scaler0" not in state:
        return state
    apex_state = state["loss_scaler0"]
    # apex kept the scale and its unskipped count; growth and backoff are the scaler's.
    return {
        **scaler.state_dict(),
        "scale": float(apex_state["loss_scale"]),
        "_growth_tracker": int(apex_state["unskipped"]),
    }
'''


INITIALIZE_KEYWORDS = frozenset(
    {
        "models",
        "optimizers",
        "enabled",
        "opt_level",
        "cast_model_type",
        "patch_torch_functions",
        "keep_batchnorm_fp32",
        "master_weights",
        "loss_scale",
        "cast_model_outputs",
        "num_losses",
        "verbosity",
        "min_loss_scale",
        "max_loss_scale",
    }
)


NO_NATIVE_OPTION = ("cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32", "master_weights", "cast_model_outputs")


O2_O3_OPTIONS = ("cast_model_type", "keep_batchnorm_fp32", "master_weights")


SCALE_LOSS_KEYWORDS = frozenset({"loss", "optimizers", "loss_id", "model", "delay_unscale", "delay_overflow_check"})

PARTNER = "apex-partner"  # the setting that hands a half's plan its ``Partner`` (not a user setting)
SCALE_LOSS_KEPT = "apex-scale-loss-kept"  # hands a plan ``migrate.scale_kept``'s places (not a user setting)
LEVELS_ELSEWHERE = "apex-level-set-elsewhere"  # ``migrate.level_settings``' option names (not a user setting)
INITIALIZED_ELSEWHERE = "apex-initialized-elsewhere"  # ``migrate.scale_kept.initialized_elsewhere``'s places (not a user setting)
MASTER_WEIGHTS_KEPT = "apex-master-weights-kept"  # ``migrate.apex_kept.kept_for_scale_halves``' places (not a user setting)
DECORATORS_KEPT = "apex-decorators-kept"  # ``migrate.apex_kept.decorators_kept``' places and why (not a user setting)
# ``migrate.state_helpers``: a checkpoint utility's functions whose every caller passes the scaler,
# and a training file's calls of them (spelling, the utility's place) (not user settings)
STATE_CALLERS_PASS, STATE_HELPERS = "apex-state-callers-pass", "apex-state-helpers"
STATE_CALLERS_KEPT = "apex-state-callers-kept"  # a checkpoint utility's callers the run leaves on apex (not a user setting)
STATE_INITIALIZE_KEPT = "apex-state-initialize-kept"  # ``apex_kept.kept_for_state_helpers``' places (not a user setting)
HELPER_SCALER = "scaler"  # the parameter those functions take, and the keyword the calls pass
ACCEPT_O2 = "o2-as-autocast"  # the setting that accepts apex O2 rewritten as autocast with fp32 weights


EACH = -1  # the step index of a loop stepping each optimizer of a list


NEVER = "2**31 - 1"  # a growth interval no run reaches: the scale of a static apex loss scale stays


SCALER_NAMES = ("scaler", "grad_scaler", "amp_scaler")


# Without amp.initialize in the file, calls of these stand for the forward pass.
GUESSED_MODELS = frozenset({"model", "self.model", "net", "self.net", "network", "self.network", "module", "self.module"})


AUTOCAST = 'torch.autocast("cuda", dtype=torch.float16{enabled})'


# Statement kinds that a search for the following optimizer.step() may look into.
TRANSPARENT = (cst.If, cst.Else, cst.Try, cst.TryStar, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.With)


@dataclass
class ApexPlan:
    """The reports of the file's apex.amp sites, with their fixes, for each rule to pass on."""

    findings: list[Report] = field(default_factory=list)
    unsafe_reasons: tuple[str, ...] = ()  # why the fixes are unsafe, when they are
    active_codes: set[str] = field(default_factory=set)  # the planned rules taking part in this run
    handled: frozenset[int] = frozenset()  # nodes other rules would report that the plan rewrites (handed-on receivers, `amp.__dict__` probes)
    half: HalfFacts | None = None  # set when the file holds one half of apex amp

    def findings_for(self, code: str) -> list[Report]:
        return [finding for finding in self.findings if finding.code == code]


class HalfFacts(NamedTuple):
    """What the plan of one half of apex amp tells the plan of the other half (``Partner``)."""

    level: str | None = "O1"  # initialize half: its opt level, None when computed at run time
    scaler_args: tuple[str, ...] = ()  # initialize half: GradScaler's arguments for its options
    # initialize half: the scale half's functions it calls once its own GradScaler exists, which could take it
    hands_to: tuple[str, ...] = ()
    scaler: str | None = None  # scale half: the name of its GradScaler (at module level, or a parameter of ...)
    receives: tuple[str, ...] = ()  # scale half: ... these of ``hands_to``, which take it as ``scaler=``
    autocast: bool = True  # scale half: whether its rewrite writes an autocast region
    # scale half: the switches every autocast region of its rewrite is enabled by (`do_apex` of
    # `enabled=bool(p['do_apex'])`): its scaled backward passes run only where they are on
    switches: frozenset[str] = frozenset()
    reasons: tuple[str, ...] = ()  # why its own rewrite is unsafe
    manual: str | None = None  # why it cannot be rewritten at all


class Partner(NamedTuple):
    """The other half of a file's apex amp, in another file (``migrate.halves`` finds it).

    ``facts`` are those of its plan when the run migrates it too (the two are paired); None when
    it was only found on disk, to be named.
    """

    file: str
    line: int
    facts: HalfFacts | None = None
    scaler_import: ImportChange | None = None  # initialize half: its import of the scale half's module


class Unplannable(Exception):
    """The file cannot be rewritten consistently; ``node`` and the message say where and why."""

    def __init__(self, node: cst.CSTNode, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


class ScaleBounds(NamedTuple):
    """The floor (``min_loss_scale``) and cap (``max_loss_scale``) apex kept a dynamic scale
    within, as float literals; GradScaler has neither, so each ``update()`` is followed by one
    putting the scale back within them (``update_lines``)."""

    floor: str | None = None
    cap: str | None = None


def float_text(value: cst.BaseExpression) -> str:
    """A number of the source as a float literal (``512.0``, ``1e3``, ``1`` as ``1.0``), else
    wrapped in ``float()``: ``GradScaler.update`` takes a float, never an int."""
    text = nodes.code(value)
    parts = [value, *descendants(value)]
    if any(isinstance(part, (cst.Float, cst.Divide)) for part in parts) and not any(isinstance(part, cst.SimpleString) for part in parts):
        return text  # `512.0`, `2.0**20`, `2**24 / 8`: Python's arithmetic makes a float of it
    return f"{text}.0" if isinstance(value, cst.Integer) and text.isdigit() else f"float({text})"


def update_lines(scaler: str, bounds: ScaleBounds) -> list[str]:
    """``scaler.update()``, then, where apex bounded the scale, the scale put back within its
    bounds, as apex's ``min(cap, scale * 2)`` and ``max(floor, scale / 2)`` kept it."""
    if bounds == ScaleBounds():
        return [f"{scaler}.update()"]
    scale = f"{scaler}.get_scale()"
    if bounds.floor is not None:
        scale = f"max({scale}, {bounds.floor})"
    if bounds.cap is not None:
        scale = f"min({scale}, {bounds.cap})"
    named = " and ".join(f"{name}={value}" for name, value in (("min_loss_scale", bounds.floor), ("max_loss_scale", bounds.cap)) if value)
    return [f"{scaler}.update()", f"# apex's {named}", f"{scaler}.update({scale})"]


class InitializeSite(NamedTuple):
    call: cst.Call
    statement: cst.SimpleStatementLine
    level: str | None  # "O0".."O3", None when computed at run time
    level_expression: cst.BaseExpression | None  # the computed opt level
    guard_level: bool  # computed, not provably O0/O1: the rewrite stops O2/O3 runs at run time
    enabled: cst.BaseExpression | None
    scaler_args: list[str]
    restore: str | None  # "targets = values" keeping the assignment's meaning, if needed
    model_codes: set[str]
    on_self: bool
    inference: bool = False  # no optimizers: the models only ran forward under apex's casts
    merges_losses: bool = False  # `num_losses=2`: apex kept one scaler per loss (``per_loss``)
    dynamic_o0: str | None = None  # beside a run-time level, a loss_scale that may be "dynamic" ("" where it is): O0 stops
    scale_bounds: ScaleBounds = ScaleBounds()  # `min_loss_scale`/`max_loss_scale` of a dynamic scale


class ScaleLossSite(NamedTuple):
    call: cst.Call
    statement: cst.With
    loss: cst.BaseExpression
    optimizers: list[cst.BaseExpression]
    scaled_name: str
    backward_args: list[cst.Arg] | None  # set when the body is only ``scaled.backward(...)``
    body: list[cst.BaseStatement]
    loss_id: int | None = 0  # apex's `loss_id`; None where computed at run time

    @property
    def merges_losses(self) -> bool:
        """A loss id but 0: apex kept one scaler per loss (``per_loss``)."""
        return self.loss_id != 0


@dataclass(frozen=True)
class Setup:
    """What the plan decides before it writes anything: the opt level the rewrite keeps, the
    GradScaler's name, where it is made and whether it may be off. The planning steps that
    write the rewrite all read it; none changes it."""

    level: str | None = None  # "O0".."O3", None when computed at run time
    o0: bool = True  # no scaling: no scaler is made (but one standing in for saved state)
    scaler: str | None = None  # the GradScaler's name (`scaler`, `self.scaler`)
    scope: str = "none"  # where it lives: "self", "local", "global", "module", "parameter" or "none"
    stand_in: str | None = None  # a disabled scaler made first, until initialize's code runs: "module", "init", "class", "local"
    in_block: bool = False  # made in a block its users are not all in: they ask whether it exists
    may_be_disabled: bool = False  # autocast asks the scaler whether it is on
    merged_losses: bool = False  # apex's per-loss scalers become one GradScaler, updated after the last step of each block of steps
    # apex's per-loss scalers kept (``per_loss``): the GradScalers beside ``scaler``, and each call's, by id
    extra_scalers: tuple[str, ...] = ()
    loss_scalers: Mapping[int, str] = field(default_factory=dict)
    level_guarded: bool = False  # a computed opt level is checked at run time
    # the `if args.fp16:` that held initialize, whose test enables the scaler, and its spellings (`self.fp16 = fp16`)
    guard: cst.If | None = None
    guard_tests: frozenset[str] = frozenset()
    model_codes: frozenset[str] = frozenset()  # the models initialize was given, as written
    # the calls of apex's API on what received the handed-on module (`train(..., amp=scaler)`), by method
    receiver_calls: tuple[tuple[str, cst.Call], ...] = ()
    # scope "parameter": the functions the maker hands the scaler to (`train(..., scaler=scaler)`), the function
    # making it, or getting it back from a builder: (builder, what it returns, what the maker unpacks that into)
    scaler_receivers: tuple[cst.FunctionDef, ...] = ()
    scaler_maker: cst.FunctionDef | None = None
    scaler_returned: tuple[cst.FunctionDef, cst.Tuple | cst.List, cst.Tuple | cst.List] | None = None
    scale_bounds: ScaleBounds = ScaleBounds()  # apex's floor and cap of the scale, kept after each update
    callers_pass: frozenset[str] = frozenset()  # a checkpoint utility's functions every caller hands the scaler
    callers_kept: tuple[str, ...] = ()  # a checkpoint utility's callers that stay on apex amp in this run
    initialize_kept: tuple[str, ...] = ()  # or its project's `amp.initialize` calls that do


def run_time_scale(value: cst.BaseExpression) -> tuple[str, str]:
    """GradScaler's ``init_scale`` and ``growth_interval`` for apex's ``loss_scale=value``, chosen
    when the script runs: ``"dynamic"`` (or None) as GradScaler's defaults, a number as a scale
    that never grows. ``"dynamic" if c else 128.0`` gives ``2.0**16 if c else 128.0``."""
    if nodes.literal_string(value) == "dynamic" or nodes.is_none(value):
        return "2.0**16", "2000"
    number = nodes.number_text(value)
    if number is not None:
        return number, NEVER
    if isinstance(value, cst.IfExp):
        (body_init, body_growth), (else_init, else_growth) = run_time_scale(value.body), run_time_scale(value.orelse)
        test = operand(value.test)
        return f"{body_init} if {test} else {else_init}", f"{body_growth} if {test} else {else_growth}"
    dynamic = f'{operand(value)} in (None, "dynamic")'
    return f"2.0**16 if {dynamic} else float({nodes.code(value)})", f"2000 if {dynamic} else {NEVER}"


def normal(text: str) -> str:
    """``text`` as Python reads it, to compare: the same for any spacing, line breaks or
    parentheses around it or its parts."""
    try:
        return ast.dump(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        return "".join(text.split())


def same_places(target: str, value: str) -> bool:
    """Whether ``target = value`` binds each place to what it holds already: the same
    expression, or tuples and lists of such, element by element (``(a, b) = [a, b]``)."""
    try:
        return _same_places(ast.parse(target.strip(), mode="eval").body, ast.parse(value.strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        return normal(target) == normal(value)


def _same_places(target: ast.expr, value: ast.expr) -> bool:
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
        return len(target.elts) == len(value.elts) and all(map(_same_places, target.elts, value.elts))
    return not isinstance(target, ast.Starred) and ast.dump(target) == ast.dump(value)


def grouped(expression: cst.BaseExpression) -> str:
    text = nodes.code(expression)
    return text if isinstance(expression, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) else f"({text})"


def negated(expression: cst.BaseExpression) -> str:
    if isinstance(expression, cst.UnaryOperation) and isinstance(expression.operator, cst.Not):
        return grouped(expression.expression)
    return f"not {grouped(expression)}"


def either(first: str | None, second: str | None) -> str | None:
    """The test under which a step that either of two scaled backward passes leads to goes
    through the scaler: None (always) where one has none; the tests they share, where the rest
    are the two arms of one test (``amp and even``, ``amp and not even``: ``amp``); else ``or``."""
    if first is None or second is None:
        return None

    def is_not(negation: str, test: str) -> bool:
        return normal(negation) == normal(f"not ({test})")

    # arms of one test nested in arms of the same test (`if even: ... if even:`) give `even and
    # even`, and `even and not even` where no pass runs: said once, and that one left out
    mine, theirs = ({normal(part): part for part in conjuncts(text)}.values() for text in (first, second))
    mine, theirs = list(mine), list(theirs)
    for parts, other in ((mine, second), (theirs, first)):
        if any(is_not(a, b) for a in parts for b in parts):
            return other
    shared = [part for part in mine if normal(part) in {normal(other) for other in theirs}]
    rest = [[part for part in parts if normal(part) not in {normal(other) for other in shared}] for parts in (mine, theirs)]

    arms = len(rest[0]) == 1 and len(rest[1]) == 1 and (is_not(rest[0][0], rest[1][0]) or is_not(rest[1][0], rest[0][0]))
    if not rest[0] or not rest[1] or arms:
        return " and ".join(grouped_text(part) if len(shared) > 1 else part for part in shared) if shared else None
    alternatives = " or ".join(f"({' and '.join(map(_and_operand, parts))})" for parts in rest)  # a part may be an `or`
    return " and ".join([*(grouped_text(part) for part in shared), f"({alternatives})"]) if shared else alternatives


def conjuncts(text: str) -> list[str]:
    """The parts of ``a and (b or c) and not d`` joined by a top-level ``and``, as Python reads it."""
    text = text.strip()
    try:
        test = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return [normal_parens(text)]  # not an expression: one part
    if not (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)):
        return [normal_parens(text)]
    return [normal_parens(ast.get_source_segment(text, value) or "") for value in test.values]


def normal_parens(text: str) -> str:
    """``text`` without parentheses around the whole of it."""
    text = text.strip()
    while text.startswith("(") and text.endswith(")") and _closes_at_end(text):
        text = text[1:-1].strip()
    return text


def _closes_at_end(text: str) -> bool:
    depth = 0
    for index, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if depth == 0 and index < len(text) - 1:
            return False
    return True


def grouped_text(text: str) -> str:
    return f"({text})" if " " in text and not text.startswith("not ") else text


def as_bool(expression: cst.BaseExpression, switches: frozenset[str] = frozenset()) -> str:
    """``expression`` as a bool: autocast's and GradScaler's ``enabled=`` take nothing else (an
    ``int`` flag from argparse or a JSON config raises there). ``switches``: attributes known to
    hold a bool (``args.fp16``, an argparse ``store_true`` option on what ``parse_args()`` returned)."""
    if is_boolean(expression, switches):
        return nodes.code(expression)
    bare = expression.with_changes(lpar=[], rpar=[]) if getattr(expression, "lpar", ()) else expression
    return f"bool({nodes.code(bare)})"


def is_boolean(expression: cst.BaseExpression, switches: frozenset[str] = frozenset()) -> bool:
    """Whether ``expression`` is a bool as written: a comparison, ``not``, a bool literal, ``bool(...)``, or one of ``switches``."""
    if isinstance(expression, cst.Comparison) or (isinstance(expression, cst.UnaryOperation) and isinstance(expression.operator, cst.Not)):
        return True
    if isinstance(expression, cst.Name) and expression.value in ("True", "False"):
        return True
    if isinstance(expression, (cst.Attribute, cst.Name)) and nodes.code(expression) in switches:
        return True
    if isinstance(expression, cst.BooleanOperation):  # `a and b` is one of its operands
        return is_boolean(expression.left, switches) and is_boolean(expression.right, switches)
    return isinstance(expression, cst.Call) and nodes.code(expression.func).rsplit(".", 1)[-1] in ("bool", "isinstance", "is_enabled")

# Put by the migration on what reads gradients inside `amp.scale_loss` after its backward: apex had
# not unscaled them yet there, nor has GradScaler, so AMP101's unscale_ must not come before it.
SCALED_READER_MARK = "# noqa: AMP101 reads scaled gradients, as apex did inside amp.scale_loss"
# Whether an optimizer holds gradients: after `zero_grad()`, whether a backward pass ran since.
HOLDS_GRADIENTS = 'any(p.grad is not None for group in {optimizer}.param_groups for p in group["params"])'
# the same of a list of optimizers stepped in a loop (`for optim in self.optimizers: optim.step()`)
HOLDS_GRADIENTS_EACH = 'any(p.grad is not None for each in {optimizer} for group in each.param_groups for p in group["params"])'
# Put on the plain step of `if <that test>: scaler.step(opt) else: opt.step()`: on that path
# nothing was scaled, so AMP102 (a step that skips the scaler) must not send it through.
PLAIN_STEP_MARK = "# noqa: AMP102"  # on the step, its reason on the line above:
PLAIN_STEP_REASON = "# nothing was scaled on this path: a plain step, as apex did"
# Put on a clip made scale-aware (threshold times the scale): it works on scaled gradients, rightly.
SCALE_AWARE_MARK = "# noqa: AMP101 clips the scaled gradients at the threshold times the scale"
NORM_OF_SCALED_MARK = "# noqa: AMP101 the scaled gradients' norm, divided by the scale"
