"""apex.amp split across files: ``amp.initialize`` in one, ``amp.scale_loss`` in another.

Real repositories often initialize in the script (``train.py``) and scale the loss in a module it
imports (``engine.py``), or the other way round (a setup helper in ``utils.py``). Neither half
can be rewritten exactly alone: the GradScaler that replaces ``initialize`` is the one that must
scale the loss. A run given both pairs them by their imports, and each half's plan reads the
other's facts (``apex_plan.Partner``). A half given alone is still matched to its other half on
disk, so that its report can name the file.

A pair is an import between the two files, either way, and nothing ambiguous: an initialize half
imports or is imported by exactly one scale half. Several initialize halves may share that scale
half (a folder of experiment scripts importing one trainer), each linked to it alone: they are
paired with it where their plans agree (the same level and scaler options), as the one GradScaler
of the trainer's module serves each script.
Finding and pairing the halves takes ``ast`` only; ``migrate.half_partners`` plans each pair (libcst).
"""
from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from migrate import disk_reads, quiet
from migrate.files import outermost_package, project_files_saying, project_python_files, project_root
from migrate.module_paths import find_on_disk, is_module
from migrate.types import ImportChange

__all__ = ["FOLDERS_UP", "INITIALIZE", "SCALE_LOSS", "Half", "Pairing", "find_half", "halves_called", "in_package",
           "linked_scale_halves", "on_disk", "pair", "read_text", "shown"]

INITIALIZE, SCALE_LOSS = "initialize", "scale_loss"
STATE, STATE_CALLS = "state", ("state_dict", "load_state_dict")  # a checkpoint utility keeping apex's state
SCALER = "scaler"  # the module-level name the scale half's GradScaler gets
FOLDERS_UP = 3  # an absolute import's package is looked for this many folders up from the importer
_HALF_CALL = re.compile(r"amp\s*\.\s*(initialize|scale_loss)\s*\(")  # `amp.`, `apex.amp.`, `apex_amp.`
_INITIALIZE_CALL = re.compile(r"amp\s*\.\s*initialize\s*\(")
_STATE_CALL = re.compile(r"amp\s*\.\s*(?:load_)?state_dict\s*\(")


class Import(NamedTuple):
    """``from <.level><module> import <names>`` (names empty for ``import module``)."""

    level: int
    module: str
    names: tuple[str, ...]


class Half(NamedTuple):
    """A file that holds only one half of apex amp: what it holds, where, and what it imports."""

    path: Path
    role: str  # INITIALIZE or SCALE_LOSS
    line: int  # its first such call
    imports: tuple[Import, ...]


class Pairing(NamedTuple):
    """A half's other half; ``scaler_import``: for the initialize half that imports the scale
    half, how it imports that module's GradScaler (None the other way round); ``also``: for a
    scale half, the other initialize halves sharing it."""

    other: Half
    scaler_import: ImportChange | None
    also: tuple[Half, ...] = ()


def find_half(path: Path, text: str) -> Half | None:
    """The half of apex amp ``text`` holds, or None when it holds both or neither (or does not parse)."""
    if "apex" not in text or not _HALF_CALL.search(text):
        return None  # neither call (as text); the calls of the tree decide the rest
    try:
        tree = quiet.parse(text)
    except (SyntaxError, ValueError):
        return None
    first = _first_amp_calls(tree, (INITIALIZE, SCALE_LOSS))
    if len(first) != 1:
        return None
    (role, line), = first.items()
    return Half(path, role, line, _imports_of(tree))


def find_state_keeper(path: Path, text: str) -> Half | None:
    """A checkpoint utility: ``text`` saves or loads apex amp's state (``amp.state_dict()``,
    ``amp.load_state_dict(...)``) and neither initializes nor scales; its role is ``STATE``."""
    if "apex" not in text or not _STATE_CALL.search(text):
        return None
    try:
        tree = quiet.parse(text)
    except (SyntaxError, ValueError):
        return None
    if _first_amp_calls(tree, (INITIALIZE, SCALE_LOSS)):
        return None  # a half itself (calls in comments or strings do not count)
    first = _first_amp_calls(tree, STATE_CALLS)
    return Half(path, STATE, min(first.values()), _imports_of(tree)) if first else None


