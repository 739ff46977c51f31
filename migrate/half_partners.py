"""Each half of apex amp's ``apex_plan.Partner`` in a run: what the plan of its other half says.

``migrate.halves`` finds the halves and pairs them by their imports; here each pair is planned:
the initialize halves first (the scale half's GradScaler takes their options), then the scale half
(each initialize half takes its facts). A half left unpaired is told the file of its other half
found on disk, or, where that file is in its package and cannot be rewritten, why it stays.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from migrate.importers import importers_of
from migrate.halves import SCALE_LOSS, SCALER, UNPAIRED, Half, Pairing, find_half, in_package, on_disk, pair, read_text, shown

__all__ = ["partners"]


def partners(texts: Mapping[Path, str], settings: Mapping,
             settings_of: Callable[[Path], Mapping] | None = None) -> dict[Path, object]:
    """Each half's ``apex_plan.Partner`` in a run over ``texts``: the other half's facts where the
    run holds both (the initialize half is planned first: the scale half's GradScaler takes its
    options; then the initialize half takes the scale half's), else the file found on disk.
    ``settings_of(path)``: the settings that file is planned with in the run (what other files
    say of it), so that a half its run cannot rewrite keeps its partner as it is too."""
    settings_of = settings_of or (lambda path: settings)
    found = [half for path, text in texts.items() if (half := find_half(path, text)) is not None]
    if not found:
        return {}
    from migrate.apex_plan.provider import plan_text
    from migrate.apex_plan.vocabulary import PARTNER, HalfFacts, Partner

    def facts(half: Half, partner: Partner) -> HalfFacts:
        plan = plan_text(texts[half.path], {**settings_of(half.path), PARTNER: partner})
        return plan.half if plan is not None and plan.half is not None else HalfFacts(manual="it does not parse, or holds both halves")

    pairs = pair(found)
    result: dict[Path, object] = {}
    for scale in found:
        if scale.role == SCALE_LOSS and scale.path in pairs:
            result.update(_paired(scale, pairs, facts))
    for half in found:
        if half.path in result:
            continue
        other = on_disk(half)
        if other is not None:
            result[half.path] = Partner(shown(other.path), other.line)
        elif (unpaired := in_package(half)) is not None:
            # Its other half, joined at run time, cannot be rewritten: rewritten alone, this one
            # would leave it calling apex amp half set up (`scale_loss` with `initialize` gone
            # raises). Both stay, for a person to migrate together.
            text = texts.get(unpaired.path) or read_text(unpaired.path)
            plan = plan_text(text, {**settings_of(unpaired.path), PARTNER: Partner(shown(half.path), half.line)}) if text else None
            manual = plan.half.manual if plan is not None and plan.half is not None else "it does not parse, or holds both halves"
            if manual:
                result[half.path] = Partner(shown(unpaired.path), unpaired.line, HalfFacts(manual=f"{manual}; {UNPAIRED}"))
    return result


def _paired(scale: Half, pairs: Mapping[Path, Pairing], facts: Callable) -> dict[Path, object]:
    """The ``Partner`` of a scale half and of each initialize half paired with it; none where
    those initialize halves' plans disagree (then each is rewritten as if unpaired). The
    initialize halves are planned first: the scale half's GradScaler takes their options; then
    each takes the scale half's facts."""
    from migrate.apex_plan.vocabulary import HalfFacts, Partner

    # in a fixed order, whatever order the run read them in: the first names the pair in the reasons
    initializers = sorted([pairs[scale.path].other, *pairs[scale.path].also], key=lambda half: str(half.path))
    if any(pairs.get(half.path) is None for half in initializers):
        return {}
    first = initializers[0]
    # whether the scale half writes an autocast region, and the switches it is enabled by: the
    # initialize halves' reasons say so
    alone = facts(scale, Partner(shown(first.path), first.line, HalfFacts()))
    guess = HalfFacts(scaler=SCALER, autocast=alone.autocast, switches=alone.switches)

    def agreed(guess: HalfFacts) -> HalfFacts | None:
        planned = [facts(half, Partner(shown(scale.path), scale.line, guess, pairs[half.path].scaler_import)) for half in initializers]
        return planned[0] if all(each == planned[0] for each in planned[1:]) else None

    planned = agreed(guess)
    if planned is None:
        return {}
    scale_facts = None
    hands_to = planned.hands_to  # made where initialize was, and handed to these (``apex_plan.handed_across``)
    if hands_to and not importers_of(scale.path, frozenset(hands_to)) - {half.path.resolve() for half in initializers}:
        hoped = agreed(guess._replace(receives=hands_to))  # planned as the scale half would take it
        taking = facts(scale, Partner(shown(first.path), first.line, hoped)) if hoped is not None else None
        if taking is not None and taking.receives:
            planned, scale_facts = hoped, taking
    if scale_facts is None:  # made in the scale half's module, with the initialize halves' options
        planned = planned._replace(hands_to=())
        scale_facts = facts(scale, Partner(shown(first.path), first.line, planned))
    result = {scale.path: Partner(shown(first.path), first.line, planned)}
    for half in initializers:
        result[half.path] = Partner(shown(scale.path), scale.line, scale_facts, pairs[half.path].scaler_import)
    return result
