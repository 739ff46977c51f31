"""AMP011: ``convert_syncbn_model`` / ``apex.parallel.SyncBatchNorm`` -> ``torch.nn.SyncBatchNorm``."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix, without_native
from migrate.types import FixSafety

_CONVERT = "apex.parallel.convert_syncbn_model"
_CLASS = "apex.parallel.SyncBatchNorm"


class ApexSyncBatchNorm(ApexRename):
    """What it does:
    Replaces ``apex.parallel.convert_syncbn_model(model)`` with
    ``torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)`` (``process_group`` carried over) and
    ``apex.parallel.SyncBatchNorm(...)`` with ``torch.nn.SyncBatchNorm(...)``.

    Why is this bad?
    ``apex.parallel`` was removed from apex; the native SyncBatchNorm computes the same
    cross-process batch statistics.

    Fix safety:
    Safe for the standard arguments. Reported with ``channel_last`` or ``fuse_relu`` (apex-only
    layouts and fusions) and for ``create_syncbn_process_group`` (use
    ``torch.distributed.new_group`` with the ranks of each group).

    Options:
    None.
    """

    CODE = "AMP011"
    FIX = 'apex SyncBatchNorm / convert_syncbn_model -> torch.nn.SyncBatchNorm'
    FIX_SAFETY = FixSafety.ALWAYS
    MESSAGE = "apex's SyncBatchNorm was removed from apex"
    TARGETS = (_CONVERT, _CLASS, "apex.parallel.create_syncbn_process_group")
    REFERENCES = {_CLASS: "torch.nn.SyncBatchNorm"}
    VALID = [Valid("import torch\nmodel = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n")]
    INVALID = [
        Invalid(
            "from apex.parallel import convert_syncbn_model\n\nmodel = convert_syncbn_model(model)\n",
            "import torch\n\nmodel = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n",
        ),
        Invalid(
            "import apex\nbn = apex.parallel.SyncBatchNorm(64, eps=1e-3)\n",
            "import torch\n\nbn = torch.nn.SyncBatchNorm(64, eps=1e-3)\n",
        ),
        Invalid("from apex.parallel import create_syncbn_process_group\ngroup = create_syncbn_process_group(8)\n"),
    ]

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        if target.endswith("create_syncbn_process_group"):
            return NoFix("build the groups with `torch.distributed.new_group(ranks)`")
        if nodes.has_star(call):
            return NoFix("its arguments are passed through `*args`/`**kwargs`")
        apex_only = nodes.keyword_names(call) & {"channel_last", "fuse_relu"}
        if apex_only:
            return without_native(apex_only)
        if target == _CONVERT:
            if len([a for a in call.args if a.keyword is None]) > 2:
                return NoFix("`channel_last` is passed positionally")
            return NativeCall(self.rebuild("torch.nn.SyncBatchNorm.convert_sync_batchnorm", call))
        if len([a for a in call.args if a.keyword is None]) > 6:
            return NoFix("apex-only arguments are passed positionally")
        return NativeCall(self.rebuild("torch.nn.SyncBatchNorm", call))
