"""Checkpoint helpers in another file, handed the GradScaler by the training files that call them.

A checkpoint utility (``utils.py``: ``save_checkpoint(...)`` putting ``amp.state_dict()`` beside
the optimizer's state, ``load_checkpoint(...)`` calling ``amp.load_state_dict``) holds neither
``amp.initialize`` nor ``amp.scale_loss``: its functions take the GradScaler as ``scaler=None``.
Rewritten alone that is unsafe (no caller passes one, so the scaler's state is never saved), and
the training files calling them stay on apex while it keeps apex's state (``scale_kept``).

Where every use of those functions in the project is a call from a file of this run that
initializes and scales its own losses, and the run migrates each such file (or from a script
that never runs with apex's state: it says nothing of apex, and no file saying apex imports it;
there apex's lines raised or did not run, as they do not with no scaler), each call passes its
GradScaler (``scaler=scaler``; ``CALLER_SETTING``) and the utility takes it without a doubt
(``KEEPER_SETTING``): the files are migrated together. Anything else (a call from a file not in
the run, the function handed on as a value, an import that may name another file of the same
name) leaves them as before. Finding the uses takes ``ast`` only; each file concerned is planned
once per round to know that the run migrates it.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from migrate import halves, quiet
from migrate.apex_kept import migrates
from migrate.apex_plan.vocabulary import HELPER_SCALER as KEYWORD
from migrate.apex_plan.vocabulary import STATE_CALLERS_KEPT as KEPT_SETTING
from migrate.apex_plan.vocabulary import STATE_CALLERS_PASS as KEEPER_SETTING
from migrate.apex_plan.vocabulary import STATE_HELPERS as CALLER_SETTING
from migrate.files import project_python_files, project_root
from migrate.module_paths import find_on_disk, is_module

__all__ = ["CALLER_SETTING", "KEEPER_SETTING", "KEPT_SETTING", "KEYWORD", "handed"]



def handed(texts: Mapping[Path, str], file_settings: Callable[[Path], dict], unsafe_fixes: bool
           ) -> tuple[dict[Path, frozenset[str]], dict[Path, tuple[tuple[str, str], ...]], dict[Path, tuple[str, ...]]]:
    """The utilities of ``texts`` whose functions' callers all pass the scaler (path -> the
    functions), and those callers (path -> each call's spelling and the utility's place); and the
    utilities whose callers, all in the run, include one it leaves on apex (path -> those callers'
    names: rewritten alone, the utility would stop keeping apex's state for them).
    ``file_settings(path)``: the settings a file of the run is planned with."""
    by_real = {path.resolve(): path for path in texts}
    keepers: dict[Path, tuple[frozenset[str], dict[Path, frozenset[str]]]] = {}
    for path, text in texts.items():
        if halves.find_state_keeper(path, text) is None or path.name == "__init__.py":
            continue
        functions = _state_functions(text)
        callers = _callers(path.resolve(), functions) if functions else None
        apart = {caller for caller in callers or () if _never_on_apex(caller, texts.values())}
        if callers and len(apart) < len(callers) and all(caller in by_real or caller in apart for caller in callers):
            keepers[path] = (functions, {by_real[caller]: spelled for caller, spelled in callers.items() if caller not in apart})
    left_on_apex: dict[Path, tuple[str, ...]] = {}
    while keepers:  # a file that would not migrate takes the utilities it calls out, and so on
        callers = _caller_settings(keepers, texts)
        kept = {path.resolve() for path in keepers}
        failing = {caller for caller, spelled in callers.items()
                   if not _caller_migrates(caller, texts[caller], kept, {**file_settings(caller), CALLER_SETTING: spelled},
                                           unsafe_fixes)}
        # one that cannot pass the scaler but leaves apex all the same (it only loads apex's state:
        # `resume()`) never runs with apex's state after the run: a caller apart, as the next run sees it
        gone = {caller for caller in failing if migrates(texts[caller], None, file_settings(caller), unsafe_fixes)}
        if gone:
            keepers = {keeper: (functions, {caller: spelled for caller, spelled in calling.items() if caller not in gone})
                       for keeper, (functions, calling) in keepers.items()}
            keepers = {keeper: held for keeper, held in keepers.items() if held[1]}
            continue
        for keeper, (_, calling) in keepers.items():
            if failing & set(calling):
                left_on_apex[keeper] = tuple(sorted(caller.name for caller in failing & set(calling)))
        dropped = [keeper for keeper, (functions, _) in keepers.items()
                   if keeper in left_on_apex or not migrates(texts[keeper], None, {**file_settings(keeper),
                                                                                   KEEPER_SETTING: functions}, unsafe_fixes)]
        if not dropped:
            return {keeper: functions for keeper, (functions, _) in keepers.items()}, callers, left_on_apex
        for keeper in dropped:
            del keepers[keeper]
    return {}, {}, left_on_apex


def _caller_settings(keepers, texts: Mapping[Path, str]) -> dict[Path, tuple[tuple[str, str], ...]]:
    found: dict[Path, dict[str, str]] = {}
    for keeper, (_, calling) in keepers.items():
        place = f"{keeper.name}:{halves.find_state_keeper(keeper, texts[keeper]).line}"
        for caller, spelled in calling.items():
            found.setdefault(caller, {}).update(dict.fromkeys(spelled, place))
    return {caller: tuple(sorted(spelled.items())) for caller, spelled in found.items()}


def _never_on_apex(caller: Path, apex_texts) -> bool:
    """A caller that never runs with apex's state: a script of the project (``evaluate.py``, a
    variant of the training script without mixed precision, apex left in its comments) that
    imports nothing of apex nor reads a name ``amp``, and that no file saying apex imports. There
    the utility's apex lines raised (no loss scaler before ``amp.initialize``) or did not run, as
    they do not with no scaler passed."""
    try:
        tree = quiet.parse(caller.read_bytes())
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if caller.name == "__init__.py" or any(
            isinstance(node, (ast.Import, ast.ImportFrom)) and "apex" in ast.dump(node)
            or isinstance(node, ast.Name) and node.id == "amp" for node in ast.walk(tree)):
        return False
    module = re.escape(caller.stem)
    imported = re.compile(rf"^\s*(from\s+[\w.]*\b{module}\b|import\s+.*\b{module}\b|from\s+[\w.]+\s+import\s+.*\b{module}\b)", re.M)
    return not any(imported.search(text) for text in apex_texts)


def _caller_migrates(path: Path, text: str, keepers: set[Path], settings: Mapping, unsafe_fixes: bool) -> bool:
    """Whether the run migrates ``path`` with its calls passing the scaler: a file that initializes
    and scales its own losses, linked to no other file that keeps apex's scale or state."""
    if halves.halves_called(text) != {halves.INITIALIZE, halves.SCALE_LOSS} or halves.linked_trainers(path, text):
        return False
    if any(half.path.resolve() not in keepers for half in halves.linked_scale_halves(path, text)):
        return False
    return migrates(text, None, settings, unsafe_fixes)


