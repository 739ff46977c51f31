"""Models readied for inference by apex O3 whose ``forward`` is never called: ``.half()`` is all apex did.

``waveglow, _ = amp.initialize(waveglow, [], opt_level="O3")`` (a vocoder's inference script)
casts the model to float16 and replaces its ``forward`` with one that casts the inputs to
float16 and the outputs to float32; it also makes ``state_dict()`` return float32 tensors.
``.half()`` does the first only. Where the model is then only used through methods that never
reach ``forward`` (``waveglow.infer(mel)``, or ``Denoiser(waveglow)``, which reads
``waveglow.upsample.weight.dtype`` and calls ``waveglow.infer``), the two run the same, and the
rewrite to ``waveglow = waveglow.half()`` is safe.

Each such ``amp.initialize`` (O3, no optimizers, no ``keep_batchnorm_fp32``, no ``enabled``, its
result assigned back to the model's name) is found with ``ast``. The model must be the project's
(made by a class of the project, loaded by ``torch.load``, or returned by its own method: the
methods it is read through are then those the project defines), and every read of the name after
it, in its scope, must be one of: a method of the project whose every definition uses ``self``
only through attributes other than ``forward``, ``__call__`` and ``state_dict`` (and calls only
such methods of ``self``); ``eval()``, ``cuda()`` and the like as a statement of their own;
``parameters()``; a submodule (``waveglow.upsample``); or an argument of a function or class of
the file or of a file it imports whose parameter is used in the same ways. Anything else (the
model called, handed to a function not found, returned, stored, read by a nested function, the
call inside a loop) and the ``initialize`` is not counted: its rewrite stays unsafe.

The model may be kept on an instance (``self.waveglow, _ = amp.initialize(self.waveglow, [], ...)``
in a method of a class): then every read of an attribute of that name in the project must be
``self.waveglow`` in a method of that class, used in the same ways (not read by another file, by
another object's attribute, by name through ``getattr``, or in a nested function).
"""
from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

from migrate import quiet
from migrate.files import project_root, project_trees_saying
from migrate.forward_callers import own_nodes
from migrate.module_paths import project_imports

__all__ = ["SETTING", "elsewhere"]

SETTING = "apex-o3-forwardless"  # lines of such `amp.initialize` calls in a file (not a user setting)

_REACHES_FORWARD = frozenset({"forward", "__call__", "_call_impl", "_wrapped_call_impl", "state_dict", "modules", "named_modules"})
_RETURNS_ITSELF = frozenset({"eval", "train", "cuda", "cpu", "half", "float", "to", "requires_grad_", "zero_grad"})
_HARMLESS = frozenset({"parameters", "named_parameters", "buffers", "named_buffers"})
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def elsewhere(texts: Mapping[Path, str]) -> dict[Path, tuple[int, ...]]:
    """For each ``.py`` file of ``texts`` with an O3 inference ``amp.initialize``, the lines of those
    whose model's ``forward`` is never reached afterwards (see the module's docstring)."""
    found = {}
    for path, text in texts.items():
        if path.suffix != ".py" or "O3" not in text or "initialize" not in text:
            continue
        tree = quiet.parse_or_none(text)
        if tree is not None and (lines := tuple(_forwardless_lines(path, tree))):
            found[path] = lines
    return found


def _forwardless_lines(path: Path, tree: ast.Module) -> Iterator[int]:
    parents = _parents(tree)
    reader = _Reader(path, tree, parents)
    for node in ast.walk(tree):
        model = _halved_model(node, parents)
        if model is None:
            continue
        scope, inside_loop = _scope_of(node, parents)
        if inside_loop or not reader.made_by_the_project(scope, model, node.lineno):
            continue
        if "." in model:
            if reader.attribute_reads_are_forwardless(scope, model, node.end_lineno):
                yield node.lineno
        elif reader.reads_are_forwardless(scope, model, node.end_lineno):
            yield node.lineno


