"""Where a project will still initialize apex amp after a run, for the rewrites of apex's own
casts (AMP006-AMP008, through ``rules._apex_planned.apex_casts_after_run``).

``@amp.float_function`` (and ``half_function``, the call form ``amp.float_function(_C.nms)``)
cast a function's inputs where apex's O1 was on. The rewrite casts them where native autocast
is on. Both agree once the training code runs on native autocast (migrated, or on ampshim,
whose O1 is native autocast). They do not while a file of the project still calls real apex's
``amp.initialize``: apex O1 patches torch's functions and never turns native autocast on, so
the rewritten function casts nothing and gets apex's fp16 outputs (a float32-only kernel then
raises "not implemented for 'Half'"). The same holds for ``amp.register_half_function`` (apex
casts through its registry) and ``amp.disable_casts()`` (apex's patched functions cast inside a
disabled ``torch.autocast`` too). So a file that uses any of them is told (``SETTING``)
where else its project (``files.project_root``, or the git repository holding it where that is
wider; searched on disk even when one file is given), or the run, calls ``amp.initialize`` (or
the legacy ``amp.init()``) and will keep calling it: each such file not in this run, or in it
with a plan the run does not apply (a safe run leaves an unsafe one on apex). The run counts
because a tree with no marker (an export, a copy) has no known extent beyond what it was given.

A file that scales a loss and initializes nothing, with no other half planned beside it, is told
too (``MASTER_WEIGHTS_SETTING``) where its project keeps an ``amp.initialize`` that may hold fp32
master weights (O2, O3, ``master_weights=True``, or an opt level known only at run time): the
optimizer apex sets up there steps those copies, which apex fills from the model's float16
gradients in ``scale_loss``; a GradScaler in this file never fills them and cannot step it ("No
inf checks were recorded for this optimizer"). Only a project whose extent is known is searched
(``files.known_project_root``): a folder of files gathered from many projects is no project.

The other way round, a file that registers a cast function and initializes nothing is told
(``MIGRATED_SETTING``) where its known project's ``amp.initialize`` calls are, where a safe run
migrates every one of them: its registration can go as safely as theirs.

A checkpoint utility (apex's ``amp.state_dict``/``load_state_dict``, neither ``initialize`` nor
``scale_loss``) whose callers the run does not hand a GradScaler is told
(``STATE_SETTING``) where its known project keeps an ``amp.initialize`` on apex
after the run: apex's loss-scaler state is saved and loaded through it for those runs, so it
stays on apex with them (``kept_for_state_helpers``).
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from migrate import disk_reads, halves, quiet
from migrate.apex_plan.vocabulary import DECORATORS_KEPT as DECORATORS_SETTING
from migrate.apex_plan.vocabulary import MASTER_WEIGHTS_KEPT as MASTER_WEIGHTS_SETTING
from migrate.apex_plan.vocabulary import STATE_INITIALIZE_KEPT as STATE_SETTING
from migrate.files import known_project_root, place, project_root, project_trees_saying

__all__ = ["DECORATORS_SETTING", "MASTER_WEIGHTS_SETTING", "MIGRATED_SETTING", "SETTING", "STATE_SETTING", "decorators_kept", "kept_elsewhere", "kept_for_scale_halves",
           "kept_for_state_helpers", "kept_places", "migrated_for_registrations", "migrates"]

SETTING = "apex-initialize-kept"  # the setting that hands a file these places (not a user setting)
MIGRATED_SETTING = "apex-initialize-migrated"  # the places of ``migrated_for_registrations``
_REGISTRATIONS = re.compile(r"\bregister_(?:half|float|bfloat16|promote)_function\b")
# apex's cast decorators, its registry, and its disabled region
_CAST_USES = re.compile(r"\b(?:register_)?(?:half|float|bfloat16|promote)_function\b|\bdisable_casts\b")
_DECORATORS = frozenset({"half_function", "float_function", "bfloat16_function", "promote_function", "disable_casts"})
_INITIALIZE_NEEDLES = ("initialize(", "init(")  # what a file calling `amp.initialize` (or `amp.init`) says


def kept_elsewhere(texts: Mapping[Path, str], settings: Mapping, partners: Mapping[Path, object],
                   unsafe_fixes: bool = False) -> dict[Path, tuple[str, ...]]:
    """For each file in ``texts`` that uses apex's casts (decorators, registry, disabled region), the places (``path:line``,
    relative to its project) where another file of its project or of the run will still call ``amp.initialize``
    after a run in this mode (``unsafe_fixes``: one the run rewrites unsafely does not);
    ``partners``: each half's other half in this run (``migrate.halves``), which its plan reads."""
    in_run: tuple[tuple[Path, int], ...] | None = None  # the run's own `amp.initialize` calls, gathered once

    def places_of(path: Path, text: str, run: Mapping, migrated: dict) -> tuple[str, ...]:
        nonlocal in_run
        if not _CAST_USES.search(text):
            return ()
        if in_run is None:
            in_run = tuple((file, line) for file, (source, _) in run.items()
                           if any(needle in source for needle in _INITIALIZE_NEEDLES)
                           and (line := _first_initialize(quiet.parse_or_none(source))))
        root, me = _search_root(path), path.resolve()
        # the project on disk, and the files of the run: a tree with no marker (an export, a
        # copy) has no known extent, but what the run was given belongs to it; where the extent
        # is known, another project the run was given (a monorepo's sibling folder) is not this one
        known = known_project_root(path) is not None
        candidates = dict.fromkeys((file, line) for file, line in (*_initializes(root), *in_run)
                                   if file != me and not (known and not file.is_relative_to(root)))
        return kept_places(list(candidates), root, run, settings, unsafe_fixes, migrated)
    return _per_file(texts, partners, places_of)


