"""What reads gradients inside ``amp.scale_loss``, after its backward: kept reading scaled ones.

apex unscaled the gradients only as the block exited, so a read inside it (a clip of
``amp.master_params``) saw scaled gradients; natively they stay scaled until ``unscale_``, so the
read is kept as it is and marked ``# noqa: AMP101``. apex also set the gradients of earlier
backward passes aside while the block ran (those left unscaled; not those of a pass with
``delay_unscale``): where such a pass can come before it with no step between (accumulation),
the read saw only this pass's gradients, and natively sees their sum.
"""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.conditions import delayed_unscale
from migrate.apex_plan.context import Step
from migrate.apex_plan.syntax import backward_calls, with_first_line_comment, with_inner_line_comment
from migrate.apex_plan.vocabulary import SCALED_READER_MARK, ScaleLossSite
from migrate.step_model.vocabulary import reads_gradients_in
from migrate.tree_walk import descendants

__all__ = ["ScaledReaderPlanning"]


class ScaledReaderPlanning(Step):
    """Reads of the gradients inside ``amp.scale_loss``.

    It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the ``Draft``.
    """

    def mark_scaled_readers(self, scales: list[ScaleLossSite]) -> None:
        """What reads gradients inside ``amp.scale_loss``, after its backward, read scaled ones:
        apex unscaled them only on leaving the block. Kept so, and marked ``# noqa: AMP101`` to
        say it, so that the lint does not unscale them before it on a later run."""
        if self.setup.o0:
            return  # nothing is scaled
        keep = frozenset(self.draft.replacements)
        for scale in scales:
            entry = self.draft.replacements.get(id(scale.statement))
            if entry is None or not isinstance(entry[1], cst.FlattenSentinel):
                continue  # the block was only its backward
            readers, backward_seen = set(), False
            for statement in scale.body:
                # as AMP101 counts reads: where it would report nothing, an unused `noqa` is noise
                if backward_seen and reads_gradients_in(statement) and id(statement) not in keep:
                    readers.add(id(statement))
                backward_seen = backward_seen or bool(backward_calls(statement))
            # what may change the gradients there (a clip, `p.grad.mul_(0.5)`), scaled or not
            after = scale.body[next((i for i, statement in enumerate(scale.body) if backward_calls(statement)), len(scale.body)) + 1:]
            accumulated = self._accumulated_at(scale, scales) if _changes_gradients(after) else None
            if accumulated is not None:
                self.draft.mark(scale.statement, f"gradients are read inside `amp.scale_loss` (line {self.tree.line(after[0])}) "
                                f"where {accumulated}: apex set the earlier ones aside until the block exited, so it read "
                                "only this backward pass's", "the gradients read below are those of every backward pass "
                                "since the last step, where apex read only this one's (it set the earlier ones aside until "
                                "`amp.scale_loss` exited)")
            if readers:
                # AMP101 makes one finding of the reads after one backward: the first carries the mark
                first = next(id(part) for part in entry[1].nodes if id(part) in readers)
                # where AMP101 has no fix it reports the read itself, inside the block: its line has
                # the `noqa` too, and the run's unused-noqa pass drops the one that suppressed nothing
                noqa = SCALED_READER_MARK[:SCALED_READER_MARK.index(" reads")]
                parts = [with_inner_line_comment(with_first_line_comment(part, SCALED_READER_MARK, keep), noqa,
                                                 reads_gradients_in, keep) if id(part) == first else part
                         for part in entry[1].nodes]
                self.draft.replace(scale.statement, cst.FlattenSentinel(parts))

    def _accumulated_at(self, scale: ScaleLossSite, scales: list[ScaleLossSite]) -> str | None:
        """Why ``.grad`` may already hold another backward pass's gradients when ``scale``'s block
        runs: a scaled backward pass (this one, at the next micro-batch, or another) reaches it
        with no step of its optimizer and no ``zero_grad()`` between, having left them unscaled
        (no ``delay_unscale``). None where none does."""
        graph = self.tree.control_flow(scale.statement, exceptions=False)
        if not graph.holds(scale.statement):
            return None
        optimizers = {nodes.code(optimizer) for optimizer in scale.optimizers}
        scope = self.tree.function(scale.statement) or self.tree.module
        clearing = [node for node in nodes.own_code(scope)
                    if type(node) is cst.SimpleStatementLine and any(
                        type(call) is cst.Call and type(call.func) is cst.Attribute and (
                            call.func.attr.value == "zero_grad" or call.func.attr.value == "step" and nodes.code(call.func.value) in optimizers)
                        for call in descendants(node, nodes.not_a_definition))]
        for other in scales:
            # a pass with `delay_unscale` left its gradients scaled, and apex set aside only unscaled
            # ones: the block after it read their sum, as natively (UNITER's accumulation)
            if delayed_unscale(other.call) is not None:
                continue
            if graph.holds(other.statement) and any(node is scale.statement for node in graph.reached(other.statement, clearing)):
                return ("a backward pass may run again before the step (accumulation)" if other is scale
                        else f"the scaled backward pass at line {self.tree.line(other.statement)} runs before it with no step between")
        return None


# calls that only read what they are given (a norm logged, a list of them kept)
_PURE_BUILTINS = frozenset({"len", "print", "float", "int", "bool", "sum", "max", "min", "abs", "any", "all", "list",
                            "tuple", "dict", "set", "sorted", "round", "isinstance", "str", "repr", "format", "zip",
                            "enumerate", "range", "map", "filter"})


def _changes_gradients(statements: list[cst.BaseStatement]) -> bool:
    """Whether ``statements`` may change the gradients they read: a clip, an in-place method
    (``p.grad.mul_(0.5)``), or a function of the file or out of sight handed gradients or what
    holds them (``grads = [p.grad for p in ...]``, then ``gather(grads)``). A norm taken, logged or
    kept in a list (a method: ``writer.add_scalar``, ``norms.append``) changes nothing."""
    held: set[str] = set()  # names bound to gradients in the block
    for statement in statements:
        for node in descendants(statement, nodes.not_a_definition):
            if type(node) is cst.Assign and _mentions_gradients(node.value, held):
                held.update(name for target in node.targets for name in nodes.bound_texts(target.target))
            if type(node) is not cst.Call:
                continue
            name = nodes.call_name(node)
            if "clip" in name or (name.endswith("_") and not name.endswith("__")):
                return True
            if type(node.func) is cst.Name and name not in _PURE_BUILTINS and any(
                    _mentions_gradients(arg.value, held) for arg in node.args):
                return True
    return False


def _mentions_gradients(expression: cst.BaseExpression, held: set[str]) -> bool:
    return any((type(node) is cst.Attribute and node.attr.value == "grad") or (type(node) is cst.Name and node.value in held)
               for node in descendants(expression))
