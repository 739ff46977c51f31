"""Which files are worth parsing with libcst: a text search, then a look at the syntax tree.

Each rule names words (``TRIGGERS``) a file must contain for it to have anything to do. Most are
rare (``GradScaler``, ``custom_fwd``, ``ampmigrate``), and a file holding one is parsed. Two are
everywhere in real trees: ``amp`` (``use_amp``, ``--amp``, ``amp_dtype``) and ``apex`` ("install
apex for fp16"). A file whose only trigger words are those goes on only if it holds a shape the
rules that read those words act on. Its text is searched first for what such a shape must spell
out (most files say ``use_amp`` and nothing more, and are decided there); a file holding some is
parsed with ``ast`` (CPython's own parser, about ten times faster than libcst's) and looked at:

- an import of ``apex`` or of its kernels ``amp_C``/``apex_C`` (or anything else so named: a
  name, an attribute, a definition);
- a string naming an apex module (``importlib.import_module("apex.amp")``);
- an amp call through a name (``amp.scale_loss``, ``self.amp.initialize``);
- a ``try`` of nothing but ``pass`` and assignments that catches ``ImportError``
  (what is left of an apex import guard);
- a ``backward`` or ``step`` call, a loss scaler called with the loss (timm's
  ``loss_scaler(loss, optimizer, ...)``) or a LightningModule's ``training_step``: AMP100 reads
  the training step of a file that says ``amp``, and a training loop has one of them.

Two more words are common in code that trains nothing: ``autocast`` (inference under autocast) and
``scaler`` (a feature scaler). The rules reading them in a plain run (AMP100–AMP104, AMP108, AMP109:
``Rule.NEEDS_A_STEP``; AMP107's ``scaler``, ``Rule.STEP_TRIGGERS``) report only in a file
making a step's call or casting to float16, so a file whose other words are only
``amp``/``apex`` goes on only if it holds one of those shapes too: a
``backward``/``step`` call, or ``half``/``float16`` spelled as a name, an attribute or a string.
A selection with a rule that reads them everywhere (the deprecated ``torch.cuda.amp.autocast``,
AMP020) parses every file holding them, as before.

``noqa`` (the word of the unused-noqa rule, AMP800) counts only in a directive naming an ``AMP``
code: ``# noqa: E501`` alone never makes a file worth parsing.

The shapes are a superset of what those rules look for, so no file a rule would report is
skipped: ``tests/migrate/test_prefilter.py`` checks it against every rule example, golden and
fixture. Nothing here imports libcst.
"""
from __future__ import annotations

import ast
import re
from typing import Sequence

from migrate import quiet
from migrate.types import holds_trigger, holds_word

__all__ = ["AMP_API", "PLAIN_RUN_STEP_WORDS", "PLAIN_RUN_WORDS", "needs_parsing", "reads_amp_api", "sets_apex_flag", "step_words",
           "trigger_words"]

# The TRIGGERS of the rules a plain run uses (``Rule.DEFAULT``): what a run without --select
# looks for before importing any rule. test_prefilter keeps it equal to the catalogue's.
PLAIN_RUN_WORDS: tuple[str, ...] = ("GradScaler", "accelerator", "amp", "ampmigrate", "apex", "autocast",
                                    "automatic_optimization", "deepspeed", "fabric", "manual_backward", "master_params",
                                    "model_engine", "noqa", "opt_level", "scale_loss", "scaler", "train_batch",
                                    "training_step")
# The words only NEEDS_A_STEP rules read in a plain run (``step_words``); test_prefilter keeps it so.
PLAIN_RUN_STEP_WORDS: frozenset[str] = frozenset({"accelerator", "autocast", "automatic_optimization", "deepspeed",
                                                  "fabric", "manual_backward", "model_engine", "scaler", "train_batch",
                                                  "training_step"})
# Words too common to decide on: a file holding only these is looked at with ``ast``.
_COMMON_WORDS = frozenset({"amp", "apex"})
# ``noqa`` (the unused-noqa rule's word) counts only in a directive naming an ampmigrate code:
# ``# noqa: E501`` is everywhere, and suppresses nothing of ours.
_NOQA_WORD = "noqa"
_AMP_DIRECTIVE = re.compile(r"(?i:noqa)\s*:[^\n#]*AMP[0-9]")
_AMP_DIRECTIVE_BYTES = re.compile(_AMP_DIRECTIVE.pattern.encode())
# apex amp's calls, as reached through a name (``amp.initialize``); AMP016 reads these.
_AMP_CALLS = frozenset({"initialize", "scale_loss", "master_params", "state_dict", "load_state_dict"})
# ...and the rest of its API, read through an import from a module of the project that hands out
# apex's amp (``migrate.amp_reexports``), under any name; these are apex amp's own, whatever reads them.
_AMP_OWN_NAMES = frozenset({"scale_loss", "master_params", "float_function", "half_function", "promote_function",
                            "register_float_function", "register_half_function", "register_promote_function", "disable_casts"})
