"""What other files of the project keep on apex, and so make a rewrite here unsafe: apex's cast
lists changed elsewhere (native autocast does not read them), and apex's cast decorators left
on apex (they cast only while apex's casts are on, ``migrate.apex_kept.decorators_kept``)."""
from __future__ import annotations


def kept_elsewhere_reasons(casts_elsewhere: tuple[str, ...], decorators_kept: tuple[str, ...], casts_on: bool) -> list[str]:
    """Why a rewrite that switches native autocast on in place of apex's casts (``casts_on``:
    ``amp.initialize``, the legacy handle) may differ: ``casts_elsewhere``, the places that
    change apex's cast lists; ``decorators_kept``, the places of decorators kept on apex, then why."""
    reasons = []
    if casts_elsewhere and casts_on:
        reasons.append(
            f"another file of the project changes apex's cast lists ({', '.join(casts_elsewhere[:3])}"
            f"{', ...' if len(casts_elsewhere) > 3 else ''}): native autocast does not read them, so the "
            "ops they name run in autocast's own precision")
    if decorators_kept:  # given to a file initializing, and to its other half
        *places, why = decorators_kept
        reasons.append(
            f"apex's cast decorators stay on apex ({', '.join(places[:3])}{', ...' if len(places) > 3 else ''}: {why}): "
            "they cast only while apex's `amp.initialize` runs, so under native autocast their functions get "
            "float16 inputs (a float32-only kernel raises); migrate them with every `amp.initialize` of the project")
    return reasons