def _state_functions(text: str) -> frozenset[str]:
    """The module-level functions of a checkpoint utility that save or load apex's state; none
    where such a call is elsewhere (a method, the module's top level) or the file calls one itself."""
    try:
        tree = quiet.parse(text)
    except (SyntaxError, ValueError):
        return frozenset()
    calls = {id(call) for call in halves.amp_calls(tree, halves.STATE_CALLS)}
    functions = {statement.name: statement for statement in tree.body if isinstance(statement, ast.FunctionDef)}
    holding = {name for name, function in functions.items() if any(id(node) in calls for node in ast.walk(function))}
    inside = sum(1 for name in holding for node in ast.walk(functions[name]) if id(node) in calls)
    if inside != len(calls) or any(isinstance(node, ast.Name) and node.id in holding for node in ast.walk(tree)):
        return frozenset()
    return frozenset(holding)


def _callers(keeper: Path, functions: frozenset[str]) -> dict[Path, frozenset[str]] | None:
    """Each other file of the project calling ``functions`` of ``keeper`` (resolved), with how it
    spells those calls; None where some use is not a plain call of one that can be seen."""
    found: dict[Path, frozenset[str]] = {}
    for path in project_python_files(project_root(keeper)):
        if path == keeper:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if keeper.stem.encode() not in data or not any(name.encode() in data for name in functions):
            continue
        try:
            tree = quiet.parse(data)
        except (SyntaxError, ValueError):
            return None
        spelled = _calls_in(tree, path, keeper, functions)
        if spelled is None:
            return None
        if spelled:
            found[path] = spelled
    return found


def _calls_in(tree: ast.Module, importer: Path, keeper: Path, functions: frozenset[str]) -> frozenset[str] | None:
    """How ``importer`` spells its calls of ``functions``, imported from ``keeper``; None where one
    is used otherwise (handed on, re-exported) or an import may name another file than ``keeper``."""
    names: set[str] = set()  # bound to one of the functions
    modules: dict[str, bool | None] = {}  # bound to a module: whether it is the keeper (None: cannot tell)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            parts = node.module.split(".") if node.module else []
            wanted = [alias for alias in node.names if alias.name in functions or alias.name == "*"]
            if wanted:
                which = _which(importer, node.level, parts, keeper)
                if which is None:
                    return None
                if which:
                    names.update(alias.asname or alias.name for alias in wanted if alias.name != "*")
                    names.update(name for name in functions if any(a.name == "*" for a in wanted) and not name.startswith("_"))
            for alias in node.names:  # `from package import utils`
                modules[alias.asname or alias.name] = _which(importer, node.level, [*parts, alias.name], keeper)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                modules[alias.asname or alias.name] = _which(importer, 0, alias.name.split("."), keeper)
    if names and importer.name == "__init__.py":
        return None  # a package re-exporting them: what imports them from there is not looked at
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    spelled = set()
    for node in _uses(tree, names, modules, functions):
        if node is None:
            return None
        call = parents.get(id(node))
        if not (isinstance(call, ast.Call) and call.func is node) or any(k.arg == KEYWORD for k in call.keywords):
            return None
        spelled.add(ast.unparse(node))
    return frozenset(spelled)


def _uses(tree: ast.Module, names: set[str], modules: dict[str, bool | None], functions: frozenset[str]) -> Iterator[ast.AST | None]:
    """Each read of one of the functions (None for one through a module that may be the keeper)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names:
            yield node if isinstance(node.ctx, ast.Load) else None
        elif isinstance(node, ast.Attribute) and node.attr in functions:
            which = modules.get(ast.unparse(node.value), False)
            if which is not False:
                yield node if which else None


def _which(importer: Path, level: int, parts: list[str], keeper: Path) -> bool | None:
    """Whether the module ``parts`` that ``importer`` imports is ``keeper``: True, False, or None
    where an absolute import names a file of that name that is not the one found beside it."""
    if not is_module(keeper, importer, level, parts):
        return False
    if level:
        return True
    found = find_on_disk(importer, 0, parts, halves.FOLDERS_UP)
    return found is not None and found.resolve() == keeper or None
