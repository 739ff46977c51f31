"""``apex.parallel``: DistributedDataParallel, SyncBatchNorm and friends on native torch.distributed.

``LARC`` is deliberately not re-exported: in apex, ``apex.parallel.LARC`` is the submodule and the
class is ``apex.parallel.LARC.LARC``.
"""
import torch

from ampshim.parallel import LARC  # noqa: F401  (the submodule, bound as in apex)
from ampshim.parallel.distributed import DistributedDataParallel, Reducer
from ampshim.parallel.sync_batchnorm import SyncBatchNorm, convert_syncbn_model, create_syncbn_process_group

ReduceOp = torch.distributed.ReduceOp

__all__ = ["DistributedDataParallel", "Reducer", "SyncBatchNorm", "convert_syncbn_model",
           "create_syncbn_process_group", "ReduceOp"]