def kept_for_scale_halves(texts: Mapping[Path, str], settings: Mapping, partners: Mapping[Path, object]) -> dict[Path, tuple[str, ...]]:
    """For each file in ``texts`` that scales a loss, initializes nothing and is paired with no other
    half in this run (``partners``), the places (``path:line``, relative to its project) where its
    project will still call an ``amp.initialize`` that may keep fp32 master weights after the run
    with ``--unsafe-fixes`` (see the module's docstring): the only run that would rewrite such a file
    alone, and whose fix a safe run offers."""
    def places_of(path: Path, text: str, run: Mapping, migrated: dict) -> tuple[str, ...]:
        if getattr(partners.get(path), "facts", None) is not None:
            return ()  # planned with its other half: the two are rewritten together or not at all
        half = halves.find_half(path, text)
        root = known_project_root(path) if half is not None and half.role == halves.SCALE_LOSS else None
        return kept_places(list(_master_weight_initializes(root)), root, run, settings, True, migrated) if root else ()
    return _per_file(texts, partners, places_of)


def kept_for_state_helpers(texts: Mapping[Path, str], file_settings: Callable[[Path], Mapping], partners: Mapping[Path, object],
                           handed: Mapping[Path, object]) -> dict[Path, tuple[str, ...]]:
    """For each checkpoint utility of ``texts`` (apex's ``amp.state_dict``/``load_state_dict``, neither
    ``initialize`` nor ``scale_loss``; ``halves.find_state_keeper``) whose callers the run does not
    hand the GradScaler (not in ``handed``), in a project whose extent is known: the places where
    the project will still call ``amp.initialize`` after a run with ``--unsafe-fixes`` (the only
    run that rewrites such a utility alone: its fix is unsafe), each file of the run planned with
    what the run found for it (``file_settings(path)``). apex keeps its loss-scaler state for those
    runs, saved and loaded through the utility; rewritten, it would drop that state, and no
    GradScaler of the project exists to pass it instead."""
    originals = {path.resolve(): path for path in texts}  # what `file_settings` knows each file by

    def places_of(path: Path, text: str, run: Mapping, migrated: dict) -> tuple[str, ...]:
        if path in handed or known_project_root(path) is None or halves.find_state_keeper(path, text) is None:
            return ()  # in a folder gathered from many projects, another file's initialize is not this one's
        root, me = _search_root(path), path.resolve()
        return kept_places([(file, line) for file, line in _initializes(root) if file != me], root, run, {}, True, migrated,
                           settings_of=lambda file: file_settings(originals[file]))
    return _per_file(texts, partners, places_of)


