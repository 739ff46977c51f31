"""GradScaler's arguments for the options of one ``amp.initialize`` call, read before any plan."""
from __future__ import annotations

import ast

from collections.abc import Sequence
from typing import NamedTuple

import libcst as cst

from migrate import apex_nodes as nodes
from migrate import quiet
from migrate.apex_plan.vocabulary import NEVER, NO_NATIVE_OPTION, O2_O3_OPTIONS, ScaleBounds, float_text, run_time_scale


class ScalerOptions(NamedTuple):
    arguments: list[str]  # GradScaler's arguments (`init_scale=512.0`)
    merges_losses: bool  # `num_losses` above 1: apex kept one scaler per loss (the planner decides, `per_loss`)
    bounds: ScaleBounds  # the floor and cap apex kept a dynamic scale within
    unsafe: list[str]  # why the options cannot be kept exactly


def scaler_options(call: cst.Call, o0_or_o1: bool) -> ScalerOptions:
    """GradScaler's arguments for apex's options; an option with no native form makes it unsafe.

    Dropping one is taken as safe: ``max_loss_scale`` of 2**24 or more (apex's default cap;
    GradScaler has none, so it grows past it and may skip a step apex took, one in 2,000 where the
    largest gradient stays just under apex's overflow; docs/codemod.md says so) or beside a static scale (which never grows), and, for
    O0/O1, the options apex only applies under O2/O3 (under O1 it refuses them outright). A
    lower cap, or a floor (``min_loss_scale``), given as a number bounds a dynamic scale: each
    ``update()`` is followed by one putting the scale back within it (``ScaleBounds``); below
    2**16 the scaler starts at the cap, as apex's did. A ``loss_scale`` known only at run time
    (``args.loss_scale``, a config value) picks the scaler's start and growth at run time:
    dynamic as GradScaler's defaults, a static value as a scale that never grows.
    """
    options: list[str] = []
    merges_losses, bounds, unsafe = False, ScaleBounds(), []
    harmless = set(O2_O3_OPTIONS if o0_or_o1 else ())
    cap = nodes.argument(call, None, "max_loss_scale")
    cap_number = nodes.number_value(cap.value) if cap is not None else None
    if cap_number is not None and cap_number >= 2**24:
        harmless.add("max_loss_scale")
    loss_scale = nodes.argument(call, None, "loss_scale")
    if loss_scale is not None and nodes.literal_string(loss_scale.value) != "dynamic":
        number = nodes.number_text(loss_scale.value)
        if number is not None:
            # A static scale: GradScaler starts there and never grows. It still skips a step whose
            # gradients overflowed and halves, where apex would have stepped with inf/NaN.
            options += [f"init_scale={number}", f"growth_interval={NEVER}"]
            harmless |= {"min_loss_scale", "max_loss_scale"}  # apex bounds only a dynamic scale
        elif o0_or_o1 and nodes.is_pure(loss_scale.value):
            init, growth = run_time_scale(loss_scale.value)
            options += [f"init_scale={init}", f"growth_interval={growth}"]
        else:
            unsafe.append(f"loss_scale={nodes.code(loss_scale.value)} may be static; GradScaler is always dynamic (init 2**16)")
    dynamic = not options  # a scale chosen at run time may be static, which apex left unbounded
    if "max_loss_scale" not in harmless and dynamic and cap_number is not None and 0 < cap_number < 2**16:
        options.append(f"init_scale={nodes.code(cap.value)}")  # apex's dynamic scale starts at min(2**16, cap)
    for name in ("min_loss_scale", "max_loss_scale", "num_losses", *NO_NATIVE_OPTION):
        arg = nodes.argument(call, None, name)
        if arg is None or nodes.is_none(arg.value):
            continue
        if (name == "num_losses" and nodes.code(arg.value) == "1") or name in harmless:
            continue
        number = nodes.number_value(arg.value)
        if name == "num_losses":
            merges_losses = True
        elif name in ("min_loss_scale", "max_loss_scale"):
            if name == "min_loss_scale" and number == 0:
                continue  # apex applies a floor only where it is truthy
            if dynamic and number is not None and number > 0:
                bounds = bounds._replace(**{"floor" if name == "min_loss_scale" else "cap": float_text(arg.value)})
                continue
            bound = "cap of its own, may grow past" if name == "max_loss_scale" else "floor of its own, may halve below"
            known = ("known only at run time" if number is None else "not a scale" if number <= 0
                     else "kept only beside a dynamic scale, and the loss scale is chosen at run time")
            unsafe.append(f"`{name}={nodes.code(arg.value)}` is {known}: GradScaler's scale, with no {bound} it")
        else:
            unsafe.append(f"`{name}` has no native equivalent and is dropped")
    if bounds.floor is not None and bounds.cap is None and (cap is None or (cap_number is not None and cap_number >= 2**24)):
        # apex capped the scale at max_loss_scale, 2**24 by default: the one bound line keeps both
        bounds = bounds._replace(cap="2.0**24" if cap is None else float_text(cap.value))
    elif bounds.floor is not None and nodes.number_value(floor_arg := nodes.argument(call, None, "min_loss_scale").value) > cap_number:
        # apex raised an overflowing scale to the floor and capped only a growing one: no one bound holds both
        unsafe.append(f"`min_loss_scale={nodes.code(floor_arg)}` is above `max_loss_scale={nodes.code(cap.value)}`: "
                      "apex raised the scale to the floor after an overflow, past the cap")
        bounds = ScaleBounds()
    return ScalerOptions(options, merges_losses, bounds, unsafe)


def constant_option(expression: str) -> bool:
    """Whether a GradScaler argument's value names nothing (``128.0``, ``2**31 - 1``): one that
    reads the script's variables cannot be moved to another module's top level."""
    try:
        tree = quiet.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return False
    return not any(isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) for node in ast.walk(tree))


# GradScaler's own values: where its scaler is off, what it is given does not matter
_DEFAULTS = {"init_scale": "2.0**16", "growth_interval": "2000", "growth_factor": "2.0", "backoff_factor": "0.5"}


def read_where(arguments: Sequence[str], flags: str) -> list[str]:
    """GradScaler's ``arguments`` for a scaler made before the ``if`` whose test (``flags``) said
    whether apex ran: one read from a section of a config (``params['amp']['loss_scale']``,
    ``cfg.amp.loss_scale``) is read only where it holds, as apex read it (a config without that
    section ran where it did not); an option of the parsed arguments (``args.loss_scale``) is
    always there."""
    found = []
    for argument in arguments:
        name, value = argument.split("=", 1)
        default = _DEFAULTS.get(name)
        found.append(f"{name}=({value}) if {flags} else {default}" if default is not None and _from_a_section(value) else argument)
    return found


def _from_a_section(expression: str) -> bool:
    """Whether ``expression`` reads an item (``params['amp']``) or an attribute of an attribute (``cfg.amp.loss_scale``)."""
    try:
        tree = quiet.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return True
    return any(isinstance(node, ast.Subscript) or isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
               for node in ast.walk(tree))
