"""What native CUDA autocast casts by itself: apex cast registrations of these change nothing."""
from __future__ import annotations

# What native CUDA autocast already runs in float16 ...
NATIVE_FP16 = frozenset(
    "conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d convolution prelu addmm addmv "
    "addr matmul einsum mm mv linear addbmm baddbmm bmm chain_matmul multi_dot lstm_cell gru_cell rnn_tanh_cell "
    "rnn_relu_cell scaled_dot_product_attention".split()
)
# ... and in float32.
NATIVE_FP32 = frozenset(
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus layer_norm "
    "group_norm norm nuclear_norm cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss hinge_embedding_loss "
    "kl_div l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss "
    "triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp "
    "softmax log_softmax cumsum cumprod sum prod".split()
)
REGISTER = {
    "apex.amp.register_half_function": NATIVE_FP16,
    "apex.amp.register_float_function": NATIVE_FP32,
    "apex.amp.register_bfloat16_function": frozenset(),
    "apex.amp.register_promote_function": frozenset(),
}
TORCH_MODULES = ("torch", "torch.nn.functional", "torch.Tensor")


def registered_natively(target: str, module_names: set[str], name: str | None) -> bool:
    """Whether ``target(module, name)`` (``apex.amp.register_half_function(torch, "einsum")``)
    asks for the cast native autocast already makes."""
    return bool(set(TORCH_MODULES) & module_names) and name in REGISTER.get(target, ())
