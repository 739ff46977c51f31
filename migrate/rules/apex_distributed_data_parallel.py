"""AMP010: ``apex.parallel.DistributedDataParallel`` -> ``torch.nn.parallel.DistributedDataParallel``."""
from __future__ import annotations

from collections.abc import Iterator

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider

from migrate import apex_nodes as nodes
from migrate.activation_checkpoints import reentrant_in_project
from migrate.backwards_per_forward import differing_forwards, forwards_in_callers, second_backward
from migrate.rule import Invalid, Valid
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix, without_native
from migrate.tree_walk import descendants
from migrate.types import FixSafety

_NATIVE = "torch.nn.parallel.DistributedDataParallel"
# apex options that only tune how the all-reduce overlaps with backward: dropping them keeps the
# maths. But for delay_allreduce, which also let parameters go without a gradient: see native_call.
_OVERLAP_ONLY = ("delay_allreduce", "message_size", "num_allreduce_streams", "allreduce_communicators", "prof")
# What apex's class has and torch's has not: called or set on the wrapped model anywhere in the
# file, the native class would raise AttributeError there (or ignore the flag).
_APEX_ONLY = frozenset({"enable_allreduce", "disable_allreduce", "sync_bucket_structure", "allreduce_bucket",
                        "allreduce_maybe_retain", "allreduce_fallback", "comm_ready_buckets", "create_hooks",
                        "needs_refresh", "needs_reduction", "allreduce_buffers"})