def migrated_for_registrations(texts: Mapping[Path, str], settings: Mapping, partners: Mapping[Path, object]) -> dict[Path, tuple[str, ...]]:
    """For each file in ``texts`` that registers a function with apex's cast registry and calls no
    ``amp.initialize`` itself, in a project whose extent is known (``files.known_project_root``):
    the places of the project's ``amp.initialize`` calls, where it has one at least and a safe run
    rewrites each. apex's registry then stops with them, and native autocast casts in its place;
    in a folder gathered from many projects, apex may start where no search looks."""
    def places_of(path: Path, text: str, run: Mapping, migrated: dict) -> tuple[str, ...]:
        if not _REGISTRATIONS.search(text) or known_project_root(path) is None or _first_initialize(quiet.parse_or_none(text)):
            return ()
        root, me = _search_root(path), path.resolve()
        candidates = [(file, line) for file, line in _initializes(root) if file != me]
        if candidates and not kept_places(candidates, root, run, settings, False, migrated):
            return tuple(place(file, line, root) for file, line in candidates)
        return ()
    return _per_file(texts, partners, places_of)


def decorators_kept(texts: Mapping[Path, str], settings: Mapping, partners: Mapping[Path, object],
                    unsafe_fixes: bool = False) -> dict[Path, tuple[str, ...]]:
    """For each file in ``texts`` that calls ``amp.initialize``, and its other half in this run
    (``partners``), the places in its project of apex's cast decorators (``@amp.float_function``,
    the call form, ``amp.disable_casts()``) that stay on apex after a run in this mode, followed by
    why: their file is not in the run, or another ``amp.initialize`` of the project stays on apex
    (``kept_places``), which keeps them (``rules._apex_planned.apex_casts_after_run``). apex's
    decorator casts only while its ``amp.initialize`` ran: where that is rewritten, native
    autocast hands the function float16 inputs it used to get as float32 (a float32-only kernel
    raises "not implemented for 'Half'"), so the rewrite is unsafe, on both halves of a pair. Only
    in a project whose extent is known (``files.known_project_root``)."""
    def places_of(path: Path, text: str, run: Mapping, migrated: dict) -> tuple[str, ...]:
        if known_project_root(path) is None or not _first_initialize(quiet.parse_or_none(text)):
            return ()  # a folder gathered from many projects: another file's decorators are not this one's
        root, me = _search_root(path), path.resolve()
        decorated = _decorated(root)
        if not decorated:
            return ()
        places = tuple(place(file, line, root) for file, line in decorated)
        missing = [file for file, _ in decorated if file not in run]
        if missing:
            return (*places, f"{missing[0].relative_to(root) if missing[0].is_relative_to(root) else missing[0]} is not in this run")
        kept = kept_places([(file, line) for file, line in _initializes(root) if file != me], root, run, settings, unsafe_fixes, migrated)
        return (*places, f"apex's `amp.initialize` stays at {', '.join(kept)}") if kept else ()
    found = _per_file(texts, partners, places_of)
    by_shown = {halves.shown(path): path for path in texts}
    for path, places in list(found.items()):  # the other half is as unsafe: the two go together or not at all
        other = by_shown.get(getattr(partners.get(path), "file", None))
        if other is not None and getattr(partners.get(path), "facts", None) is not None:
            found.setdefault(other, places)
    return found


@disk_reads.cached(maxsize=64)
def _decorated(root: Path) -> tuple[tuple[Path, int], ...]:
    """Each file of the project using apex's cast decorators (or ``disable_casts``), with its first such line."""
    found = []
    for file, tree in project_trees_saying(root, (b"_function", b"disable_casts")):
        lines = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in _DECORATORS
                 and ast.unparse(node.value).split(".")[-1] in ("amp", "apex_amp")]
        if lines:
            found.append((file, min(lines)))
    return tuple(found)


def _per_file(texts: Mapping[Path, str], partners: Mapping[Path, object], places_of) -> dict[Path, tuple[str, ...]]:
    """``places_of(path, text, run, migrated)`` for each file of the run, where it names any:
    ``run`` maps each resolved path to its text and partner; ``migrated`` keeps ``migrates``'s
    answers across the files (each file of the run planned once)."""
    run = {path.resolve(): (text, partners.get(path)) for path, text in texts.items()}
    migrated: dict[Path, bool] = {}
    return {path: places for path, text in texts.items() if (places := places_of(path, text, run, migrated))}


def _search_root(path: Path) -> Path:
    """Where to look for a file's project's ``amp.initialize``: its project's root, or the
    repository holding it where that is wider (a C++ extension's ``setup.py`` inside a
    repository marks no project of the training code's own)."""
    root = project_root(path)
    return next((folder for folder in (root, *root.parents) if (folder / ".git").exists()), root)


