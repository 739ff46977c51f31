"""``delay_unscale``'s flag, computed only to be handed to ``amp.scale_loss``: GradScaler keeps the
gradients scaled until ``unscale_`` or the step, so the rewrite drops the keyword, and a local
assigned for it alone (``delay_unscale = (step + 1) % accumulation != 0``) is then read by
nothing. It goes, with the comments above it where they speak of it or of apex."""
from __future__ import annotations

import re

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Step
from migrate.apex_plan.vocabulary import SCALE_LOSS, ScaleLossSite
from migrate.tree_walk import descendants

# Comments that belong to the flag: a note on apex's accumulation, or the flag's own name.
_ABOUT_THE_FLAG = re.compile(r"apex|delay|unscale", re.I)
# What the flag's value may hold for its line to go unseen: no call (side effects), no walrus, no yield.
_EFFECTS = (cst.Call, cst.NamedExpr, cst.Yield, cst.Await)


class DelayFlagPlanning(Step):
    """Removes the local that only fed ``delay_unscale``. It reads the ``FileTree`` and a
    ``ScaleLossSite``, and writes to the ``Draft``."""

    def plan_unread_flag(self, scale: ScaleLossSite) -> None:
        delay = nodes.argument(scale.call, 4, "delay_unscale")
        function = self.tree.function(scale.statement)
        if delay is None or not isinstance(delay.value, cst.Name) or function is None:
            return  # a module-level flag is a global another module may read
        name = delay.value.value
        named = [node for node in descendants(function) if isinstance(node, cst.Name) and node.value == name
                 and not self._is_keyword(node)]
        assignment = self._only_assignment(named, delay.value)
        if assignment is None:
            return
        block = self.tree.parent.get(id(assignment))
        if len(getattr(block, "body", ())) < 2 or self.draft.touched(assignment):
            return  # alone in its block, or already rewritten by another step
        comments = [line.comment.value for line in assignment.leading_lines if line.comment is not None]
        if comments and not any(_ABOUT_THE_FLAG.search(comment) for comment in comments):
            return  # a comment heading what follows: the line stays rather than lose it
        self.draft.replace(assignment, cst.RemoveFromParent())
        body = list(block.body)
        following = body[body.index(assignment) + 1]
        if body[0] is assignment and id(following) in self.draft.replacements:  # now first in its block
            node, replacement = self.draft.replacements[id(following)]
            self.draft.replace(node, _no_blank_line_first(replacement))
        self.draft.kind(assignment, SCALE_LOSS, f"`{name}` only told `amp.scale_loss` to keep the gradients scaled",
                        f"Remove `{name}`: GradScaler keeps them scaled until the step")

    def _is_keyword(self, node: cst.Name) -> bool:
        """Whether ``node`` is an argument's keyword (``delay_unscale=``), not a read."""
        parent = self.tree.parent.get(id(node))
        return isinstance(parent, cst.Arg) and parent.keyword is node

    def _only_assignment(self, named: list[cst.Name], read: cst.Name) -> cst.SimpleStatementLine | None:
        """The line ``name = <value>`` where ``named`` is that target and ``read`` alone, the value
        having no effect of its own; else None."""
        others = [node for node in named if node is not read]
        if len(others) != 1:
            return None
        line = self.tree.statement(others[0])
        assign = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and assign.targets[0].target is others[0]):
            return None
        if any(isinstance(node, _EFFECTS) for node in descendants(assign.value)):
            return None
        return line


def _no_blank_line_first(replacement):
    """``replacement`` (a statement, or several) without the blank lines it would open its block with."""
    nodes_in = list(replacement.nodes) if isinstance(replacement, cst.FlattenSentinel) else [replacement]
    first = nodes_in[0] if nodes_in else None
    if not hasattr(first, "leading_lines"):
        return replacement
    lines = list(first.leading_lines)
    while lines and lines[0].comment is None:
        lines.pop(0)
    nodes_in[0] = first.with_changes(leading_lines=lines)
    return cst.FlattenSentinel(nodes_in) if isinstance(replacement, cst.FlattenSentinel) else nodes_in[0]
