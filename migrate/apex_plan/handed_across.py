"""The GradScaler made where ``amp.initialize`` was and handed to the other file's training
function, where the two halves of apex amp are in two files and the scaler cannot be made at the
other file's top level: ``amp.initialize(..., opt_level=args.opt_level)`` in ``main()`` of
``train.py``, which then calls ``train_one_epoch(model, optimizer, loader)`` imported from
``engine.py``, where the loss is scaled.

A GradScaler made once when ``engine.py`` is imported knows nothing of ``args``: it would be an
O1 one whatever the level. So ``main()`` makes it as a one-file rewrite would (O2/O3 stopped at
run time, off for O0), and passes it on: ``train_one_epoch(..., scaler=scaler)``; the function
takes ``scaler: torch.amp.GradScaler``, and its autocast asks ``scaler.is_enabled()``.

Only where both files show every way the scaler travels (``scaler_parameters`` says so within the
scale half): the initialize half imports the function by name from that module (or the module,
calling ``engine.train_one_epoch(...)``), and calls it only from the function that initializes
(or the script's ``if __name__ == "__main__":``), after it; the scale half's functions using the
scaler are plain module-level ones reached only from those it imports (which its own file never
calls), and no other file of the project imports them (``migrate.half_partners`` checks that).
"""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Step
from migrate.apex_plan.scaler_options import constant_option
from migrate.apex_plan.initialize import InitializePlanning
from migrate.apex_plan.scaler_parameters import ScalerParameterPlanning
from migrate.apex_plan.several_initialize import halved
from migrate.apex_plan.syntax import body_through_withs
from migrate.apex_plan.vocabulary import InitializeSite, ScaleBounds, Setup
from migrate.tree_walk import descendants
from migrate.types import ImportChange


