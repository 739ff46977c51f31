"""``apex.fp16_utils``: the pre-amp manual mixed-precision toolkit (FP16_Optimizer and helpers)."""
from ampshim.fp16_utils.fp16_optimizer import FP16_Optimizer
from ampshim.fp16_utils.fp16util import (
    BN_convert_float,
    FP16Model,
    clip_grad_norm,
    convert_module,
    convert_network,
    master_params_to_model_params,
    model_grads_to_master_grads,
    network_to_half,
    prep_param_lists,
    to_python_float,
    tofp16,
)
from ampshim.fp16_utils.loss_scaler import DynamicLossScaler, LossScaler

__all__ = ["BN_convert_float", "network_to_half", "prep_param_lists", "model_grads_to_master_grads",
           "master_params_to_model_params", "tofp16", "to_python_float", "clip_grad_norm",
           "convert_module", "convert_network", "FP16Model", "FP16_Optimizer", "LossScaler",
           "DynamicLossScaler"]