def halves_called(text: str) -> set[str]:
    """Which of ``amp.initialize`` and ``amp.scale_loss`` ``text`` calls (not in a comment or a
    string); none where it does not parse."""
    if not _HALF_CALL.search(text):
        return set()
    try:
        return set(_first_amp_calls(quiet.parse(text), (INITIALIZE, SCALE_LOSS)))
    except (SyntaxError, ValueError):
        return set()


def _first_amp_calls(tree: ast.Module, wanted: tuple[str, ...]) -> dict[str, int]:
    """The first line of each of ``wanted``'s calls on apex's ``amp`` in ``tree``, by name."""
    first: dict[str, int] = {}
    for node in amp_calls(tree, wanted):
        first[node.func.attr] = min(first.get(node.func.attr, node.lineno), node.lineno)
    return first


def amp_calls(tree: ast.Module, wanted: tuple[str, ...]) -> Iterator[ast.Call]:
    """The calls of ``wanted`` (``initialize``, ``state_dict``...) on apex's ``amp`` in ``tree``."""
    amp_names, apex_names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.module == "apex" and node.level == 0:
                amp_names |= {alias.asname or alias.name for alias in node.names if alias.name == "amp"}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "apex.amp" and alias.asname:
                    amp_names.add(alias.asname)
                elif alias.name.split(".")[0] == "apex":
                    apex_names.add(alias.asname or "apex")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in wanted:
            owner = node.func.value
            if (isinstance(owner, ast.Name) and owner.id in amp_names) or (
                isinstance(owner, ast.Attribute) and owner.attr == "amp" and isinstance(owner.value, ast.Name) and owner.value.id in apex_names
            ):
                yield node


def pair(halves: Iterable[Half]) -> dict[Path, Pairing]:
    """Each half's other half, where the pairing is unambiguous (see the module's docstring)."""
    halves = list(halves)
    real = {half.path: half.path.resolve() for half in halves}
    links: dict[Path, dict[Path, ImportChange | None]] = {half.path: {} for half in halves}
    for half in halves:
        others = [other for other in halves if other.role != half.role]
        for imported in half.imports:
            for other, module in _imported_halves(half, imported, others, real):
                scaler_import = _scaler_import(imported, module) if half.role == INITIALIZE else None
                links[half.path].setdefault(other.path, scaler_import)
                links[other.path].setdefault(half.path, None)
    by_path = {half.path: half for half in halves}
    pairs = {}
    for half in halves:
        linked = links[half.path]
        if half.role == SCALE_LOSS:  # with each initialize half linked to it alone
            if linked and all(len(links[other]) == 1 for other in linked):
                first, *rest = linked
                pairs[half.path] = Pairing(by_path[first], None, tuple(by_path[path] for path in rest))
        elif len(linked) == 1:
            (other_path, scaler_import), = linked.items()
            if all(len(links[other]) == 1 for other in links[other_path]):
                pairs[half.path] = Pairing(by_path[other_path], scaler_import)
    return pairs


def on_disk(half: Half) -> Half | None:
    """The other half of ``half`` among the files of its project (the nearest folder up with a
    ``.git``, ``pyproject.toml`` or ``setup.py``; else its own folder), when exactly one pairs
    and it pairs with no other."""
    me = half.path.resolve()
    found = [half, *(other for other in _halves_under(project_root(half.path)) if other.path != me)]
    pairs = pair(found)
    pairing = pairs.get(half.path)
    # a scale half shared by several scripts is not one file's other half
    shared = pairing is not None and (pairing.also or (half.role == INITIALIZE and pairs[pairing.other.path].also))
    return pairing.other if pairing is not None and not shared else None


