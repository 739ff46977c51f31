"""AMP010: ``apex.parallel.DistributedDataParallel`` -> ``torch.nn.parallel.DistributedDataParallel``."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix, without_native
from migrate.types import FixSafety

_NATIVE = "torch.nn.parallel.DistributedDataParallel"
# apex options that only tune how the all-reduce overlaps with backward: dropping them keeps the
# maths. But for delay_allreduce, which also let parameters go without a gradient: see native_call.
_OVERLAP_ONLY = ("delay_allreduce", "message_size", "num_allreduce_streams", "allreduce_communicators", "prof")


class ApexDistributedDataParallel(ApexRename):
    """What it does:
    Replaces ``apex.parallel.DistributedDataParallel(model)`` (any import spelling or alias) with
    ``torch.nn.parallel.DistributedDataParallel(model)``, and other uses of the class
    (``isinstance``) with the native class.

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
    a walk of the graph each iteration. Buffers: torch's DDP copies rank 0's before each forward
    where apex left each rank its own; rank 0's, which checkpoints save, are the same either way.
    Reported with options that change the maths or the buffers
    (``gradient_predivide_factor``, ``allreduce_always_fp32``, ``shared_param``,
    ``retain_allreduce_buffers``, ...).

    Options:
    None.
    """

    CODE = "AMP010"
    FIX = "apex DistributedDataParallel -> torch's"
    FIX_SAFETY = FixSafety.ALWAYS
    MESSAGE = "`apex.parallel.DistributedDataParallel` was removed from apex"
    TARGETS = ("apex.parallel.DistributedDataParallel", "apex.parallel.distributed.DistributedDataParallel")
    REFERENCES = {name: _NATIVE for name in TARGETS}
    VALID = [
        Valid("from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(model)\n"),
        Valid("class DistributedDataParallel:\n    pass\nmodel = DistributedDataParallel(model)\n"),
    ]
    INVALID = [
        Invalid(
            "from apex.parallel import DistributedDataParallel as DDP\n\nmodel = DDP(model)\n",
            "import torch\n\nmodel = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)\n",
        ),
        Invalid(
            "import apex\n\nmodel = apex.parallel.DistributedDataParallel(model, delay_allreduce=True)\nassert isinstance(model, apex.parallel.DistributedDataParallel)\n",
            "import torch\n\nmodel = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)\nassert isinstance(model, torch.nn.parallel.DistributedDataParallel)\n",
        ),
        Invalid("from apex.parallel import DistributedDataParallel\n\nmodel = DistributedDataParallel(model, gradient_predivide_factor=8.0)\n"),
    ]

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        if nodes.has_star(call) or len([a for a in call.args if a.keyword is None]) > 1:
            return NoFix("its options are passed positionally or through `*args`/`**kwargs`")
        options = nodes.keyword_names(call) - {"module"}
        other = options - set(_OVERLAP_ONLY)
        if other:
            return without_native(other)
        # apex bucketed only the parameters the first backward pass reached (with
        # `delay_allreduce`, whatever got a gradient), so parameters that never get one were
        # fine, where torch's DDP raises at the next iteration unless told to look for them.
        return NativeCall(self.rebuild(_NATIVE, call, drop=_OVERLAP_ONLY, extra=("find_unused_parameters=True",)))