def kept_places(candidates: list[tuple[Path, int]], root: Path, run: Mapping[Path, tuple[str, object | None]],
                settings: Mapping, unsafe_fixes: bool, migrated: dict[Path, bool],
                settings_of: Callable[[Path], Mapping] | None = None) -> tuple[str, ...]:
    """Those of ``candidates`` (resolved file, line) that stay on apex after the run, as
    ``path:line`` relative to ``root``: a file not in ``run`` (resolved path -> text and partner),
    or one whose plan the run does not apply (every site, and no doubt unless ``unsafe_fixes``),
    planned with ``settings``, or with ``settings_of(file)`` where the caller knows what the run
    found for each file. ``migrated`` keeps the answers across calls."""
    places = []
    for file, line in candidates:
        if file in run:
            if file not in migrated:
                migrated[file] = migrates(*run[file], settings_of(file) if settings_of else settings, unsafe_fixes)
            if migrated[file]:
                continue
        places.append(place(file, line, root))
    return tuple(places)


def migrates(text: str, partner: object | None, settings: Mapping, unsafe_fixes: bool) -> bool:
    """Whether a run in this mode (``unsafe_fixes``) rewrites every apex site of ``text``."""
    from migrate.apex_plan.provider import level_made_known, plan_text
    from migrate.apex_plan.vocabulary import PARTNER

    plan = plan_text(text, {**settings, PARTNER: partner} if partner is not None else settings)
    # no finding: nothing of apex amp is rewritten there (a legacy `amp.init()` handle in use)
    return (plan is not None and bool(plan.findings) and all(report.replacement is not None for report in plan.findings)
            and (unsafe_fixes or not plan.unsafe_reasons or level_made_known(plan, settings)))


@disk_reads.cached(maxsize=64)
def _initializes(root: Path) -> tuple[tuple[Path, int], ...]:
    """Every ``amp.initialize(...)`` call (``apex.amp.``, ``apex_amp.``) in the project's ``.py``
    files, and every legacy ``amp.init(...)``: its handle switched apex's casts on the same way."""
    return tuple((file, line) for file, tree in project_trees_saying(root, tuple(needle.encode() for needle in _INITIALIZE_NEEDLES))
                 if (line := _first_initialize(tree)))


@disk_reads.cached(maxsize=64)
def _master_weight_initializes(root: Path) -> tuple[tuple[Path, int], ...]:
    """Each file of the project with an ``amp.initialize(...)`` that may keep fp32 master weights, and its line."""
    return tuple((file, call.lineno) for file, tree in project_trees_saying(root, b"initialize(")
                 if (call := next((call for call in _setup_calls(tree) if _may_keep_master_weights(call)), None)))


def _may_keep_master_weights(call: ast.Call) -> bool:
    """Whether apex may keep fp32 master weights for what ``call`` sets up: an ``initialize`` at O2 or
    O3, with ``master_weights=True``, or with an opt level (or options) known only at run time."""
    if call.func.attr != "initialize":
        return False  # the legacy `amp.init()` handle kept none
    given = {keyword.arg: keyword.value for keyword in call.keywords}
    if None in given or any(isinstance(arg, ast.Starred) for arg in call.args):
        return True  # `**options`, `*arguments`
    # apex's signature: (models, optimizers, enabled, opt_level, ..., master_weights at index 7, ...)
    level = given.get("opt_level", call.args[3] if len(call.args) > 3 else None)
    master = given.get("master_weights", call.args[7] if len(call.args) > 7 else None)
    if master is not None and not (isinstance(master, ast.Constant) and master.value in (None, False)):
        return True
    return not (level is None or (isinstance(level, ast.Constant) and level.value in ("O0", "O1")))


def _first_initialize(tree: ast.Module | None) -> int:
    """The line of the first ``amp.initialize(...)`` (``apex_amp.``, legacy ``amp.init(...)``) in ``tree``; 0 for none."""
    return next((call.lineno for call in _setup_calls(tree)), 0) if tree is not None else 0


def _setup_calls(tree: ast.Module) -> Iterator[ast.Call]:
    """The ``amp.initialize(...)`` calls (``apex.amp.``, ``apex_amp.``) and legacy ``amp.init(...)`` calls of ``tree``."""
    return (node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("initialize", "init") and ast.unparse(node.func.value).split(".")[-1] in ("amp", "apex_amp"))
