"""``apex.optimizers``: apex's fused optimizers as ``torch.optim.Optimizer`` subclasses on foreach ops."""
from ampshim.optimizers.fused_adagrad import FusedAdagrad
from ampshim.optimizers.fused_adam import FusedAdam
from ampshim.optimizers.fused_lamb import FusedLAMB
from ampshim.optimizers.fused_mixed_precision_lamb import FusedMixedPrecisionLamb
from ampshim.optimizers.fused_novograd import FusedNovoGrad
from ampshim.optimizers.fused_sgd import FusedSGD

__all__ = ["FusedSGD", "FusedAdam", "FusedNovoGrad", "FusedLAMB", "FusedAdagrad",
           "FusedMixedPrecisionLamb"]
