"""The file's references to apex.amp, sorted once into ``Sites``: the calls of its API (also on
what received the module, or on ``self.amp`` standing in for it), the module handed on, the
statements that only touch apex's module, and what keeps the file from being planned."""
from __future__ import annotations

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Sites
from migrate.apex_plan.draft import Draft
from migrate.apex_plan.tree import FileTree
from migrate.apex_plan.vocabulary import CAST_API, CORE
from migrate.flow.receivers import parameter_taking
from migrate.names import imported_as, qualified_names
from migrate.native_casts import registered_natively
from migrate.tree_walk import descendants, walk
from migrate.unread import Unparsed

_ABOUT_THE_MODULE = frozenset({"__path__", "__file__", "__version__"})
_LOGGERS = frozenset({"print", "info", "debug", "warning", "warn", "log"})


def classify(tree: FileTree, draft: Draft) -> Sites:
    """The file's apex.amp sites; what they change that no rewrite can keep goes to ``draft``."""
    classifier = _Classifier(tree, draft)
    classifier.classify()
    sites = classifier.sites
    sites.ids = frozenset(id(call) for call in sites.all_calls())
    sites.scale_loss_statements = frozenset(id(tree.statement(call)) for call in sites.calls["scale_loss"])
    return sites


class _Classifier:
    """Fills ``sites`` in one pass over the references."""

    def __init__(self, tree: FileTree, draft: Draft) -> None:
        self.tree, self.draft, self.sites = tree, draft, Sites()

    def classify(self) -> None:
        for node, name in self.tree.refs:
            attr = name[len("apex.amp.") :] if name != "apex.amp" else ""
            parent = self.tree.parent.get(id(node))
            if attr in CORE and isinstance(parent, cst.Call) and parent.func is node:
                self.sites.calls[attr].append(parent)
            elif attr.split(".")[0] in CAST_API:
                self._cast_edit(attr, node)
            elif attr == "__dict__" and self.tree.in_test(node):
                self._probe(node)  # `if "state_dict" in amp.__dict__:`: GradScaler has both methods
            elif attr == "":
                if self.tree.in_test(node):
                    self._availability_assert(node)
                    continue
                alias = self._escape(node)
                if alias is None:
                    self.sites.blockers.append((node, "`amp` is passed on or stored here, so its use elsewhere cannot be seen"))
                else:
                    self.sites.escapes.append((node, alias))
            elif not self._scale_poke(attr, node) and not self._scale_read(attr, node) and not self._module_read(attr, node):
                self.sites.blockers.append((node, f"`amp.{attr}` (apex internals or the legacy handle) depends on apex's state"))
        self._find_stand_ins()
        if self.sites.escapes:
            self._find_alias_sites({alias for _, alias in self.sites.escapes})
        self._find_scalers_calling_apex()

    def _find_scalers_calling_apex(self) -> None:
        """timm's ``ApexScaler()`` calls ``amp.scale_loss`` itself, unseen: with ``initialize``
        rewritten away, that call raises. Its calls, and the name timm's ``NativeScaler`` has
        here, go to ``timm_scalers``."""
        if "ApexScaler" not in self.tree.module.code:
            return
        local = imported_as(self.tree.module, "timm", ("ApexScaler", "NativeScaler"))  # timm's class -> its name here
        if "ApexScaler" not in local:
            return
        self.sites.timm_scalers = [node for node in descendants(self.tree.module)
                                   if type(node) is cst.Call and isinstance(node.func, cst.Name) and node.func.value == local["ApexScaler"]]
        self.sites.timm_native = local.get("NativeScaler")

    def _cast_edit(self, attr: str, node: cst.CSTNode) -> None:
        """``amp.register_*`` and ``amp.lists`` edits are rewritten on their own (AMP007); where
        native autocast would not make the cast they ask for, autocast computes differently. One
        reason names every line of the same call (``register_float_function`` three times)."""
        call = attr.split(".")[0]
        uses = [other for other, name in self.tree.refs if name.startswith("apex.amp.")
                and name[len("apex.amp.") :].split(".")[0] == call and self._changes_casts(name[len("apex.amp.") :], other)]
        if not uses or uses[0] is not node:
            return  # not a change native autocast misses, or named by the reason at the call's first use
        lines = sorted({self.tree.line(use) for use in uses})
        self.draft.unsafe.append(_cast_lists(f"amp.{call}", f"line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))}") +
                                 ": native autocast does not read them, so the ops they name run in autocast's own precision")

    def _changes_casts(self, attr: str, node: cst.CSTNode) -> bool:
        """Whether this use of apex's cast API asks for a cast native autocast would not make: a
        registration of what autocast does not already cast that way, or an edit of ``amp.lists``
        (cast decorators and ``disable_casts`` have exact native forms)."""
        parent = self.tree.parent.get(id(node))
        if attr.startswith("register_") and isinstance(parent, cst.Call) and parent.func is node:
            module = nodes.argument(parent, 0, "module")
            name = nodes.literal_string(getattr(nodes.argument(parent, 1, "name"), "value", None))
            modules = qualified_names(self.tree.provider, module.value) if module is not None else set()
            return not registered_natively(f"apex.amp.{attr}", modules, name)
        return attr.startswith("lists")

    def _escape(self, node: cst.CSTNode) -> str | None:
        """``model.amp = amp`` or ``f(amp=amp)``, also as ``amp if fp16 else None``: the name the
        module is handed on under (the GradScaler takes its place, so ``None`` still means "off")."""
        parent = self.tree.parent.get(id(node))
        if isinstance(parent, cst.IfExp) and nodes.is_none(parent.orelse if parent.body is node else parent.body):
            node, parent = parent, self.tree.parent.get(id(parent))
        if isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1:
            target = parent.targets[0].target
            # `self.amp = amp` stays with its object; `args.amp = amp` goes wherever `args` goes,
            # other files included, which would keep handing the module to what expects a scaler
            owned = isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self"
            return target.attr.value if owned else None
        if isinstance(parent, cst.Arg) and parent.value is node:
            if parent.keyword is not None:
                return parent.keyword.value
            taken = parameter_taking(self.tree.module, self.tree.parent, parent)  # `train(model, amp)`: by position
            return taken[1] if taken is not None else None
        return None

    def _find_stand_ins(self) -> None:
        """``self.amp = amp`` where the file only ever calls apex's API on ``self.amp`` (or assigns
        it): the attribute is another name for the module, so its calls are the module's sites
        and the assignment goes."""
        uses: dict[str, list[cst.Attribute]] = {}

        class _Uses(cst.CSTVisitor):
            def visit_Attribute(self, node: cst.Attribute) -> None:
                if isinstance(node.value, cst.Name) and node.value.value == "self":
                    uses.setdefault(node.attr.value, []).append(node)

        candidates = []
        for node, alias in self.sites.escapes:
            assign = self.tree.parent.get(id(node))
            if isinstance(assign, cst.Assign) and nodes.code(assign.targets[0].target) == f"self.{alias}":
                candidates.append((node, alias, assign))
        if not candidates:
            return
        walk(self.tree.module, _Uses())
        for node, alias, assign in candidates:
            calls, plain = [], True
            for use in uses.get(alias, []):
                parent = self.tree.parent.get(id(use))
                call = self.tree.parent.get(id(parent))
                if isinstance(parent, cst.Attribute) and parent.attr.value in CORE and isinstance(call, cst.Call) and call.func is parent:
                    calls.append((parent.attr.value, call))
                elif not self._assigned(use):
                    plain = False
            if not plain or not calls:
                continue
            others = [use for use in uses[alias] if self._assigned(use) and self.tree.statement(use) is not self.tree.statement(assign)]
            self.sites.stand_ins_assigned_once = self.sites.stand_ins_assigned_once and all(self._sets_none(use) for use in others)
            self.sites.escapes.remove((node, alias))
            statement = self.tree.statement(assign)
            self.sites.stand_in_assignments.append(statement)
            for kind, call in calls:
                self.sites.calls[kind].append(call)
                self.sites.stand_in_calls.add(id(call))

    def _sets_none(self, target: cst.CSTNode) -> bool:
        """Whether the assignment to ``target`` gives it ``None`` (``a.x, a.y = [None, None]`` too)."""
        statement = self.tree.statement(target)
        values = [small.value for small in getattr(statement, "body", ()) if isinstance(small, cst.Assign)]
        return len(values) == 1 and all(nodes.is_none(value) for value in (
            [e.value for e in values[0].elements] if isinstance(values[0], (cst.List, cst.Tuple)) else values))

    def _assigned(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is a target of an assignment (also inside a tuple of targets)."""
        parent = self.tree.parent.get(id(node))
        while isinstance(parent, (cst.Element, cst.Tuple, cst.List)):
            node, parent = parent, self.tree.parent.get(id(parent))
        return isinstance(parent, cst.AssignTarget) and parent.target is node

    def _find_alias_sites(self, aliases: set[str]) -> None:
        """``amp.scale_loss`` / ``amp.master_params`` called on what received the handed-on module:
        a parameter or an attribute of that name (``def run(..., amp=None)``, ``self.amp``)."""
        known = {id(call) for kind in CORE for call in self.sites.calls[kind]}
        for node in descendants(self.tree.module):
            func = node.func if type(node) is cst.Call else None
            if not isinstance(func, cst.Attribute) or id(node) in known:
                continue
            holder = func.value
            name = holder.value if isinstance(holder, cst.Name) else holder.attr.value if isinstance(holder, cst.Attribute) else None
            if name in aliases and func.attr.value == "initialize":
                # A GradScaler has no `initialize`: the receiver would call it on the scaler.
                self.sites.blockers.append((node, f"`{nodes.code(holder)}.initialize` is called on the handed-on module"))
            elif name in aliases and func.attr.value in ("scale_loss", "master_params"):
                self.sites.calls[func.attr.value].append(node)
                self.sites.alias_of[id(node)] = nodes.code(holder)

    def _scale_poke(self, attr: str, node: cst.CSTNode) -> bool:
        """``amp._amp_state.loss_scalers[0]._loss_scale = X``: the scale to start from, set by hand."""
        subscript = self.tree.parent.get(id(node))
        attribute = self.tree.parent.get(id(subscript))
        target = self.tree.parent.get(id(attribute))
        assign = self.tree.parent.get(id(target))
        if not (attr == "_amp_state.loss_scalers" and isinstance(subscript, cst.Subscript) and isinstance(attribute, cst.Attribute)
                and attribute.attr.value == "_loss_scale" and isinstance(target, cst.AssignTarget) and isinstance(assign, cst.Assign)
                and len(assign.targets) == 1 and nodes.is_pure(assign.value)):
            return False
        self.sites.scale_pokes.append((self.tree.statement(assign), assign.value, node))
        return True

    def _scale_read(self, attr: str, node: cst.CSTNode) -> bool:
        """``amp._amp_state.loss_scalers[0]._loss_scale`` read (or ``.loss_scale()`` called): the
        current loss scale of apex's one loss scaler."""
        subscript = self.tree.parent.get(id(node))
        attribute = self.tree.parent.get(id(subscript))
        if not (attr == "_amp_state.loss_scalers" and isinstance(subscript, cst.Subscript) and subscript.value is node
                and len(subscript.slice) == 1 and isinstance(subscript.slice[0].slice, cst.Index)
                and nodes.code(subscript.slice[0].slice.value) == "0"
                and isinstance(attribute, cst.Attribute) and attribute.value is subscript):
            return False
        read: cst.BaseExpression = attribute
        if attribute.attr.value == "loss_scale":
            read = self.tree.parent.get(id(attribute))
            if not (isinstance(read, cst.Call) and read.func is attribute and not read.args):
                return False
        elif attribute.attr.value != "_loss_scale" or self._assigned(attribute):
            return False
        self.sites.scale_reads.append((read, node))
        return True

    def _probe(self, node: cst.CSTNode) -> None:
        """``if "state_dict" in amp.__dict__:`` (no ``else``): asks whether apex is new enough to
        save its state; GradScaler always is, so the ``if`` gives way to its body."""
        comparison = self.tree.parent.get(id(self.tree.parent.get(id(node))))
        branch = self.tree.parent.get(id(comparison))
        probed = nodes.literal_string(getattr(comparison, "left", None))
        if probed in ("state_dict", "load_state_dict") and isinstance(branch, cst.If) and branch.test is comparison and branch.orelse is None:
            self.sites.probes.append((branch, node))
        else:
            self.sites.blockers.append((node, "`amp.__dict__` is probed here: apex's own attributes have no native counterpart"))

    def _availability_assert(self, node: cst.CSTNode) -> None:
        """``assert amp is not None, "amp not installed!"`` (under ``if level != "O0":``, the ``if``
        holding nothing else): it goes with apex, as native torch.amp needs no install (planned
        later, with the rest; a run without apex that stopped there now goes on)."""
        test = self.tree.parent.get(id(node))
        if isinstance(test, cst.Comparison) and test.left is node and len(test.comparisons) == 1 and isinstance(
                test.comparisons[0].operator, cst.IsNot) and nodes.code(test.comparisons[0].comparator) == "None":
            checked = self.tree.parent.get(id(test))
        else:
            test, checked = node, self.tree.parent.get(id(node))
        statement = self.tree.parent.get(id(checked))
        if not (isinstance(checked, cst.Assert) and checked.test is test and isinstance(statement, cst.SimpleStatementLine)
                and len(statement.body) == 1):
            return
        block = self.tree.parent.get(id(statement))
        owner = self.tree.parent.get(id(block))
        if (isinstance(owner, cst.If) and owner.orelse is None and isinstance(block, cst.IndentedBlock)
                and len(block.body) == 1 and nodes.is_pure(owner.test)):
            statement = owner  # `if level != "O0":` around nothing else goes too
        self.sites.module_reads.append(statement)
        self.draft.notes.append("behaviour change: `assert amp is not None` stopped runs where apex was not installed; "
                                "native torch.amp needs no install, so those runs now go on")

    def _module_read(self, attr: str, node: cst.CSTNode) -> bool:
        """Whether ``amp.<attr>`` at ``node`` sits in a statement that can simply go (planned later)."""
        statement = self.tree.statement(node)
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
        if attr == "init":
            call = self.tree.parent.get(id(node))
            if not (isinstance(call, cst.Call) and call.func is node):
                return False
            if isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
                handle = small.targets[0].target.value
                if self._name_count(handle) > 1:
                    return False  # `amp_handle.scale_loss(...)`: the legacy API is in use
            elif not (isinstance(small, cst.Expr) and small.value is call):
                return False
            self.sites.legacy_handles.append(call)
        elif attr.split(".")[0] in _ABOUT_THE_MODULE:  # `amp.__version__.VERSION` too
            logged = small.value if isinstance(small, cst.Expr) else None
            func = getattr(logged, "func", None)
            name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
            if name not in _LOGGERS:
                return False
            self.draft.notes.append("a log line naming apex's module goes with it")
        else:
            return False
        self.sites.module_reads.append(statement)
        return True

    def _name_count(self, name: str) -> int:
        found = 0

        class _Count(cst.CSTVisitor):
            def visit_Name(self, node: cst.Name) -> None:
                nonlocal found
                found += node.value == name

            def visit_Unparsed(self, node: Unparsed) -> None:  # a definition kept as text
                nonlocal found
                found += node.uses(name)

        walk(self.tree.module, _Count())
        return found


def _cast_lists(call: str, lines: str) -> str:
    """The start of the reason for apex cast-list edits through ``call`` at ``lines`` (empty: any)."""
    return f"the file changes apex's cast lists (`{call}`, {lines}" + (")" if lines else "")