def _halved_model(call: ast.AST, parents: dict) -> str | None:
    """The model where ``call`` is ``model = amp.initialize(model, [], opt_level="O3")`` (or
    ``model, _ = ...``) with no option that changes more than its weights' type: its name, or
    ``self.name`` for an attribute of the instance a method is given."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "initialize"
            and ast.unparse(call.func.value).split(".")[-1] in ("amp", "apex_amp")):
        return None
    given = {keyword.arg: keyword.value for keyword in call.keywords}
    if None in given or len(call.args) > 2 or any(isinstance(arg, ast.Starred) for arg in call.args):
        return None
    models = call.args[0] if call.args else given.get("models")
    optimizers = call.args[1] if len(call.args) > 1 else given.get("optimizers")
    level = given.get("opt_level")
    if not ((isinstance(models, ast.Name) or _instance_attribute(models)) and isinstance(level, ast.Constant)
            and level.value == "O3"):
        return None
    if optimizers is not None and not (isinstance(optimizers, (ast.List, ast.Tuple)) and not optimizers.elts
                                       or isinstance(optimizers, ast.Constant) and optimizers.value is None):
        return None
    if any(name not in ("opt_level", "verbosity", "loss_scale", "cast_model_outputs", "models", "optimizers")
           and not (name in ("keep_batchnorm_fp32", "enabled") and isinstance(value, ast.Constant)
                    and value.value in ((None, False) if name == "keep_batchnorm_fp32" else (True,)))
           for name, value in given.items()):
        return None
    statement = parents.get(id(call))
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
        return None
    target = statement.targets[0]
    if optimizers is not None and not (isinstance(optimizers, ast.Constant) and optimizers.value is None):
        # `model, _ = ...(model, [])`: apex hands back the models and the (empty) optimizers
        if not (isinstance(target, ast.Tuple) and len(target.elts) == 2 and isinstance(target.elts[1], ast.Name)
                and target.elts[1].id == "_"):
            return None
        target = target.elts[0]
    model = ast.unparse(models)
    return model if isinstance(target, (ast.Name, ast.Attribute)) and ast.unparse(target) == model else None


def _instance_attribute(node: ast.AST) -> bool:
    """``node`` is ``self.name``: an attribute of a plain name."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)


def _scope_of(node: ast.AST, parents: dict) -> tuple[ast.AST, bool]:
    """The function (or module) holding ``node``, and whether a loop of it holds ``node``."""
    inside_loop = False
    while (node := parents.get(id(node))) is not None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            return node, inside_loop
        if isinstance(node, _SCOPES):
            return node, True  # a class body or a lambda: not followed
        inside_loop = inside_loop or isinstance(node, _LOOPS)
    return node, inside_loop


