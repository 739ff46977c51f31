"""timm's ``ApexScaler`` calls ``amp.scale_loss`` itself, out of the file's sight; timm's
``NativeScaler`` does the same with a GradScaler. A training script built on timm picks one by
its amp option::

    amp_autocast = suppress
    if use_amp == "apex":
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        loss_scaler = ApexScaler()
    elif use_amp == "native":
        amp_autocast = torch.cuda.amp.autocast
        loss_scaler = NativeScaler()

and runs its forward passes under ``with amp_autocast():``. The apex arm becomes the native one:
the factory set to float16 autocast where ``initialize`` was, ``NativeScaler()`` for
``ApexScaler()``. Unsafe: apex's O1 cast every forward pass, and the two scalers save their state
under different checkpoint keys."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Step
from migrate.apex_plan.vocabulary import CORE, INITIALIZE, Unplannable, same_places
from migrate.names import imported_as, qualified_names
from migrate.types import ImportChange

BY_HAND = "timm's `ApexScaler` calls apex's `amp.scale_loss` itself: use timm's `NativeScaler` (with `torch.autocast`) there first"
AUTOCASTS = frozenset({"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.amp.autocast_mode.autocast"})


class TimmScalerPlanning(Step):
    """``ApexScaler()`` becomes ``NativeScaler()``, and ``amp.initialize`` beside it sets the
    file's autocast factory (a name it binds to ``torch.cuda.amp.autocast`` or a ``partial`` of
    ``torch.autocast`` elsewhere) to float16 autocast."""

    def plan_timm_scalers(self, native_name: str | None) -> None:
        init = self._initialize()
        statement = self.tree.statement(init)
        factory = self._autocast_factory(statement)
        block = self.tree.parent.get(id(statement))
        for call in self.sites.timm_scalers:
            made = self.tree.statement(call)
            small = made.body[0] if isinstance(made, cst.SimpleStatementLine) and len(made.body) == 1 else None
            if not (isinstance(small, cst.Assign) and small.value is call and not call.args):
                raise Unplannable(call, f"{BY_HAND} (`{nodes.code(call)}` is not assigned on a line of its own)")
            if self.tree.parent.get(id(made)) is not block:
                raise Unplannable(call, f"{BY_HAND} (`{nodes.code(call)}` is not made beside `amp.initialize`)")
            name = native_name or "NativeScaler"
            self.draft.replace(call, call.with_changes(func=cst.Name(name)))
            self.draft.kind(call, INITIALIZE, "timm's `ApexScaler` scales the loss with apex's `amp.scale_loss`",
                            f"Use timm's `{name}`: a GradScaler")
        if native_name is None:
            self.draft.imports_added.append(ImportChange("timm.utils", "NativeScaler"))
        partial = self._partial_spelling()
        autocast = f'{partial}(torch.autocast, "cuda", dtype=torch.float16)'
        self.draft.replace(statement, nodes.parse_statements(f"{factory} = {autocast}\n", self.tree.module)[0])
        self.draft.kind(statement, INITIALIZE, "`amp.initialize` is apex mixed precision",
                        f"Set `{factory}` to float16 `torch.autocast`, as the native arm does")
        self.draft.unsafe.append(
            f"apex's O1 cast every forward pass once initialized; autocast covers only what runs under `{factory}()`: "
            "forward passes and losses outside it run in float32")
        self.draft.unsafe.append(
            "timm's `NativeScaler` saves its state under `amp_scaler`, `ApexScaler` under `amp`: a checkpoint of the "
            "apex run resumes with a fresh loss scale")

    def _partial_spelling(self) -> str:
        """``partial`` where the module imports it from functools (timm's scripts do), else
        ``functools.partial``, imported."""
        local = imported_as(self.tree.module, "functools", ("partial",), top_level=True).get("partial")
        if local is not None:
            return local
        self.draft.imports_added.append(ImportChange("functools"))
        return "functools.partial"

    def _initialize(self) -> cst.Call:
        """The one O1 ``model, optimizer = amp.initialize(model, optimizer, opt_level="O1")``."""
        first = self.sites.timm_scalers[0]
        others = [call for kind in CORE if kind != "initialize" for call in self.sites.calls[kind]]
        if others:
            raise Unplannable(others[0], f"{BY_HAND} (the file calls apex's amp itself too)")
        if len(self.sites.calls["initialize"]) != 1:
            raise Unplannable(first, f"{BY_HAND} (not one `amp.initialize` beside it)")
        (init,) = self.sites.calls["initialize"]
        level = nodes.literal_string(getattr(nodes.argument(init, None, "opt_level"), "value", None))
        extra = [arg for arg in init.args[2:] if arg.keyword is None or arg.keyword.value not in ("opt_level", "verbosity")]
        if level != "O1" or extra:
            raise Unplannable(init, f"{BY_HAND} (`NativeScaler` with autocast is O1 with dynamic scaling: this "
                                    f"`amp.initialize` asks for {'other options' if extra else level or 'a level read at run time'})")
        statement = self.tree.statement(init)
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
        given = ", ".join(nodes.code(arg.value) for arg in init.args[:2] if arg.keyword is None)
        handed_back = (isinstance(small, cst.Assign) and small.value is init and len(small.targets) == 1
                       and same_places(nodes.code(small.targets[0].target), given))
        if not handed_back and not (isinstance(small, cst.Expr) and small.value is init):
            raise Unplannable(init, f"{BY_HAND} (what `amp.initialize` hands back is used as something else)")
        return init

    def _autocast_factory(self, statement: cst.CSTNode) -> str:
        """The one name the function (or module) around ``statement`` binds to an autocast factory."""
        scope = self.tree.function(statement) or self.tree.module
        names = {assign.targets[0].target.value for assign in nodes.own_code(scope)
                 if type(assign) is cst.Assign and len(assign.targets) == 1 and type(assign.targets[0].target) is cst.Name
                 and self._makes_autocast(assign.value)}
        if len(names) != 1:
            found = ", ".join(f"`{name}`" for name in sorted(names)) or "none"
            raise Unplannable(statement, f"{BY_HAND} (the name this function runs its forward passes under is not "
                                         f"seen: names bound to an autocast factory: {found})")
        return names.pop()

    def _makes_autocast(self, value: cst.BaseExpression) -> bool:
        """``torch.cuda.amp.autocast`` or ``partial(torch.autocast, ...)``."""
        if type(value) is cst.Call and value.args and value.args[0].keyword is None \
                and "functools.partial" in qualified_names(self.tree.provider, value.func):
            value = value.args[0].value
        return bool(qualified_names(self.tree.provider, value) & AUTOCASTS)