class ApexDistributedDataParallel(ApexRename):
    """What it does:
    Replaces ``apex.parallel.DistributedDataParallel(model)`` (any import spelling or alias) with
    ``torch.nn.parallel.DistributedDataParallel(model)``, and other uses of the class
    (``isinstance``) with the native class. The class handed on as a value (``wrapper =
    DistributedDataParallel``) is reported: the calls made with it would lack the options below.

    Why is this bad?
    ``apex.parallel`` was removed from apex; the native class does the same job (bucketed
    all-reduce overlapping backward, parameters broadcast from rank 0 at construction).

    Fix safety:
    Safe. Options that only tune overlap (``message_size``, ``num_allreduce_streams``, ...) are
    dropped: the native class picks its own buckets, and the gradients are the same.
    The native class is given ``find_unused_parameters=True``: apex bucketed only the parameters
    the first backward pass reached, so a parameter that never gets a gradient (a pooler the loss
    does not use) was fine, where torch's DDP raises at the next iteration unless told to look
    for one. Where every parameter gets a gradient each step, it can be dropped by hand: it costs
    a walk of the graph each iteration. It is given ``broadcast_buffers=False`` too: apex never
    synchronised buffers (each rank kept its own BatchNorm statistics), where torch's DDP copies
    rank 0's before each forward pass; a forward pass only rank 0 runs through the wrapper (an
    evaluation) would then wait for ranks that never join the copy.
    Reported with options that change the maths or the buffers
    (``gradient_predivide_factor``, ``allreduce_always_fp32``, ``shared_param``,
    ``retain_allreduce_buffers``, ...), and where the file uses what only apex's class has
    (``model.disable_allreduce()`` between micro-batches, ``model.needs_reduction = False``):
    torch's class would raise there; its ``with model.no_sync():`` does that job. Reported, too, where
    the project checkpoints activations reentrantly (``checkpoint.checkpoint(blk, x)`` without
    ``use_reentrant=False``, in any of its files): torch's DDP finding unused parameters raises at
    the first backward pass there ("Expected to mark a variable ready only once"), where apex's
    all-reduce after the backward pass did not care; ``static_graph=True`` (or
    ``find_unused_parameters=False`` where every parameter gets a gradient) is a choice made by hand.
    Reported where one forward pass through the wrapped model takes several backward passes in the
    same iteration (``losses = net(x)``, the main loss's backward pass, then each discriminator
    loss's): apex all-reduced after each, where torch's DDP reduces once per forward pass (finding
    unused parameters, it raises at the second). Reported, too, where one backward pass reads two
    forward passes through the wrapped model called with different options (``net(x, task="semantic")``,
    then ``net(y, task="depth")``; also in a file of the project assigning a call of the function
    that returns the wrapped model): torch's DDP looks for unused parameters from the last forward
    pass only, and raises when a gradient comes to a part only the first ran. Two passes called
    alike (a siamese pair) run the same parts, and are rewritten.

    Options:
    None.
    """

    CODE = "AMP010"
    FIX = "apex DistributedDataParallel -> torch's"
    FIX_SAFETY = FixSafety.ALWAYS
    MESSAGE = "`apex.parallel.DistributedDataParallel` was removed from apex"
    TARGETS = ("apex.parallel.DistributedDataParallel", "apex.parallel.distributed.DistributedDataParallel")
    REFERENCES = {name: _NATIVE for name in TARGETS}
    CALLS_UNSEEN_DIFFER = True
    VALID = [
        Valid("from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(model)\n"),
        Valid("class DistributedDataParallel:\n    pass\nmodel = DistributedDataParallel(model)\n"),
    ]
    INVALID = [
        Invalid(
            "from apex.parallel import DistributedDataParallel as DDP\n\nmodel = DDP(model)\n",
            "import torch\n\nmodel = torch.nn.parallel.DistributedDataParallel(\n    model, find_unused_parameters=True, broadcast_buffers=False\n)\n",
        ),
        Invalid(
            "import apex\n\nmodel = apex.parallel.DistributedDataParallel(model, delay_allreduce=True)\nassert isinstance(model, apex.parallel.DistributedDataParallel)\n",
            "import torch\n\nmodel = torch.nn.parallel.DistributedDataParallel(\n    model, find_unused_parameters=True, broadcast_buffers=False\n)\n"
            "assert isinstance(model, torch.nn.parallel.DistributedDataParallel)\n",
        ),
        Invalid("from apex.parallel import DistributedDataParallel\n\nmodel = DistributedDataParallel(model, gradient_predivide_factor=8.0)\n"),
        Invalid(  # apex's own switch for accumulation: torch's class has `no_sync()` instead
            "from apex.parallel import DistributedDataParallel as DDP\n\nmodel = DDP(model)\n\n"
            "def step(model, last):\n    if last:\n        model.enable_allreduce()\n    else:\n        model.disable_allreduce()\n"
        ),
    ]

    _apex_only: list[str] | None = None  # worked out once per file, when a call asks

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        self._apex_only = None

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        if nodes.has_star(call) or len([a for a in call.args if a.keyword is None]) > 1:
            return NoFix("its options are passed positionally or through `*args`/`**kwargs`")
        apex_only = self._apex_only_uses()
        if apex_only:
            return NoFix(f"the file uses `.{apex_only[0]}`, which only apex's class has (torch's skips the all-reduce "
                         "with `with model.no_sync():` instead)")
        reentrant = reentrant_in_project(self.context.filename)
        if reentrant is not None:
            return NoFix(f"the project checkpoints activations reentrantly ({reentrant}): torch's DDP finding unused "
                         "parameters (as apex's tolerated them) raises at the first backward pass there; wrap it by hand "
                         "with `static_graph=True`, or `find_unused_parameters=False` where every parameter gets a gradient")
        twice = self._second_backward(call)
        if twice is not None:
            return NoFix(twice)
        options = nodes.keyword_names(call) - {"module"}
        other = options - set(_OVERLAP_ONLY)
        if other:
            return without_native(other)
        # apex bucketed only the parameters the first backward pass reached (with
        # `delay_allreduce`, whatever got a gradient), so parameters that never get one were
        # fine, where torch's DDP raises at the next iteration unless told to look for them.
        # apex never synchronised buffers; torch's DDP broadcasts rank 0's at each forward pass
        return NativeCall(self.rebuild(_NATIVE, call, drop=_OVERLAP_ONLY, extra=("find_unused_parameters=True", "broadcast_buffers=False")))

    def _second_backward(self, call: cst.Call) -> str | None:
        """Why not, where one forward pass through the wrapped model takes two backward passes."""
        pair = next(filter(None, (second_backward(self._module, name) for name in self._wrapped_names(call))), None)
        if pair is not None:
            first, second = (self.get_metadata(PositionProvider, node).start.line for node in pair)
            return (f"one forward pass through the wrapped model takes several backward passes (lines {first} and {second}): "
                    "apex all-reduced the gradients after each, where torch's DDP reduces once per forward pass (finding "
                    "unused parameters, it raises at the second); wrap it by hand, e.g. one forward pass per backward pass")
        for where, (first, second) in self._differing_forwards(call):
            return (f"one backward pass reads two forward passes through the wrapped model called with different options "
                    f"({where}lines {first} and {second}): torch's DDP finding unused parameters, as apex tolerated them, "
                    "looks for them from the last forward pass only, and raises where the first ran parts the last did not "
                    "('Expected to mark a variable ready only once'); wrap it by hand with `static_graph=True`, or "
                    "`find_unused_parameters=False` where every parameter gets a gradient")
        return None

    def _differing_forwards(self, call: cst.Call) -> Iterator[tuple[str, tuple[int, int]]]:
        """Two forward passes with different options one backward pass reads, as their lines: in this
        file, then in the project's files assigning a call of the function returning the wrapped
        model (``net = network.wrap_network_in_dataparallel(net, args.apex)``), with their path."""
        for name in self._wrapped_names(call):
            pair = differing_forwards(self._module, name)
            if pair is not None:
                yield "", tuple(self.get_metadata(PositionProvider, node).start.line for node in pair)
        returner = self._returning_function(call)
        if returner is not None:
            yield from forwards_in_callers(self.context.filename, returner)

    def _returning_function(self, call: cst.Call) -> str | None:
        """The name of the function the wrapping ``call`` is made in (None at module level)."""
        owner = self.get_metadata(ParentNodeProvider, call, None)
        while owner is not None and not isinstance(owner, cst.FunctionDef):
            owner = self.get_metadata(ParentNodeProvider, owner, None)
        return None if owner is None else owner.name.value

    def _wrapped_names(self, call: cst.Call) -> list[str]:
        """What the wrapped model is called where it runs: the name it is assigned to (``net =
        DDP(net)``), or, returned by a function, the names its calls are assigned to
        (``model = wrap(model)``)."""
        owner = self.get_metadata(ParentNodeProvider, call, None)
        if isinstance(owner, cst.Assign) and len(owner.targets) == 1:
            return [nodes.code(owner.targets[0].target)]
        returner = self._returning_function(call)
        if returner is None:
            return []
        return [nodes.code(node.targets[0].target) for node in descendants(self._module)
                if type(node) is cst.Assign and len(node.targets) == 1 and type(node.value) is cst.Call
                and nodes.call_name(node.value) == returner]

    def _apex_only_uses(self) -> list[str]:
        """The attributes only apex's class has that the file reads, calls or sets, in order."""
        if self._apex_only is None:
            self._apex_only = [node.attr.value for node in descendants(self._module)
                               if type(node) is cst.Attribute and node.attr.value in _APEX_ONLY]
        return self._apex_only
