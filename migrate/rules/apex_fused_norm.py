"""AMP014: ``FusedLayerNorm`` -> ``torch.nn.LayerNorm``, ``FusedRMSNorm`` -> ``torch.nn.RMSNorm``."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix, without_native
from migrate.types import FixSafety, Safety

_LAYER = ("apex.normalization.FusedLayerNorm", "apex.normalization.fused_layer_norm.FusedLayerNorm")
_RMS = ("apex.normalization.FusedRMSNorm", "apex.normalization.fused_layer_norm.FusedRMSNorm")
_MIXED = (
    "apex.normalization.MixedFusedLayerNorm",
    "apex.normalization.fused_layer_norm.MixedFusedLayerNorm",
    "apex.normalization.MixedFusedRMSNorm",
    "apex.normalization.fused_layer_norm.MixedFusedRMSNorm",
)
_SHARED = {"normalized_shape", "eps", "elementwise_affine"}


class ApexFusedNorm(ApexRename):
    """What it does:
    Replaces ``FusedLayerNorm(shape, eps, elementwise_affine)`` with ``torch.nn.LayerNorm`` (same
    parameters and defaults) and ``FusedRMSNorm(shape, ...)`` with ``torch.nn.RMSNorm(shape, ...)``,
    writing apex's ``eps=1e-5`` out when it was not given (torch's default is the dtype's epsilon).
    ``isinstance`` checks and base classes naming ``FusedLayerNorm`` become ``torch.nn.LayerNorm``.

    Why is this bad?
    The fused kernels need an apex build; the native modules compute the same normalisation and
    are fused by torch where it can.

    Fix safety:
    Safe for ``FusedLayerNorm`` and ``FusedRMSNorm`` (``memory_efficient`` only trades memory for
    recomputation and is dropped). Unsafe for ``MixedFused*``: apex kept the parameters in fp32
    and returned the input's dtype; the native module follows its parameters' dtype. Uses of
    ``FusedRMSNorm`` that are not calls are reported (a subclass would lose apex's eps default).

    Options:
    None.
    """

    CODE = "AMP014"
    FIX = 'FusedLayerNorm / FusedRMSNorm -> torch.nn.LayerNorm / RMSNorm'
    FIX_SAFETY = FixSafety.SOMETIMES
    MESSAGE = "apex's fused normalization needs an apex build; torch has the same modules"
    TARGETS = (*_LAYER, *_RMS, *_MIXED)
    REFERENCES = {name: "torch.nn.LayerNorm" for name in _LAYER}
    VALID = [Valid("import torch\n\nnorm = torch.nn.LayerNorm(768, eps=1e-12)\n")]
    INVALID = [
        Invalid(
            "from apex.normalization import FusedLayerNorm\nnorm = FusedLayerNorm(768, eps=1e-12)\n",
            "import torch\n\nnorm = torch.nn.LayerNorm(768, eps=1e-12)\n",
        ),
        Invalid(
            "from apex.normalization import FusedRMSNorm\nnorm = FusedRMSNorm(hidden)\n",
            "import torch\n\nnorm = torch.nn.RMSNorm(hidden, eps=1e-5)\n",
        ),
        Invalid(
            "from apex.normalization import FusedLayerNorm\n\nclass BertLayerNorm(FusedLayerNorm):\n    pass\n",
            "import torch\n\nclass BertLayerNorm(torch.nn.LayerNorm):\n    pass\n",
        ),
        Invalid(
            "from apex.normalization import MixedFusedLayerNorm\nnorm = MixedFusedLayerNorm(1024)\n",
            "import torch\n\nnorm = torch.nn.LayerNorm(1024)\n",
            unsafe_fixes=True,
        ),
    ]

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        if nodes.has_star(call) or len([a for a in call.args if a.keyword is None]) > 3:
            return NoFix("its arguments are passed through `*args`/`**kwargs` or positionally")
        unknown = nodes.keyword_names(call) - _SHARED - {"memory_efficient"}
        if unknown:
            return without_native(unknown)
        rms = "RMSNorm" in target
        native = "torch.nn.RMSNorm" if rms else "torch.nn.LayerNorm"
        given_eps = nodes.argument(call, 1, "eps") is not None
        extra = ("eps=1e-5",) if rms and not given_eps else ()
        source = self.rebuild(native, call, drop=("memory_efficient",), extra=extra)
        if target in _MIXED:
            return NativeCall(source, Safety.UNSAFE, "apex's MixedFused modules keep fp32 parameters and return the input's dtype")
        return NativeCall(source)
