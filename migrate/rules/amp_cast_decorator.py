"""AMP006: ``@amp.half_function`` / ``@amp.float_function`` -> ``@torch.amp.custom_fwd(cast_inputs=...)``."""
from __future__ import annotations

import textwrap

import libcst as cst
from libcst.metadata import ParentNodeProvider

from migrate import apex_nodes as nodes
from migrate.apex_plan import ApexPlanProvider, plan_of
from migrate.rule import Invalid, Valid
from migrate.rules._apex_planned import GOES_WITH, apex_casts_after_run
from migrate.rules._apex_rename import ApexRename, NativeCall, NoFix
from migrate.step_model.shapes import parameters_of
from migrate.types import FixSafety, ImportChange, Safety

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
    on and runs the body with autocast off, as apex did. Safe on a plain function or method: apex
    cast its floating-point CUDA inputs where O1 was on and left its own ops to O1's casts, so the
    rewrite casts them at its entry where autocast is on (``if torch.is_autocast_enabled("cuda"):``)
    and leaves its ops to autocast. Safe on the call form ``nms = amp.float_function(_C.nms)``:
    a function ``nms(*args, **kwargs)`` casting them the same way, then calling ``_C.nms``.
    Each of these is safe only where the project's O1 is native autocast: unsafe while apex still
    initializes, in this file (its ``amp.initialize`` not rewritten, or rewritten unsafely) or in
    another file of the project that the run leaves on apex. Real apex O1 never turns native
    autocast on, so the rewritten function would cast nothing and get apex's fp16 outputs.
    Reported (not rewritten): ``promote_function``, a decorated function taking
    ``*args``/``**kwargs`` or with other decorators; cast the inputs by hand there.

    Options:
    None.
    """

    CODE = "AMP006"
    FIX = '@amp.half_function etc. -> custom_fwd, or casts at entry'
    FIX_SAFETY = FixSafety.SOMETIMES
    MESSAGE = "apex's cast decorators need apex's casting machinery"
    TARGETS = (*_CASTS, _PROMOTE)
    METADATA_DEPENDENCIES = (*ApexRename.METADATA_DEPENDENCIES, ApexPlanProvider)
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
        Invalid(
            """from apex import amp

@amp.float_function
def scores(q, k):
    return q @ k.transpose(-1, -2)
""",
            """import torch

def scores(q, k):
    if torch.is_autocast_enabled("cuda"):  # as apex's @amp.float_function did
        q, k = (
            t.float()
            if isinstance(t, torch.Tensor) and t.is_cuda and t.is_floating_point()
            else t
            for t in (q, k)
        )
    return q @ k.transpose(-1, -2)
""",
        ),
        Invalid(
            "from apex import amp\nnms = amp.float_function(_C.nms)\n",
            """import torch


def nms(*args, **kwargs):
    if torch.is_autocast_enabled("cuda"):  # as apex's amp.float_function did
        args = [
            t.float()
            if isinstance(t, torch.Tensor) and t.is_cuda and t.is_floating_point()
            else t
            for t in args
        ]
        kwargs = {
            key: t.float()
            if isinstance(t, torch.Tensor) and t.is_cuda and t.is_floating_point()
            else t
            for key, t in kwargs.items()
        }
    return _C.nms(*args, **kwargs)
""",
        ),
        Invalid(
            """from apex import amp

@amp.half_function
def project(h):
    return h @ weight

model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
loss = project(model(x)).sum()
with amp.scale_loss(loss, optimizer) as scaled_loss:
    scaled_loss.backward()
optimizer.step()
""",
            """import torch

def project(h):
    if torch.is_autocast_enabled("cuda"):  # as apex's @amp.half_function did
        h = (
            h.half()
            if isinstance(h, torch.Tensor) and h.is_cuda and h.is_floating_point()
            else h
        )
    return h @ weight