def _imports_of(tree: ast.Module) -> tuple[Import, ...]:
    """Every import of the module, in the order ``ast.walk`` meets them (``import a.b`` names none)."""
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.append(Import(node.level, node.module or "", tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.Import):
            found += [Import(0, alias.name, ()) for alias in node.names]
    return tuple(found)


def linked_scale_halves(path: Path, text: str) -> list[Half]:
    """The files of ``path``'s project that only scale losses with apex amp (scale halves), or only
    save or load its state (``STATE``: a checkpoint utility), and that ``text``, a file calling
    ``amp.initialize``, imports or is imported by: where a loss it initialized for may be scaled
    (``attack_pgd(model, ..., opt)`` in ``utils.py``), or its loss scaler saved
    (``save_checkpoint(..., optimizer)`` putting ``amp.state_dict()`` beside the optimizer's)."""
    try:
        tree = quiet.parse(text)
    except (SyntaxError, ValueError):
        return []
    imports = _imports_of(tree)
    me = Half(path, INITIALIZE, 0, imports)
    root = project_root(path)
    scales = [half for half in (*_halves_under(root), *_state_keepers_under(root))
              if half.role in (SCALE_LOSS, STATE) and half.path != path.resolve()]
    real = {half.path: half.path.resolve() for half in (me, *scales)}
    linked = {other.path: other for other in _imports_reaching(me, scales, real, _names_reaching)}
    for half in scales:  # imported by them
        if any(me.path in (found.path for found, _ in _imported_halves(half, imported, [me], real)) for imported in half.imports):
            linked.setdefault(half.path, half)
    return list(linked.values())


def linked_initializers(path: Path, text: str) -> list[Half]:
    """The other files of ``path``'s project that call ``amp.initialize`` themselves and import from
    ``text`` (a file that initializes and scales losses) what scales a loss: a trial script setting
    apex up for the model it builds, then calling the file's ``train()``, which never runs the
    file's own ``initialize``. Their ``line`` is their first ``initialize``."""
    if len(set(_HALF_CALL.findall(text))) != 2:
        return []
    me = path.resolve()
    return [initializer for trainer, initializer in _trainer_links(project_root(path)) if trainer.path == me]


def linked_trainers(path: Path, text: str) -> list[Half]:
    """The files of ``path``'s project that initialize apex amp and scale their own losses, for which
    ``text``, a file calling ``amp.initialize``, is one of the ``linked_initializers``: they stay on
    apex, and need its ``initialize`` to scale the losses of the model it set up."""
    if not _INITIALIZE_CALL.search(text):
        return []
    me = path.resolve()
    return [trainer for trainer, initializer in _trainer_links(project_root(path)) if initializer.path == me]


@disk_reads.cached(maxsize=8)
def _trainer_links(root: Path) -> tuple[tuple[Half, Half], ...]:
    """The project's (trainer, initializer) links, each file read once: a trainer initializes apex
    amp and scales its own losses (its ``line``: its first ``scale_loss``); an initializer is another
    file that calls ``amp.initialize`` itself, then what scales the trainer's losses, imported
    and used (a star import in an inference script is no link)."""
    initializers = _initializers_under(root)
    links = []
    for path, data in project_files_saying(root, b"scale_loss("):
        if len(set(_HALF_CALL.findall(data.decode("utf-8", "replace")))) != 2:
            continue
        try:
            first = _first_amp_calls(quiet.parse(data), (INITIALIZE, SCALE_LOSS))
        except (SyntaxError, ValueError):
            continue
        if len(first) != 2:
            continue  # one of the two is only in a comment or a string
        line = first[SCALE_LOSS]
        trainer = Half(path, SCALE_LOSS, line, ())
        reaching = _names_reaching(trainer)
        others = [initializer for initializer in initializers if initializer.path != path] if reaching else []
        real = {half.path: half.path for half in (trainer, *others)}
        links += [(trainer, other) for other in others
                  if next(_imports_reaching(other, [trainer], real, lambda _: reaching), None) is not None
                  and _uses_any(other.path, reaching)]
    return tuple(links)


def _imports_reaching(importer: Half, others: list[Half], real: dict[Path, Path],
                      reaching: Callable[[Half], set[str]]) -> Iterator[Half]:
    """The halves of ``others`` that ``importer`` imports something of that makes their apex calls:
    the module itself, a star, or one of ``reaching(other)``'s names (not ``from engine import
    reduce_loss_dict``, where nothing imported scales a loss or keeps its state)."""
    for imported in importer.imports:
        for other, module in _imported_halves(importer, imported, others, real):
            names = set(imported.names)  # none: the module itself; else what it takes from it
            if module != imported.module or not names or "*" in names or names & reaching(other):
                yield other


def _uses_any(path: Path, names: set[str]) -> bool:
    """Whether the file at ``path`` reads one of ``names``, or an alias it imports one as."""
    try:
        tree = quiet.parse(read_text(path) or "")
    except (SyntaxError, ValueError):
        return True  # unread: assume it does
    aliases = {alias.asname for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for alias in node.names if alias.asname and alias.name in names}
    wanted = names | aliases
    return any((isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in wanted)
               or (isinstance(node, ast.Attribute) and node.attr in names) for node in ast.walk(tree))


@disk_reads.cached(maxsize=8)
def _initializers_under(root: Path) -> tuple[Half, ...]:
    found = []
    for path, data in project_files_saying(root, b"initialize("):
        try:
            tree = quiet.parse(data.decode("utf-8", "replace"))
        except (SyntaxError, ValueError):
            continue
        line = _first_amp_calls(tree, (INITIALIZE,)).get(INITIALIZE)
        if line is not None:
            found.append(Half(path, INITIALIZE, line, _imports_of(tree)))
    return tuple(found)


def _names_reaching(half: Half) -> set[str]:
    """The module's top-level functions and classes that make the half's apex calls (scale a loss;
    for ``STATE``, save or load amp's state: ``amp.state_dict``, not a model's), or call one that does."""
    try:
        tree = quiet.parse(read_text(half.path) or "")
    except (SyntaxError, ValueError):
        return set()
    attributes = STATE_CALLS if half.role == STATE else (SCALE_LOSS,)

    def calls_apex(inner: ast.AST) -> bool:
        return isinstance(inner, ast.Attribute) and inner.attr in attributes and (
            half.role != STATE or ast.unparse(inner.value).split(".")[-1] in ("amp", "apex_amp"))

    defined = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    reaching: set[str] = set()
    while True:
        found = {name for name, node in defined.items() if name not in reaching and any(
            calls_apex(inner) or isinstance(inner, ast.Name) and inner.id in reaching for inner in ast.walk(node))}
        if not found:
            return reaching
        reaching |= found


UNPAIRED = "it is in the same package, and neither file imports the other: this one stays with it"


def read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return None


def in_package(half: Half) -> Half | None:
    """An other half of ``half`` in the package that holds it (the outermost folder up with an
    ``__init__.py``), the nearest, where ``on_disk`` pairs none: the model's module scaling the
    loss, the trainer initializing, joined only at run time (the model object handed over).
    None outside a package."""
    package = outermost_package(half.path)
    if package is None:
        return None
    me = half.path.resolve()
    others = [other for other in _halves_under(project_root(half.path))
              if other.role != half.role and other.path != me and package in other.path.parents]
    if not others:
        return None
    return max(others, key=lambda other: (len(os.path.commonpath([me, other.path])), -other.line))


@disk_reads.cached(maxsize=8)
def _state_keepers_under(root: Path) -> tuple[Half, ...]:
    return tuple(keeper for path, data in project_files_saying(root, b"state_dict(")
                 if (keeper := find_state_keeper(path, data.decode("utf-8", "replace"))) is not None)


@disk_reads.cached(maxsize=8)
def _halves_under(root: Path) -> tuple[Half, ...]:
    found = []
    for path, data in project_files_saying(root, b"apex"):
        half = find_half(path, data.decode("utf-8", "replace"))
        if half is not None:
            found.append(half)
    return tuple(found)


def shown(path: Path) -> str:
    """A path as a user reads it: relative to its project's root, as other files' places are named
    (``files.place``), wherever the run starts."""
    root = project_root(path)
    resolved = path.resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)


