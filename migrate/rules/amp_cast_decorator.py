"""AMP006: ``@amp.half_function`` / ``@amp.float_function`` -> ``@torch.amp.custom_fwd(cast_inputs=...)``."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.rule import Invalid, Valid
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix
from migrate.types import FixSafety, Safety

_CASTS = {
    "apex.amp.half_function": "torch.float16",
    "apex.amp.float_function": "torch.float32",
    "apex.amp.bfloat16_function": "torch.bfloat16",
}
_PROMOTE = "apex.amp.promote_function"


class AmpCastDecorator(ApexRename):
    """What it does:
    Replaces ``@amp.half_function`` (``float_function``, ``bfloat16_function``) on the ``forward``
    of a ``torch.autograd.Function`` with
    ``@torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float16)`` (``torch.float32``, ...).

    Why is this bad?
    apex's decorators registered the function with apex's casting machinery, which no longer
    exists; ``custom_fwd`` is the native way to run a custom function's forward in a fixed dtype
    inside an autocast region.

    Fix safety:
    Safe on ``forward(ctx, ...)``: ``custom_fwd`` casts the floating-point inputs when autocast is
    on and runs the body with autocast off, as apex did. Elsewhere (plain functions, the call form
    ``f = amp.float_function(f)``, ``promote_function``) it is reported: ``custom_fwd`` expects a
    ``ctx`` first argument, so cast the inputs by hand inside
    ``with torch.autocast("cuda", enabled=False):`` instead.

    Options:
    None.
    """

    CODE = "AMP006"
    FIX_SAFETY = FixSafety.ALWAYS
    MESSAGE = "apex's cast decorators need apex's casting machinery"
    TARGETS = (*_CASTS, _PROMOTE)
    VALID = [Valid("import torch\n\nclass F(torch.autograd.Function):\n    @staticmethod\n    @torch.amp.custom_fwd(device_type=\"cuda\", cast_inputs=torch.float16)\n    def forward(ctx, x):\n        return x\n")]
    INVALID = [
        Invalid(
            """from apex import amp

class Fused(torch.autograd.Function):
    @staticmethod
    @amp.half_function
    def forward(ctx, x, weight):
        return fused_op(x, weight)
""",
            """import torch

class Fused(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float16)
    def forward(ctx, x, weight):
        return fused_op(x, weight)
""",
        ),
        Invalid("from apex import amp\nnms = amp.float_function(_C.nms)\n"),
    ]

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        params = node.params.params
        is_forward = node.name.value == "forward" and bool(params) and params[0].name.value == "ctx"
        for decorator in node.decorators:
            target = self._target(decorator.decorator)
            if target is None:
                continue
            self._funcs.add(id(decorator.decorator))
            if target == _PROMOTE or not is_forward:
                self.report(decorator, f"{self.MESSAGE}; not rewritten: cast the inputs by hand inside `with torch.autocast(\"cuda\", enabled=False):`")
                continue
            native = f'torch.amp.custom_fwd(device_type="cuda", cast_inputs={_CASTS[target]})'
            self._fix(decorator.decorator, nodes.parse_expression(native, self._module), Safety.SAFE, "Use `torch.amp.custom_fwd`")

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        return NoFix('native autocast has no registry: cast the inputs by hand inside `with torch.autocast("cuda", enabled=False):`')

    def _reference(self, node: cst.BaseExpression) -> None:
        if id(node) in self._funcs:
            return
        if self._target(node) is not None:
            self.report(node, f"{self.MESSAGE}; not rewritten: this use is not a decorator on `forward(ctx, ...)`")