# TODO(ampmigrate): review, this rewrite is unsafe: O2 keeps fp16 weights with fp32
#   master copies, where native autocast keeps fp32 weights, like O1 (`o2-as-autocast =
#   true` in [tool.ampmigrate.settings] accepts that)
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.float16):
    loss = project(model(x)).sum()
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
""",
            unsafe_fixes=True,
        ),
        Invalid("from apex import amp\nnms = amp.promote_function(_C.nms)\n"),
    ]

    def __init__(self, context=None) -> None:
        super().__init__(context)
        self._handled: set[int] = set()  # the call forms rewritten whole

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        self._safety, self._why = self._where_apex_stays(node)

    def _where_apex_stays(self, module: cst.Module) -> tuple[Safety, str]:
        """The fixes' safety: unsafe where apex O1, not native autocast, will still run the casts
        (the rewrite is then right only once that runs on native autocast or ampshim)."""
        casts = apex_casts_after_run(plan_of(self, module), self.context.settings)
        if casts.stay == "elsewhere":
            return Safety.UNSAFE, (f"{casts.why}: under real apex O1 native autocast is off, so this casts nothing; "
                                   "safe once that file runs on native autocast or ampshim")
        if casts.stay == "here":
            return Safety.UNSAFE, f"{casts.why}: under real apex O1 native autocast is off, so this casts nothing"
        return casts.safety, casts.why

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        params = node.params.params
        is_forward = node.name.value == "forward" and bool(params) and params[0].name.value == "ctx"
        for decorator in node.decorators:
            target = self._target(decorator.decorator)
            if target is None:
                continue
            self._funcs.add(id(decorator.decorator))
            if target != _PROMOTE and not is_forward and self._cast_at_entry(node, decorator, target):
                continue
            if target == _PROMOTE or not is_forward:
                self.report(decorator, f"{self.MESSAGE}; not rewritten: cast the inputs by hand inside `with torch.autocast(\"cuda\", enabled=False):`")
                continue
            native = nodes.parse_expression(f'torch.amp.custom_fwd(device_type="cuda", cast_inputs={_CASTS[target]})', self._module)
            if self._safety is Safety.SAFE:
                self._fix(decorator.decorator, native, Safety.SAFE, "Use `torch.amp.custom_fwd`")
                continue
            root = nodes.root_name(decorator.decorator)
            self.report(decorator, replacement=self._marked(decorator.with_changes(decorator=native)), safety=self._safety,
                        why_unsafe=self._why, fix_message="Use `torch.amp.custom_fwd`", add_imports=(ImportChange("torch"),),
                        remove_imports=tuple(self._apex_imports.get(root or "", ())))

    def _cast_at_entry(self, function: cst.FunctionDef, decorator: cst.Decorator, target: str) -> bool:
        """A plain function (or method): apex cast its floating-point CUDA inputs where an O1 handle
        was active, and left its own ops to O1's casts. Natively: the same cast at its entry, where
        autocast is on; its ops stay autocast's. Whether it was rewritten (not with ``*args``/``**kwargs``)."""
        params = function.params
        if isinstance(params.star_arg, cst.Param) or params.star_kwarg is not None or len(function.decorators) > 1:
            return False
        names = [param.name.value for param in parameters_of(function)]
        if names and names[0] in ("self", "cls"):
            names = names[1:]
        body = function.body
        if not names or not isinstance(body, cst.IndentedBlock):
            return False
        cast = {"torch.float16": "half", "torch.float32": "float", "torch.bfloat16": "bfloat16"}[_CASTS[target]]
        test = "isinstance({0}, torch.Tensor) and {0}.is_cuda and {0}.is_floating_point()"
        if len(names) == 1:  # as a formatter puts it: on one line where it fits (in a method too)
            name = names[0]
            value = f"{name}.{cast}() if {test.format(name)} else {name}"
            line = f"{name} = {value}" if len(f"{name} = {value}") + 12 <= 88 else f"{name} = (\n        {value}\n    )"
        else:
            line = (f"{', '.join(names)} = (\n        t.{cast}() if {test.format('t')} else t\n"
                    f"        for t in ({', '.join(names)})\n    )")
        apex = nodes.code(decorator.decorator).split(".")[-1]
        lines = nodes.parse_statements(f'if torch.is_autocast_enabled("cuda"):  # as apex\'s @amp.{apex} did\n    {line}\n', self._module)
        statements = list(body.body)
        at = 1 if statements and nodes.is_docstring(statements[0]) else 0
        statements[at:at] = lines
        new = function.with_changes(decorators=[d for d in function.decorators if d is not decorator],
                                    body=body.with_changes(body=statements))
        if function.decorators[0] is decorator:  # the comments above the decorator stay above the function
            new = new.with_changes(leading_lines=(*function.leading_lines, *decorator.leading_lines))
        root = nodes.root_name(decorator.decorator)
        self.report(function, replacement=self._marked(new), safety=self._safety, why_unsafe=self._why,
                    fix_message="Cast the inputs at the function's entry where autocast is on, as apex did",
                    add_imports=(ImportChange("torch"),), remove_imports=tuple(self._apex_imports.get(root or "", ())))
        return True

    def _marked(self, node: cst.CSTNode) -> cst.CSTNode:
        """``node`` with a ``# TODO(ampmigrate): ...`` saying why, above it, where its fix is unsafe
        for a reason of its own (not one the marker of this file's ``amp.initialize`` gives)."""
        if self._safety is Safety.SAFE or self._why.startswith(GOES_WITH):
            return node
        lines = textwrap.wrap(f"TODO(ampmigrate): review, this rewrite is unsafe: {self._why}", width=76, break_on_hyphens=False, break_long_words=False)
        comments = [cst.EmptyLine(comment=cst.Comment(f"# {text}" if i == 0 else f"#   {text}")) for i, text in enumerate(lines)]
        return node.with_changes(leading_lines=[*node.leading_lines, *comments])

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        """The call form, ``nms = amp.float_function(_C.nms)``: a function of that name casting its
        floating-point CUDA inputs where autocast is on, then calling the wrapped one, as apex's
        wrapper did where O1 was on (its ops stay autocast's)."""
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Assign):
            return
        assign = node.body[0]
        call = assign.value
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name) or not isinstance(call, cst.Call):
            return
        target = self._target(call.func)
        if target not in _CASTS or len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            return
        self._funcs.add(id(call.func))
        self._handled.add(id(call))
        name, wrapped = assign.targets[0].target.value, nodes.code(call.args[0].value)
        cast = {"torch.float16": "half", "torch.float32": "float", "torch.bfloat16": "bfloat16"}[_CASTS[target]]
        tensor = f"t.{cast}() if isinstance(t, torch.Tensor) and t.is_cuda and t.is_floating_point() else t"
        apex = nodes.code(call.func).split(".")[-1]
        source = (f"def {name}(*args, **kwargs):\n"
                  f'    if torch.is_autocast_enabled("cuda"):  # as apex\'s amp.{apex} did\n'
                  f"        args = [\n            {tensor}\n            for t in args\n        ]\n"
                  f"        kwargs = {{\n            key: {tensor}\n            for key, t in kwargs.items()\n        }}\n"
                  f"    return {wrapped}(*args, **kwargs)\n")
        function = nodes.with_leading(nodes.parse_statements(source, self._module)[0], node)
        blank = sum(1 for line in function.leading_lines if line.comment is None)
        if isinstance(self.get_metadata(ParentNodeProvider, node, None), cst.Module) and blank < 2 and self._module.body[0] is not node:
            # a definition among statements: two blank lines above it
            function = function.with_changes(leading_lines=[*[cst.EmptyLine()] * (2 - blank), *function.leading_lines])
        root = nodes.root_name(call.func)
        self.report(node, replacement=self._marked(function), safety=self._safety, why_unsafe=self._why,
                    fix_message="Define a function casting the inputs where autocast is on, as apex's wrapper did",
                    add_imports=(ImportChange("torch"),), remove_imports=tuple(self._apex_imports.get(root or "", ())))

    def visit_Call(self, node: cst.Call) -> None:
        if id(node) not in self._handled:
            super().visit_Call(node)

    def native_call(self, call: cst.Call, target: str) -> NativeCall | NoFix:
        return NoFix('native autocast has no registry: cast the inputs by hand inside `with torch.autocast("cuda", enabled=False):`')

    def _reference(self, node: cst.BaseExpression) -> None:
        if id(node) in self._funcs:
            return
        if self._target(node) is not None:
            self.report(node, f"{self.MESSAGE}; not rewritten: this use is not a decorator on `forward(ctx, ...)`")
