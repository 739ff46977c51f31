"""O1 cast lists for ``torch.nn.functional`` (apex's ``amp.lists.functional_overrides``).

Plain, mutable lists of attribute names. Edits made before ``amp.initialize`` (O1) or ``amp.init()``
are honoured there; edits made later have no effect until the next initialization.

Example (moves softmax to half precision, as NVIDIA's Tacotron2 scripts do)::

    >>> from apex import amp
    >>> amp.lists.functional_overrides.FP32_FUNCS.remove('softmax')
    >>> amp.lists.functional_overrides.FP16_FUNCS.append('softmax')
"""
import torch

MODULE = torch.nn.functional

# Run in the autocast's lower precision (float16 on CUDA, bfloat16 on CPU).
FP16_FUNCS = [
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "conv_tbc",
    "linear",
]

# Run in float32.
FP32_FUNCS = [
    "interpolate",
    "grid_sample",
    "softplus",
    "softmin",
    "log_softmax",
    "softmax",
    "gelu",
    "layer_norm",
    "group_norm",
    "local_response_norm",
    "normalize",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "cross_entropy",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "multilabel_soft_margin_loss",
    "multi_margin_loss",
    "nll_loss",
    "binary_cross_entropy_with_logits",
    "smooth_l1_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "ctc_loss",
]

_BCE_MESSAGE = (
    "amp does not work out-of-the-box with `F.binary_cross_entropy` or `torch.nn.BCELoss`: "
    "it needs its input to already be float32, and under O1 the function before it "
    "usually returns half precision.\n\n"
    "Most models apply a sigmoid right before BCELoss. If yours does, replace both with\n"
    "    torch.nn.BCEWithLogitsLoss\n"
    "which fuses them and is safe in half precision.\n"
    "Otherwise, run the sigmoid in float32 by calling\n"
    "    amp.register_float_function(torch, 'sigmoid')\n"
    "before `amp.initialize()` / `amp.init()`.\n"
    "If you are sure the half-precision input is safe, pass allow_banned=True to `amp.init()` "
    "and the input will be cast to float32."
)

# (name, message): calling these with a half-precision argument raises NotImplementedError(message).
BANNED_FUNCS = [
    ("binary_cross_entropy", _BCE_MESSAGE),
]

# The shipped lists, to tell the user's edits from the defaults at initialization.
_DEFAULTS = {
    "FP16_FUNCS": tuple(FP16_FUNCS),
    "FP32_FUNCS": tuple(FP32_FUNCS),
    "BANNED_FUNCS": tuple(BANNED_FUNCS),
}