class _Reader:
    """Reads the uses of a model, and what the methods and functions it is handed do with it."""

    def __init__(self, path: Path, tree: ast.Module, parents: dict) -> None:
        self.path, self.tree, self.parents = path, tree, parents
        self._methods: dict[str, bool] = {}  # method name -> no definition reaches `forward`
        self._found: dict[str, list[ast.FunctionDef]] = {}  # method name -> its definitions in the project

    def made_by_the_project(self, scope: ast.AST, name: str, before: int) -> bool:
        """Each value ``name`` is given in ``scope`` before line ``before`` is an instance of a class
        of the project, a checkpoint's (``torch.load(path)["model"]``: its classes are the
        project's), or what one of its own methods returns (``model.remove_weightnorm(model)``): so
        the methods it is read through are those the project defines, not another package's."""
        values = [node.value for node in own_nodes(scope) if isinstance(node, ast.Assign) and node.lineno < before
                  and any(isinstance(target, (ast.Name, ast.Attribute)) and ast.unparse(target) == name
                          for target in node.targets)]
        return bool(values) and all(self._made_by_the_project(value, name) for value in values)

    def _made_by_the_project(self, value: ast.AST, name: str) -> bool:
        while isinstance(value, ast.Subscript):
            value = value.value
        if not isinstance(value, ast.Call):
            return False
        if isinstance(value.func, ast.Name):
            return self._definition(value.func.id, classes_only=True) is not None
        return isinstance(value.func, ast.Attribute) and (
            ast.unparse(value.func) == "torch.load" or ast.unparse(value.func.value) == name)

    def reads_are_forwardless(self, scope: ast.AST, name: str, after: int) -> bool:
        for node in own_nodes(scope):
            if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
                return False
            if isinstance(node, _SCOPES) and node is not scope and any(
                    isinstance(inner, ast.Name) and inner.id == name for inner in ast.walk(node)):
                return False  # a nested function may read it at any time
            if isinstance(node, ast.Name) and node.id == name and node.lineno > after:
                if not isinstance(node.ctx, ast.Load) or not self._forwardless_read(node, self.parents):
                    return False
        return True

    def attribute_reads_are_forwardless(self, method: ast.AST, model: str, after: int) -> bool:
        """``model`` is ``self.name`` in ``method`` of a class, and every read of an attribute
        ``name`` in the project is ``self.name`` in a method of that class (not in a function or
        lambda nested in it) that does not reach the model's ``forward``; those in ``method``
        before line ``after`` read it before it was cast."""
        owner, attribute = model.split(".")
        cls = self.parents.get(id(method))
        if not (isinstance(method, ast.FunctionDef) and isinstance(cls, ast.ClassDef) and method.args.args
                and method.args.args[0].arg == owner):
            return False
        others = (tree for path, tree in project_trees_saying(project_root(self.path), f".{attribute}".encode())
                  if path.resolve() != self.path.resolve())
        if any(isinstance(node, ast.Attribute) and node.attr == attribute for tree in others for node in ast.walk(tree)):
            return False  # the instance's model read from another file
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Constant) and node.value == attribute:
                return False  # `getattr(self, "vocoder")`: read by name
            if not (isinstance(node, ast.Attribute) and node.attr == attribute and isinstance(node.ctx, ast.Load)):
                continue
            function = _enclosing_function(node, self.parents)
            if function is method and node.lineno <= after:
                continue
            if not (self.parents.get(id(function)) is cls and function.args.args and isinstance(node.value, ast.Name)
                    and node.value.id == function.args.args[0].arg and self._forwardless_read(node, self.parents)):
                return False
        return True

    def _forwardless_read(self, node: ast.AST, parents: dict, own: bool = False) -> bool:
        """``node`` reads the model without reaching its ``forward``; ``own``: it is ``self`` in a
        method of the model's class, where a called attribute that is no method of the project is
        a submodule (or one of ``nn.Module``'s), whose ``forward`` is not apex's."""
        parent = parents.get(id(node))
        if isinstance(parent, ast.Attribute):
            call = parents.get(id(parent))
            if parent.attr in _REACHES_FORWARD:
                return False
            if not (isinstance(call, ast.Call) and call.func is parent):
                return True  # a submodule or a field: its own forward is not apex's
            if parent.attr in _RETURNS_ITSELF:
                return _result_dropped(call, parents)
            if parent.attr in _HARMLESS or self._method_is_forwardless(parent.attr):
                return True
            return own and not self._defined(parent.attr)
        if isinstance(parent, ast.keyword):
            call = parents.get(id(parent))
            return isinstance(call, ast.Call) and self._handed_forwardless(call, None, parent.arg)
        if isinstance(parent, ast.Call) and node in parent.args:
            return self._handed_forwardless(parent, parent.args.index(node), None)
        return False

    def _method_is_forwardless(self, method: str) -> bool:
        """``method`` is defined in a class of the project, and no definition reaches ``forward``."""
        if method not in self._methods:
            self._methods[method] = False  # a method calling itself is judged by the rest of its body
            definitions = self._definitions(method)
            self._methods[method] = bool(definitions) and all(self._self_forwardless(function) for function in definitions)
        return self._methods[method]

    def _defined(self, method: str) -> bool:
        return bool(self._definitions(method))

    def _definitions(self, method: str) -> list[ast.FunctionDef]:
        if method not in self._found:
            self._found[method] = [function for _, tree in project_trees_saying(project_root(self.path), f"def {method}(".encode())
                                   for owner in ast.walk(tree) if isinstance(owner, ast.ClassDef)
                                   for function in owner.body if isinstance(function, ast.FunctionDef) and function.name == method]
        return self._found[method]

    def _self_forwardless(self, function: ast.FunctionDef) -> bool:
        if not function.args.args:
            return False
        parents = _parents(function)
        own = function.args.args[0].arg
        return all(isinstance(node.ctx, ast.Load) and self._forwardless_read(node, parents, own=True) for node in ast.walk(function)
                   if isinstance(node, ast.Name) and node.id == own)

    def _handed_forwardless(self, call: ast.Call, index: int | None, keyword: str | None) -> bool:
        """``call`` (a function or class of this file, or imported from a file of the project)
        uses the parameter it receives at ``index`` (or as ``keyword``) without reaching ``forward``."""
        if not isinstance(call.func, ast.Name) or (index is not None and any(isinstance(arg, ast.Starred) for arg in call.args)):
            return False
        function = self._definition(call.func.id)
        if function is None:
            return False
        params = [arg.arg for arg in (*function.args.posonlyargs, *function.args.args)]
        if function.name == "__init__":
            params = params[1:]
        if keyword is None:
            if index >= len(params):
                return False
            keyword = params[index]
        elif keyword not in params + [arg.arg for arg in function.args.kwonlyargs]:
            return False
        parents = _parents(function)
        return not any(isinstance(node, (ast.Global, ast.Nonlocal, ast.Lambda, ast.FunctionDef)) and node is not function
                       for node in ast.walk(function)) and all(
            isinstance(node.ctx, ast.Load) and self._forwardless_read_in(node, parents) for node in ast.walk(function)
            if isinstance(node, ast.Name) and node.id == keyword)

    def _forwardless_read_in(self, node: ast.Name, parents: dict) -> bool:
        parent = parents.get(id(node))
        if isinstance(parent, (ast.keyword, ast.Call)) and not (isinstance(parent, ast.Call) and parent.func is node):
            return False  # handed on once more: not followed
        return self._forwardless_read(node, parents)

    def _definition(self, name: str, classes_only: bool = False) -> ast.FunctionDef | ast.ClassDef | None:
        """The function ``name`` names in this file (a class: its ``__init__``; with
        ``classes_only``, the class), defined here or imported from another file of the project."""
        trees = [self.tree] + [quiet.parse_or_none(file.read_text(encoding="utf-8", errors="replace"))
                               for _, file in project_imports(self.path, self.tree, {name})]
        for tree in trees:
            for node in (tree.body if tree is not None else ()):
                if isinstance(node, ast.FunctionDef) and node.name == name and not classes_only:
                    return node
                if isinstance(node, ast.ClassDef) and node.name == name:
                    return node if classes_only else next(
                        (item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"), None)
        return None


def _enclosing_function(node: ast.AST, parents: dict) -> ast.AST | None:
    """The function, lambda or class whose own code holds ``node``; None at module level."""
    while (node := parents.get(id(node))) is not None and not isinstance(node, _SCOPES):
        pass
    return node


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    """Each node's parent, by the node's id."""
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _result_dropped(call: ast.Call, parents: dict) -> bool:
    """``call`` (``model.cuda()``, ``model.cuda().eval()``) stands as a statement of its own: the
    model it returns is not kept under another name."""
    parent = parents.get(id(call))
    while isinstance(parent, ast.Attribute) and parent.attr in _RETURNS_ITSELF:
        call = parents.get(id(parent))
        if not (isinstance(call, ast.Call) and call.func is parent):
            return False
        parent = parents.get(id(call))
    return isinstance(parent, ast.Expr)
