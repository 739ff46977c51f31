"""Native autocast's op policies, as data, in the vocabulary of the O1 cast lists.

ampshim's O1 leaves every function to native autocast unless the user changed its entry in
``amp.lists`` (or registered it) *and* the requested policy differs from what native autocast
already does. These tables answer the second half. Names are Python-level function and method
names; ``torch.exp``, ``torch.Tensor.exp`` and ``F.<name>`` share the policy of the aten op behind them.

A name missing from a table means "runs in its input dtype". When in doubt an entry is left
out: a missing entry only costs a wrapper where one was not needed, never a lost user edit.

Policies: ``"half"`` (autocast's lower-precision dtype), ``"float"`` (float32),
``"promote"`` (mixed floating inputs promoted to the widest), ``"banned"`` (autocast refuses it).
"""

# Builtin type promotion gives these the same outcome as apex's explicit promote casts.
_TYPE_PROMOTING = frozenset(
    {
        "add", "sub", "mul", "div", "true_divide", "eq", "ne", "ge", "gt", "le", "lt", "cat", "stack",
        "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
        "__rtruediv__", "__div__", "__rdiv__", "__eq__", "__ne__", "__ge__", "__gt__", "__le__", "__lt__",
    }
)

_MATMULS = frozenset(
    {
        "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
        "conv_transpose3d", "convolution", "prelu", "addmm", "matmul", "einsum", "mm", "linear",
        "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "linalg_vecdot",
        "scaled_dot_product_attention", "__matmul__", "__rmatmul__",
    }
)

# CUDA: aten/src/ATen/autocast_mode.cpp, plus composites whose parts are all fp32
# (cross_entropy = log_softmax + nll_loss; softmin = softmax).
_CUDA = {
    **dict.fromkeys(_TYPE_PROMOTING, "promote"),
    **dict.fromkeys(
        _MATMULS | {"addmv", "addr", "mv", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"},
        "half",
    ),
    **dict.fromkeys(
        (
            "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
            "reciprocal", "rsqrt", "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus",
            "layer_norm", "group_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity",
            "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss",
            "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
            "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
            "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist",
            "renorm", "logsumexp", "prod", "softmax", "log_softmax", "softmin", "cumprod",
            "cumsum", "sum", "norm", "cross_entropy",
        ),
        "float",
    ),
    **dict.fromkeys(
        ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sample", "index_put",
         "tensordot", "scatter_add"),
        "promote",
    ),
    "binary_cross_entropy": "banned",
}

# CPU (bfloat16), checked against torch's behaviour by tests/ampshim/test_lists.py.
_CPU = {
    **dict.fromkeys(_TYPE_PROMOTING, "promote"),
    **dict.fromkeys(_MATMULS, "half"),
    **dict.fromkeys(
        (
            "local_response_norm", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "nll_loss",
            "cross_entropy", "kl_div", "binary_cross_entropy_with_logits", "binary_cross_entropy",
            "poisson_nll_loss", "cosine_embedding_loss", "hinge_embedding_loss",
            "margin_ranking_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss",
            "multi_margin_loss", "soft_margin_loss", "triplet_margin_loss", "ctc_loss", "prod",
            "cdist",
        ),
        "float",
    ),
}

_TABLES = {"cuda": _CUDA, "cpu": _CPU}


def native_policy(device_type, name):
    """What native autocast on ``device_type`` does with ``name``: a policy string, or None."""
    return _TABLES.get(device_type, {}).get(name)