def _imported_halves(half: Half, imported: Import, others: list[Half], real: dict[Path, Path]) -> Iterator[tuple[Half, str]]:
    """The halves ``imported`` may load, with the module name (as spelled there) each one is;
    ``real``: each half's resolved path. A package's ``__init__.py`` that re-exports a half's
    names (``from .train import train_epoch``) loads that half for whoever imports them from it."""
    candidates = [(imported.module, imported.module.split(".") if imported.module else [])]
    candidates += [(f"{imported.module}.{name}" if imported.module else name, [*candidates[0][1], name]) for name in imported.names]
    for module, parts in candidates:
        if not parts:
            continue
        matching = [other for other in others if is_module(real[other.path], real[half.path], imported.level, parts)]
        if not matching and module == imported.module:
            yield from _re_exported_halves(half, imported, others, real)
            continue
        # The one nearest the importer: several projects in a tree may have a `utils.py`.
        shared = {other.path: len(os.path.commonpath([real[half.path], real[other.path]])) for other in matching}
        closest = [other for other in matching if shared[other.path] == max(shared.values())]
        if len(closest) == 1 and not _shadowed(half, imported.level, parts, real[closest[0].path], real):
            yield closest[0], module


def _shadowed(importer: Half, level: int, parts: list[str], half_path: Path, real: dict[Path, Path]) -> bool:
    """Whether the import loads another file of that name than the half, apex or not: one where
    Python looks from the importer (``import utils`` beside the script's own ``utils.py``), or, for
    an absolute import, one nearer the importer in the project's tree, the folder it shares with
    the importer deeper (``ImageNet/lib/utils.py`` for ``ImageNet/main.py``, put on the path by
    the script, rather than ``CIFAR10/utils.py`` of a sibling experiment)."""
    me = real[importer.path]
    nearest = find_on_disk(me, level, parts, folders_up=FOLDERS_UP)
    if nearest is not None or level:
        return nearest is not None and nearest.resolve() != half_path
    shared = len(os.path.commonpath([me, half_path]))
    return any(is_module(other, me, 0, parts) and len(os.path.commonpath([me, other])) > shared
               for other in project_python_files(project_root(me)))


