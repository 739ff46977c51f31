"""The disabled GradScaler that stands in until the code that makes it has run: made in
``__init__`` for a ``self.scaler`` a later method makes (a class attribute where the class has no
``__init__`` of its own), at the top of the function for one a block makes (``if epoch ==
start:``), or at module level, before the block that makes it."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Step
from migrate.apex_plan.vocabulary import CORE, INITIALIZE, InitializeSite, normal
from migrate.step_model.vocabulary import joined_by
from migrate.tree_walk import walk


class StandInPlanning(Step):
    """The disabled GradScaler that stands in until the code that makes it has run.

    It reads the ``FileTree``, the classified sites and the frozen ``Setup``, and writes to the ``Draft``.
    """

    def until(self, init: InitializeSite) -> str:
        function = self.tree.function(init.statement)
        return f"until `{function.name.value}()` runs" if function is not None else "until the block below that creates it runs"

    def plan_module_stand_in(self, init: InitializeSite) -> None:
        """A disabled scaler at module level, after the imports, until the block holding ``init``
        has run; before that block where the script imports more further down (after such an
        import, it would undo the scaler the block made)."""
        line = f'{self.setup.scaler} = torch.amp.GradScaler("cuda", enabled=False)'
        until = f"# {self.until(init)}"
        fits = len(line) + 2 + len(until) <= self.tree.line_limit
        top = init.statement
        while not isinstance(self.tree.parent.get(id(top)), cst.Module):
            top = self.tree.parent[id(top)]
        body, anchor = list(self.tree.module.body), self.tree.import_anchor()
        if anchor is not None and body.index(top) < body.index(anchor):
            self.draft.insert_before.setdefault(id(top), (top, []))[1].extend([f"{line}  {until}"] if fits else [until, line])
        else:
            self.draft.after_imports.append(f"{line}  {until}\n" if fits else f"{until}\n{line}\n")

    def _only_stand_ins_set_beside(self, init: InitializeSite) -> bool:
        """Whether the scaler is only ever used through ``self.amp``, a stand-in for the module that
        is given the module nowhere but just before ``init``, in its block (elsewhere at most
        ``None``): wherever ``init`` has not run, the file failed on ``self.amp`` exactly as its
        rewrite fails on the scaler."""
        block = self.tree.parent.get(id(init.statement))
        body = list(getattr(block, "body", ()))
        used = [call for kind in CORE if kind != "initialize" for call in self.sites.calls[kind]]
        return (
            bool(self.sites.stand_in_assignments) and not self.sites.escapes and self.sites.stand_ins_assigned_once
            and all(id(call) in self.sites.stand_in_calls for call in used)
            and all(statement in body and body.index(statement) < body.index(init.statement) for statement in self.sites.stand_in_assignments)
        )

    def plan_local_default(self, init: InitializeSite) -> None:
        """A disabled local scaler made at the top of the function, standing in until the block
        that holds ``initialize`` (``if epoch == start:`` in the epoch loop) has run."""
        function = self.tree.function(init.statement)
        anchor = init.statement
        while self.tree.parent.get(id(self.tree.parent.get(id(anchor)))) is not function:
            anchor = self.tree.parent[id(anchor)]
        line = f'{self.setup.scaler} = torch.amp.GradScaler("cuda", enabled=False)  # until the block that creates it runs'
        self.draft.insert_before.setdefault(id(anchor), (anchor, []))[1].append(line)
        self.draft.kind(anchor, INITIALIZE, "the scaler that replaces `amp.initialize` must exist wherever it is used",
                   "Create it disabled before the block that makes it")
        if self._scaled_only_under_its_flag(init):
            self.draft.notes.append("before the block that creates it runs, apex raised at `amp.scale_loss` "
                                    "(not initialized); the disabled scaler trains in fp32 there")
        elif not self._flag_block_runs_first(init, anchor):
            self.draft.unsafe.append(
                "the scaler is created where `amp.initialize` ran, inside a block; before that block runs, a disabled "
                "one stands in and the step trains in fp32 (apex refused to scale a loss before `initialize`)"
            )

    def _scaled_only_under_its_flag(self, init: InitializeSite) -> bool:
        """Whether ``initialize`` is the file's only one, in an ``if flag:`` (``if args.fp16:``)
        that does not change its test, and each ``amp.scale_loss`` sits under a test of that flag
        (``if args.fp16 and use_apex:``). Where the flag is off, neither ran. Where it is on, a
        ``scale_loss`` before the block ran raised under apex (no other file initializes for
        this one: the planner refuses that): only runs that failed meet the disabled stand-in.
        Before the block apex cast nothing and stepped plainly, as the stand-in does."""
        block = self.tree.parent.get(id(init.statement))
        owner = self.tree.parent.get(id(block))
        if (len(self.sites.calls["initialize"]) != 1 or not isinstance(owner, cst.If) or owner.body is not block
                or not nodes.is_pure(owner.test) or self.tree.changes_its_test(owner)):
            return False
        flag = normal(nodes.code(owner.test))
        return all(self._under_test(site, flag) for site in self.sites.calls["scale_loss"])

    def _under_test(self, node: cst.CSTNode, flag: str) -> bool:
        """Whether ``node`` sits in the body of an ``if`` testing ``flag`` (alone or joined by ``and``)."""
        child, parent = node, self.tree.parent.get(id(node))
        while parent is not None:
            if isinstance(parent, cst.If) and child is parent.body and flag in {normal(part) for part in joined_by(parent.test, cst.And)}:
                return True
            child, parent = parent, self.tree.parent.get(id(parent))
        return False

    def _flag_block_runs_first(self, init: InitializeSite, anchor: cst.CSTNode) -> bool:
        """``if use_amp: opt_level = "O1"; amp.initialize(...)`` at the top of the function,
        before every statement that scales a loss, each scaling under a test of that flag: where
        the flag is on the scaler exists first; where off, nothing scales and the disabled one
        only steps and leaves autocast off, as the original ran."""
        function = self.tree.function(init.statement)
        if self.setup.guard is not anchor or function is None:
            return False
        body, flags = list(function.body.body), self.setup.guard_tests
        for site in self.sites.calls["scale_loss"]:
            top, tested = site, False
            while self.tree.parent.get(id(top)) is not function.body:
                parent = self.tree.parent.get(id(top))
                if parent is None or isinstance(parent, (cst.FunctionDef, cst.Lambda)):
                    return False  # in another function: it may run before the block
                tested |= isinstance(parent, cst.If) and top is parent.body and nodes.code(parent.test) in flags
                if isinstance(parent, cst.Else):  # `if not flag: loss.backward()` / `else:` scaled
                    test = nodes.code(self.tree.parent[id(parent)].test)
                    tested |= test.startswith("not ") and test[4:] in flags
                top = parent
            if not tested or body.index(top) <= body.index(anchor):
                return False
        return True

    def default_in_init(self, owner: cst.ClassDef, function: cst.FunctionDef, init: InitializeSite) -> bool:
        """Whether a disabled ``self.<scaler>`` can be made in ``__init__``, standing in until
        ``function`` (which makes the scaler) runs; where not, why that is unsafe, if it is."""
        if self._init_anchor(owner) is not None:
            return True
        if not self._only_stand_ins_set_beside(init):  # else the file failed on `self.amp` there, as the rewrite does
            self.draft.unsafe.append(
                f"the scaler is created in `{function.name.value}()`: methods that use it fail where that has not run "
                "(apex trained in fp32 there)"
            )
        return False

    def init_can_stand_in(self, owner: cst.ClassDef) -> bool:
        """Whether ``owner``'s own ``__init__`` can make a disabled scaler that stands in."""
        return self._init_anchor(owner) is not None

    def class_stand_in(self, owner: cst.ClassDef, init: InitializeSite) -> bool:
        """Whether a disabled scaler made as a class attribute stands in, where ``owner`` has no
        ``__init__`` of its own (it inherits one from another file): not where the file failed on
        ``self.amp`` before ``init`` ran, as the rewrite fails on the scaler (nothing needed)."""
        return not self.init_can_stand_in(owner) and not self._only_stand_ins_set_beside(init) and any(
            not nodes.is_docstring(statement) for statement in owner.body.body)

    def plan_class_default(self, init: InitializeSite) -> None:
        """The disabled scaler as a class attribute (``scaler = torch.amp.GradScaler("cuda",
        enabled=False)`` in the class body): ``self.scaler`` reads it until the method that makes
        the instance's own has run. A disabled scaler keeps no state, so instances may share it."""
        owner = self.tree.owner_class(self.tree.function(init.statement))
        anchor = next(statement for statement in owner.body.body if not nodes.is_docstring(statement))
        attribute = self.setup.scaler.split(".", 1)[1]
        line = f'{attribute} = torch.amp.GradScaler("cuda", enabled=False)  # {self.until(init)}'
        self.draft.insert_before.setdefault(id(anchor), (anchor, []))[1].append(line)
        self.draft.kind(anchor, INITIALIZE, "the scaler that replaces `amp.initialize` must exist from construction on",
                        "Create it disabled as a class attribute")

    def plan_default_in_init(self, init: InitializeSite) -> None:
        """The disabled ``self.<scaler>`` made in ``__init__`` (see ``_default_in_init``)."""
        function = self.tree.function(init.statement)
        anchor = self._init_anchor(self.tree.owner_class(function))
        line = f'{self.setup.scaler} = torch.amp.GradScaler("cuda", enabled=False)  # until `{function.name.value}()` runs'
        self.draft.insert_before.setdefault(id(anchor), (anchor, []))[1].append(line)
        self.draft.kind(anchor, INITIALIZE, "the scaler that replaces `amp.initialize` must exist from construction on",
                   "Create it disabled in `__init__`")

    @staticmethod
    def _init_anchor(owner: cst.ClassDef) -> cst.BaseStatement | None:
        """The statement of ``__init__`` to put a default before: after the docstring and
        ``super().__init__``, also where that comes after other lines (``nn.Module`` needs it
        before attributes that are modules; a person puts the rest after it too)."""
        init = next((s for s in owner.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        if init is None or not isinstance(init.body, cst.IndentedBlock):
            return None
        body = list(init.body.body)

        def parent_init(statement: cst.BaseStatement) -> bool:
            small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
            return isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and "__init__" in nodes.code(small.value.func)

        later = [index for index, statement in enumerate(body) if parent_init(statement)]
        if later and later[-1] + 1 < len(body):
            return body[later[-1] + 1]
        for index, statement in enumerate(body):
            if not ((index == 0 and nodes.is_docstring(statement)) or parent_init(statement)):
                return statement
        return None

    @staticmethod
    def runs_at_construction(function: cst.FunctionDef, owner: cst.ClassDef) -> bool:
        """``__init__`` itself, or a method ``__init__`` always calls (``self._setup_amp()`` on a line
        of its own body, not under a test: ``if params.amp >= 0: self.init_amp()`` leaves the
        scaler unmade on the other runs)."""
        if function.name.value == "__init__":
            return True
        init = next((s for s in owner.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        called = False

        class _Find(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> None:
                nonlocal called
                func = node.func
                called = called or (isinstance(func, cst.Attribute) and func.attr.value == function.name.value
                                    and isinstance(func.value, cst.Name) and func.value.value == "self")

        if init is not None and isinstance(init.body, cst.IndentedBlock):
            for statement in init.body.body:
                if isinstance(statement, cst.SimpleStatementLine):
                    walk(statement, _Find())
        return called