AMP_API = _AMP_CALLS | _AMP_OWN_NAMES | {"init"}
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError"})
# An apex-availability flag (AMP018 folds one that is always True): has_apex, APEX_AVAILABLE,
# IS_AMP_AVAILABLE...
_APEX_FLAG = r"_?(is_)?(has_?(apex|amp)|(apex|amp)_?(is_)?(available|imported|installed|loaded))"
APEX_FLAG_NAME = re.compile(rf"^{_APEX_FLAG}$", re.I)
_APEX_FLAG_SET = re.compile(rf"^{_APEX_FLAG}\s*=\s*True\b", re.I | re.M)
_APEX_FLAG_SET_BYTES = re.compile(_APEX_FLAG_SET.pattern.encode(), re.I | re.M)
# What makes a loop a training loop for AMP100: ``loss.backward()``, ``optimizer.step()``.
_STEP_CALLS = frozenset({"backward", "step", "train_batch"})  # DeepSpeed pipeline: one call
# ...or timm's loss scaler, which runs both: ``loss_scaler(loss, optimizer, clip_grad=...)``.
_SCALER_CALL = re.compile(r"scaler\s*\(", re.I)
_SCALER_CALL_BYTES = re.compile(_SCALER_CALL.pattern.encode(), re.I)
# A loss scaler's class (``NativeScaler``, ``GradScaler``), not scikit-learn's ``StandardScaler``.
_LOSS_SCALER_CLASS = re.compile(r"(Grad|Loss|Amp|Native)\w*Scaler$")
# What a float16 cast spells (``.half()``, ``.to(torch.float16)``, ``dtype="half"``): AMP108 reads these.
_HALF_NAMES = frozenset({"half", "float16"})
# apex and its compiled kernels, which AMP015 reports (``from amp_C import multi_tensor_l2norm``).
_APEX_NAMES = frozenset({"apex", "amp_C", "apex_C"})


def trigger_words(rules: Sequence[type] | None) -> tuple[str, ...] | None:
    """The words a file must contain for ``rules`` (None: the plain run's) to be run on it.

    None when a rule reads every file.
    """
    if rules is None:
        return PLAIN_RUN_WORDS
    if any(not rule.TRIGGERS for rule in rules):
        return None
    return tuple(sorted({word for rule in rules for word in rule.TRIGGERS}))


def step_words(rules: Sequence[type] | None) -> frozenset[str]:
    """The trigger words of ``rules`` (None: the plain run's) that only rules needing a step read."""
    if rules is None:
        return PLAIN_RUN_STEP_WORDS
    def stepping(rule: type, word: str) -> bool:
        return rule.NEEDS_A_STEP or word in rule.STEP_TRIGGERS

    anywhere = {word for rule in rules for word in rule.TRIGGERS if not stepping(rule, word)}
    return frozenset(word for rule in rules for word in rule.TRIGGERS if stepping(rule, word)) - anywhere


def may_apply(content: bytes | str, words: tuple[str, ...] | None) -> bool:
    """The text search: ``content`` holds one of ``words`` (bytes: the words are ASCII in any PEP 263 encoding)."""
    if words is None:
        return True
    return holds_trigger(content, words)


def needs_parsing(content: bytes | str, words: tuple[str, ...] | None, stepping: frozenset[str] = frozenset()) -> bool:
    """Whether a rule with these ``words`` may have anything to do in ``content``; ``stepping``
    (``step_words(rules)``) are those of them that only rules needing a step read.

    False only when none of the words is there, or the only ones there are ``amp``/``apex`` and
    step words, and the file has none of the shapes the rules act on: first its text is searched for what each
    shape must spell out (a string spelling ``apex`` with escapes or split in two is not looked
    for), and only a file holding some is parsed. A file ``ast`` cannot parse is then handed on,
    so that its error is reported.
    """
    if words is None:
        return True
    if not may_apply(content, words):
        return False
    if _NOQA_WORD in words:
        pattern = _AMP_DIRECTIVE_BYTES if isinstance(content, bytes) else _AMP_DIRECTIVE
        if (b"AMP" if isinstance(content, bytes) else "AMP") in content and pattern.search(content):
            return True
        words = tuple(word for word in words if word != _NOQA_WORD)
        if not words or not may_apply(content, words):
            return False
    rare = tuple(word for word in words if word not in _COMMON_WORDS and word not in stepping)
    if len(rare) == len(words) or (rare and may_apply(content, rare)):
        return True
    present = tuple(word for word in words if word in stepping)
    casts = bool(present) and may_apply(content, present)  # a float16 cast is then a shape too
    if not (_may_hold_a_shape(content) or (casts and any(_holds_word(content, name) for name in _HALF_NAMES))):
        return False  # most such files are decided here, without parsing
    try:
        tree = quiet.parse(content)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True
    return _has_amp_shape(tree, casts)


def sets_apex_flag(text: str) -> bool:
    """Whether ``text`` sets an apex-availability flag to ``True`` on a line of its own
    (``HAS_APEX = True``): what a run leaves where another module imports the flag."""
    return _APEX_FLAG_SET.search(text) is not None


