"""apex's per-loss scalers (``num_losses=N``, ``scale_loss(..., loss_id=k)``) kept: one GradScaler per loss id.

apex gave each loss id a loss scale of its own, halved when that loss's gradients overflowed and
grown after its own run of clean backward passes. Where each optimizer only ever takes the
gradients of one loss id (a GAN: the discriminator's loss steps ``optD``, the generator's
``optG``), one GradScaler per loss id does what apex did: each scales its losses, steps its
optimizers and updates after their last step. Where an optimizer takes gradients of two loss ids
(two losses summed into one model's gradients at different scales), no GradScaler can unscale
them: the rewrite keeps one GradScaler for all losses, unsafely (``LOSSES_MERGED``).
"""
from __future__ import annotations

import re

import libcst as cst

from migrate import apex_nodes as nodes
from migrate.apex_plan.context import Sites
from migrate.apex_plan.vocabulary import InitializeSite, ScaleLossSite, normal

LOSSES_MERGED = ("one GradScaler serves every loss (apex keeps one scaler per loss), updated after the last step of "
                 "each block of optimizer steps")


class LossesShareAStep(Exception):
    """One ``step()`` line steps optimizers of two loss ids (``for opt in opts: opt.step()``):
    no one GradScaler of the per-loss ones can step it. The file is planned again with one GradScaler."""


def loss_id_of(call: cst.Call) -> int | None:
    """The loss id an ``amp.scale_loss`` call names (0 by default); None when computed at run time."""
    arg = nodes.argument(call, 2, "loss_id")
    if arg is None:
        return 0
    value = arg.value
    if isinstance(value, cst.Name) and value.value == "False":  # an index like 0
        return 0
    return int(value.value) if isinstance(value, cst.Integer) else None


def loss_ids_by_call(inits: list[InitializeSite], scales: list[ScaleLossSite], master_params: list[cst.Call],
                     state_calls: list[cst.Call], handed_on: bool) -> dict[int, int] | None:
    """The loss id of each ``scale_loss`` and ``master_params`` call, where a GradScaler per loss id
    keeps apex's per-loss scalers; None where it cannot (or where apex kept one scaler anyway).

    It cannot where a loss id is computed, where an optimizer is scaled for two loss ids, where
    ``master_params`` names an optimizer no loss id scales for, where several ``initialize`` calls
    or a handed-on amp module may make or use scalers of their own, and where apex's loss-scaler
    state is saved (one state per loss id, which the checkpoint rewrite does not write).
    """
    if not any(site.merges_losses for site in (*inits, *scales)):
        return None
    if len(inits) != 1 or state_calls or handed_on:
        return None
    ids: dict[int, int] = {}
    id_of_optimizer: dict[str, int] = {}
    for scale in scales:
        if scale.loss_id is None:
            return None
        ids[id(scale.call)] = scale.loss_id
        for optimizer in scale.optimizers:
            if id_of_optimizer.setdefault(normal(nodes.code(optimizer)), scale.loss_id) != scale.loss_id:
                return None
    for call in master_params:
        optimizer = nodes.argument(call, 0, "optimizer")
        loss_id = id_of_optimizer.get(normal(nodes.code(optimizer.value))) if optimizer is not None else None
        if loss_id is None:
            return None
        ids[id(call)] = loss_id
    return ids


def scaler_names(scaler: str, loss_ids: dict[int, int], source: str) -> dict[int, str] | None:
    """The GradScaler of each loss id: ``scaler_0``, ``scaler_1``... (``self.scaler_0``), or the
    one ``scaler`` where one loss id is used; None where such a name is taken in the file."""
    used = sorted(set(loss_ids.values()))
    if len(used) == 1:
        return {used[0]: scaler}
    names = {loss_id: f"{scaler}_{loss_id}" for loss_id in used}
    if any(re.search(rf"\b{re.escape(name.rpartition('.')[2])}\b", source) for name in names.values()):
        return None
    return names


def scalers_per_loss(sites: Sites, inits: list[InitializeSite], scales: list[ScaleLossSite], scaler: str,
                     source: str) -> dict[int, str] | None:
    """The GradScaler of each ``scale_loss`` and ``master_params`` call, by id of the call, where
    one per loss id keeps apex's per-loss scalers; the first loss id's first. Else None."""
    loss_ids = loss_ids_by_call(inits, scales, sites.calls["master_params"],
                                sites.calls["state_dict"] + sites.calls["load_state_dict"],
                                bool(sites.alias_of or sites.escapes))
    names = scaler_names(scaler, loss_ids, source) if loss_ids is not None else None
    if names is None:
        return None
    return {call: names[loss_id] for call, loss_id in sorted(loss_ids.items(), key=lambda item: item[1])}