class HandedAcrossPlanning(Step):
    """Both halves' side of it: ``calls`` and ``plan_hand_across`` for the initialize half,
    ``receivers`` for the scale half."""

    def calls(self, inits: list[InitializeSite], others: list[cst.Call]) -> dict[str, list[cst.Call]] | None:
        """The initialize half's calls of the functions it imports from the scale half (by their
        name there), where a GradScaler made in place of ``inits`` (one, training) could be handed
        to them: the function holding it (or the script's ``if __name__ == "__main__":``) runs it
        on every path, and makes every such call (and reads apex's state, ``others``) after it.
        Only where the scaler cannot be made in the other module: an opt level, ``enabled=`` or a
        loss scale known at run time only. None where it cannot be handed."""
        imported = self.partner.scaler_import if self.partner is not None else None
        if imported is None or len(inits) != 1:
            return None
        init = inits[0]
        known = init.level is not None and init.enabled is None and all(constant_option(arg.split("=", 1)[1]) for arg in init.scaler_args)
        if init.inference or halved(init) or init.level == "O0" or known:
            return None  # a GradScaler made in the other module serves as well
        maker = self._runs_always(init.statement)
        if maker is None:
            return None
        made = self.tree.order[id(init.statement)]

        def after(node: cst.CSTNode) -> bool:
            return self.tree.inside(node, maker) and self.tree.order[id(self.tree.statement(node))] > made

        if not all(after(other) for other in others):
            return None
        found: dict[str, list[cst.Call]] = {}
        names, module = self._names_from(imported)
        wanted = {*names, module} - {None}
        if wanted & set(self.tree.assigned):
            return None
        # every read of those names, in one walk (not the imports' own names, nor attributes or keywords)
        imports = {id(name) for node in descendants(self.tree.module) if isinstance(node, (cst.Import, cst.ImportFrom))
                   for name in descendants(node) if type(name) is cst.Name}
        read: dict[str, list[cst.Name]] = {}
        for node in descendants(self.tree.module):
            if type(node) is cst.Name and node.value in wanted and id(node) not in imports and not self._naming_only(node):
                read.setdefault(node.value, []).append(node)
        for local, name in names.items():
            uses = [self.tree.parent.get(id(node)) for node in read.get(local, [])]
            if any(not (isinstance(use, cst.Call) and nodes.code(use.func) == local and after(use)) for use in uses):
                return None  # handed on, stored, or called where the scaler is not made yet
            if uses:
                found[name] = uses
        if module is not None:  # `import engine`, then `engine.train_epoch(...)`: each use a call, made after it
            for node in read.get(module, []):
                attribute = self.tree.parent.get(id(node))
                call = self.tree.parent.get(id(attribute))
                if not (isinstance(attribute, cst.Attribute) and attribute.value is node and isinstance(call, cst.Call)
                        and call.func is attribute and after(call)):
                    return None
                found.setdefault(attribute.attr.value, []).append(call)
        return found or None

    def _runs_always(self, statement: cst.CSTNode) -> cst.FunctionDef | cst.If | None:
        """The function whose body runs ``statement`` whenever it gets that far (through ``with``
        blocks), or the script's ``if __name__ == "__main__":`` holding it; None otherwise."""
        holder = body_through_withs(self.tree.parent, statement)
        if isinstance(holder, cst.FunctionDef):
            return holder
        guard = self.tree.parent.get(id(self.tree.parent.get(id(statement))))
        return guard if nodes.is_main_guard(guard) and isinstance(self.tree.parent.get(id(guard)), cst.Module) else None

    def _names_from(self, imported: ImportChange) -> tuple[dict[str, str], str | None]:
        """The names this file imports from the scale half's module (``from engine import
        train_one_epoch as train``): each local name, with its name there; and the local name of
        the module itself (``import engine``, ``import engine as loop``, ``from pkg import
        engine``), where one names it (the last one bound)."""
        names: dict[str, str] = {}
        module = None
        package, _, last = imported.module.rpartition(".")
        for node in descendants(self.tree.module):
            if isinstance(node, cst.Import) and not imported.relative:
                for alias in node.names:
                    if nodes.code(alias.name) == imported.module and (alias.asname is not None or not package):
                        module = nodes.code(alias.asname.name) if alias.asname is not None else last
            elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar) and len(node.relative) == imported.relative:
                source = nodes.code(node.module) if node.module is not None else ""
                for alias in node.names:
                    name = nodes.code(alias.name)
                    local = nodes.code(alias.asname.name) if alias.asname is not None else name
                    if source == imported.module:
                        names[local] = name
                    elif source == package and name == last:
                        module = local
        return names, module

    def _naming_only(self, node: cst.Name) -> bool:
        """A name that reads nothing: another object's attribute, a keyword."""
        holder = self.tree.parent.get(id(node))
        return (isinstance(holder, cst.Attribute) and holder.attr is node) or (isinstance(holder, cst.Arg) and holder.keyword is node)

    def made_here(self, init: InitializeSite) -> Setup:
        """The initialize half's scaler: made here, a local of the function initializing."""
        scaler = InitializePlanning(self.context).free_scaler_name()
        return Setup(level=init.level, o0=False, scaler=scaler, scope="local", may_be_disabled=True,
                     level_guarded=init.guard_level, model_codes=frozenset(init.model_codes), scale_bounds=init.scale_bounds)

    def plan_hand_across(self, init: InitializeSite, calls: dict[str, list[cst.Call]]) -> None:
        """The GradScaler made where ``init`` was, passed at each call of the functions the scale
        half has take it (its ``receives``)."""
        taking = {name: found for name, found in calls.items() if name in self.partner.facts.receives}
        self.draft.notes.append(f"`amp.scale_loss` is in {self.partner.file} (line {self.partner.line}), migrated with "
                                f"this file: {', '.join(f'`{name}`' for name in taking)} takes the GradScaler made here")
        self.draft.partner_unsafe += [f"{self.partner.file}: {reason}" for reason in self.partner.facts.reasons]
        self.draft.half_facts = {"level": init.level, "hands_to": tuple(calls)}
        if init.scale_bounds != ScaleBounds():
            self.draft.unsafe.append(f"`min_loss_scale`/`max_loss_scale` bound apex's scale here; {self.partner.file}, "
                                     "which updates the GradScaler, does not keep them")
        InitializePlanning(self.context).plan_initialize(init, None)
        parameters = ScalerParameterPlanning(self.context)
        for name, found in taking.items():
            for call in found:
                parameters.pass_scaler(call, name)

    def receivers(self, sites: list[cst.CSTNode], imported_elsewhere: frozenset[str]) -> tuple[cst.FunctionDef, ...] | None:
        """The scale half's functions taking the GradScaler its initialize half hands on (the
        partner's ``hands_to``), or None where it cannot be taken that way."""
        facts = self.partner.facts if self.partner is not None else None
        if facts is None or not facts.hands_to or facts.level == "O0":
            return None
        found = ScalerParameterPlanning(self.context).received(frozenset(facts.hands_to), sites)
        if found is None or any(f.name.value in imported_elsewhere and f.name.value not in facts.hands_to for f in found):
            return None  # a function between them that another file calls without it
        return found
