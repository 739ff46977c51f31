"""The top-level definitions of a large module that no rule reads, kept as text.

In a large module libcst's parse and the walks over its tree are most of the time, and most of a
large module is model code: classes and functions that never train, scale or cast. A top-level
``def`` or ``class`` is left unparsed, an ``Unparsed`` node in the module's body holding its text
as it was, when nothing links it to what the rules read:

- its text holds no word a rule looks for: a rule's trigger words, or what a training step,
  a cast, a checkpoint or an optimizer spells (``_READ``);
- what it defines is not named by a parsed statement: a parsed loop's helper is read with it
  (``step_model``, ``apex_plan`` follow calls to the module's functions);
- it names nothing a parsed definition, assignment or apex import binds: the callers of a parsed
  training function, and every use of an imported apex name, are read;
- its name is bound nowhere else and is no import's or builtin's: it cannot change what a name
  elsewhere resolves to.

Parsed statements link others in, and those in turn, until nothing more is linked. The words and
names are searched in the text, comments and strings included, which can only link more in. The
first and last statements are always parsed, as is a definition whose neighbours' lines are not
plain (``parsing`` cuts there). The few questions asked of every name in the module (whether an
import comes before any use of its name, how often a name is used) read an ``Unparsed`` node's text.
``tests/migrate/test_unread.py`` checks that every rule finds and fixes the same with these
definitions unparsed as with none, on every rule example and fixture.
"""
from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
from libcst._add_slots import add_slots
from libcst._nodes.internal import CodegenState, visit_sequence

__all__ = ["Unparsed", "unread_statements"]


@add_slots
@dataclass(frozen=True)
class Unparsed(cst.BaseStatement):
    """Top-level statements kept as their text (``code``, from the first line of the first to the
    line end of the last); ``statements``: how many ``ast`` counts in it."""

    code: str
    statements: int
    leading_lines: Sequence[cst.EmptyLine] = ()

    def _visit_and_replace_children(self, visitor: cst.CSTVisitor) -> "Unparsed":
        return Unparsed(code=self.code, statements=self.statements,
                        leading_lines=visit_sequence(self, "leading_lines", self.leading_lines, visitor))

    def _codegen_impl(self, state: CodegenState) -> None:
        for line in self.leading_lines:
            line._codegen(state)
        state.add_token(self.code)

    def uses(self, name: str) -> int:
        """How often ``name`` is a word of the text, comments and strings included: a question asked
        of every ``Name`` in the module counts these too."""
        return len(re.findall(rf"(?<!\w){re.escape(name)}(?!\w)", self.code))


# What the rules read beyond their trigger words, in any case: a training step and its gradients,
# optimizers, scaling, casts, checkpoints, and the statements that bind module names from inside
# a function. Searched for as literals in the lowered text (a regex over 5 MB: 1.3 s); ``grad``
# not after ``no_`` and ``opt`` as a word of its own (``opt``, ``g_opt1``) by ``_READ_ALSO``.
_READ = ("backward", "step", "optim", "scal", "half", "float16", "fp16", "state_dict", "save", "load", "global",
         "nonlocal")
_READ_ALSO = re.compile(r"(?<!no_)grad|(?<![a-z])opt(?![a-z])")
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_IMPORTS = (ast.Import, ast.ImportFrom)
_IDENTIFIER = re.compile(r"[^\W\d]\w*")
_BUILTINS = frozenset(dir(builtins))


def unread_statements(tree: ast.Module, texts: Sequence[str], words: tuple[str, ...], eligible: Sequence[bool]) -> list[bool]:
    """For each statement of ``tree.body`` (``texts``: each one's lines), whether it may stay
    unparsed: a definition (``eligible``: one ``parsing`` may cut around) that nothing links to what
    rules with trigger ``words`` read."""
    statements = tree.body
    literals = (*_READ, *(word.lower() for word in words))

    def read(text: str) -> bool:
        lowered = text.lower()
        return (any(word in lowered for word in literals)
                or (("grad" in lowered or "opt" in lowered) and _READ_ALSO.search(lowered) is not None))

    bindings = [_module_names(statement) for statement in statements]
    if any("*" in names and read(texts[i]) for i, names in enumerate(bindings)):
        return [False] * len(statements)  # `from apex.amp import *`: any name may be apex's
    times_bound: dict[str, int] = {}
    for names in bindings:
        for name in set(names):
            times_bound[name] = times_bound.get(name, 0) + 1
    named = [frozenset(_IDENTIFIER.findall(text)) for text in texts]
    unread = [False] * len(statements)
    definer: dict[str, int] = {}  # name -> the unread definition of it (bound once)
    users: dict[str, list[int]] = {}  # name -> the unread definitions naming it
    for i, statement in enumerate(statements[1:-1], start=1):
        if (eligible[i] and type(statement) in _DEFINITIONS and times_bound[statement.name] == 1
                and statement.name not in _BUILTINS and not read(texts[i])):
            unread[i] = True
            definer[statement.name] = i
            for name in named[i]:
                users.setdefault(name, []).append(i)

    linked: set[str] = set()  # the names parsed statements name
    bound: set[str] = set()  # the names they bind (an import: only one of what the rules read)
    pending = [i for i, flag in enumerate(unread) if not flag]
    while pending:
        i = pending.pop()
        new_linked = named[i] - linked
        linked |= new_linked
        binds = bindings[i] if type(statements[i]) not in _IMPORTS or read(texts[i]) else ()
        new_bound = set(binds) - bound
        bound |= new_bound
        for j in [*(definer[name] for name in new_linked if name in definer),
                  *(j for name in new_bound for j in users.get(name, ()))]:
            if unread[j]:
                unread[j] = False
                pending.append(j)
    return unread


def _module_names(statement: ast.stmt) -> list[str]:
    """The names ``statement`` binds in the module's scope: not those functions and classes bind
    inside (a comprehension's are counted: more names can only parse more); ``*`` for a star import."""
    names: list[str] = []
    pending: list[ast.AST] = [statement]
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind in _DEFINITIONS:
            names.append(node.name)
            pending += node.decorator_list
        elif kind is ast.Name:
            if type(node.ctx) is not ast.Load:
                names.append(node.id)
        elif kind in _IMPORTS:
            names += [alias.asname or alias.name.split(".")[0] for alias in node.names]
        elif kind is not ast.Lambda:
            pending += ast.iter_child_nodes(node)
    return names