def reads_amp_api(text: str) -> bool:
    """Whether ``text`` may read apex amp's API through a name (``amp.initialize``, ``A.scale_loss``
    after ``from utils.amp_compat import apex_amp as A``): it names one only apex's amp has, or
    says ``amp`` (in any word) and one of the others."""
    return _names_amp_own(text) or "amp" in text and any(_holds_word(text, name) for name in AMP_API)


def _names_amp_own(content: bytes | str) -> bool:
    """Whether ``content`` says one of the names only apex's amp has (``scale_loss``, ``float_function``)."""
    return any(_holds_word(content, name) for name in _AMP_OWN_NAMES)


def _may_hold_a_shape(content: bytes | str) -> bool:
    """Whether the text spells out what one of ``_has_amp_shape``'s shapes needs: one of the apex
    names, an import error or a step's call as a word of its own, or ``amp`` and one of its calls.
    Searched for as literals, a fraction of the time of a regex or of parsing."""
    return (any(_holds_word(content, word) for word in (*_APEX_NAMES, *_IMPORT_ERRORS, *_STEP_CALLS, "training_step"))
            or (_SCALER_CALL_BYTES if isinstance(content, bytes) else _SCALER_CALL).search(content) is not None
            or _names_amp_own(content)
            or (_holds_word(content, "amp") and any(_holds_word(content, call) for call in AMP_API))
            or (_APEX_FLAG_SET_BYTES if isinstance(content, bytes) else _APEX_FLAG_SET).search(content) is not None)


def _holds_word(content: bytes | str, word: str) -> bool:
    """``word`` in ``content`` with no ASCII letter, digit or underscore on either side. Another
    letter (or a byte of one in UTF-8) is taken for a boundary, which can only let more files through."""
    if isinstance(content, bytes):
        return holds_word(content, word.encode(), _IDENTIFIER_BYTES)
    return holds_word(content, word, _IDENTIFIER_CHARACTERS)


_IDENTIFIER_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_IDENTIFIER_BYTES = frozenset(character.encode() for character in _IDENTIFIER_CHARACTERS)


def _has_amp_shape(tree: ast.AST, casts: bool) -> bool:
    """Whether ``tree`` holds one of the shapes; with ``casts``, a name, attribute or string
    spelling a float16 cast counts too."""
    for node in ast.walk(tree):
        kind = type(node)
        if kind is ast.Import:
            if any(_names_apex(alias.name) for alias in node.names):
                return True
        elif kind is ast.ImportFrom:
            if _names_apex(node.module or "") or any(alias.name in _APEX_NAMES for alias in node.names):
                return True
        elif kind is ast.Name:
            if node.id in _APEX_NAMES or (casts and node.id in _HALF_NAMES):
                return True
        elif kind is ast.Attribute:
            if (node.attr in _APEX_NAMES or node.attr in _STEP_CALLS or node.attr in _AMP_OWN_NAMES
                    or (node.attr in AMP_API and _is_amp(node.value))):
                return True
            if casts and node.attr in _HALF_NAMES:
                return True
        elif kind is ast.Call:
            func = node.func
            called = func.id if type(func) is ast.Name else func.attr if type(func) is ast.Attribute else ""
            if called.lower().endswith("scaler") and len(node.args) >= 2:  # timm's `loss_scaler(loss, optimizer, ...)`
                return True
            if _LOSS_SCALER_CLASS.search(called):  # a loss scaler made (timm's `NativeScaler()`), for its checkpoint
                return True
        elif kind is ast.Constant:
            if type(node.value) is str and (node.value == "apex" or node.value.startswith("apex.")
                                            or (casts and node.value in _HALF_NAMES)):
                return True
        elif kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
            if node.name in _APEX_NAMES or node.name == "training_step":  # a LightningModule's step
                return True
        elif kind is ast.arg:
            if node.arg in _APEX_NAMES:
                return True
        elif kind is ast.alias:
            if node.asname in _APEX_NAMES:
                return True
        elif kind is ast.Try:
            if _guards_nothing(node):
                return True
        elif kind is ast.Assign:  # a module-level `has_apex = True`
            if (node.col_offset == 0 and len(node.targets) == 1 and type(node.targets[0]) is ast.Name
                    and APEX_FLAG_NAME.match(node.targets[0].id) and type(node.value) is ast.Constant
                    and node.value.value is True):
                return True
    return False


def _names_apex(module: str) -> bool:
    return not _APEX_NAMES.isdisjoint(module.split("."))


def _is_amp(node: ast.expr) -> bool:
    """``amp`` or ``<something>.amp``."""
    return (type(node) is ast.Name and node.id == "amp") or (type(node) is ast.Attribute and node.attr == "amp")


def _guards_nothing(node: ast.Try) -> bool:
    """A ``try`` of only ``pass`` and assignments with an ``except ImportError`` (AMP001's dead guard)."""
    if not node.handlers or not all(type(s) in (ast.Pass, ast.Assign) for s in node.body):
        return False
    for handler in node.handlers:
        caught = handler.type
        kinds = caught.elts if type(caught) is ast.Tuple else [caught]
        if any(type(kind) is ast.Name and kind.id in _IMPORT_ERRORS for kind in kinds):
            return True
    return False