def _re_exported_halves(half: Half, imported: Import, others: list[Half], real: dict[Path, Path]) -> Iterator[tuple[Half, str]]:
    """The halves whose names the package ``imported`` names re-exports in its ``__init__.py``
    (``from .train import train_epoch``) where ``imported`` takes the package itself, all of
    it, or one of those names: each with its module spelled from the importer (``utils.train``)."""
    package = _package_of(real[half.path].parent, imported.level, imported.module)
    if package is None:
        return
    wanted = set(imported.names)
    for re_export in _relative_imports_of(package):
        taken = set(re_export.names)
        if wanted and "*" not in wanted and "*" not in taken and not wanted & taken:
            continue
        parts = re_export.module.split(".")
        for other in others:
            if is_module(real[other.path], package, re_export.level, parts):
                yield other, f"{imported.module}.{re_export.module}"


@disk_reads.cached(maxsize=1024)
def _package_of(folder: Path, level: int, module: str) -> Path | None:
    """The resolved ``__init__.py`` of the package ``module`` as a file in ``folder`` imports it;
    None where it is a plain module or not on disk (asked for every import of every half)."""
    found = find_on_disk(folder / "_", level, module.split("."), folders_up=FOLDERS_UP)
    return found.resolve() if found is not None and found.name == "__init__.py" else None


@disk_reads.cached(maxsize=64)
def _relative_imports_of(package: Path) -> tuple[Import, ...]:
    """A package's ``from .module import names`` lines, one level down (its own modules)."""
    try:
        tree = quiet.parse(read_text(package) or "")
    except (SyntaxError, ValueError):
        return ()
    return tuple(found for found in _imports_of(tree) if found.level == 1 and found.module)


def _scaler_import(imported: Import, module: str) -> ImportChange:
    return ImportChange(module, SCALER, relative=imported.level)

