"""apex's bounds of a dynamic loss scale (``min_loss_scale``, ``max_loss_scale``), which GradScaler
has not: each ``scaler.update()`` is followed by one putting the scale back within them.

Generated over the ways a script spells it: where the loop lives (the script, a function, a
trainer's method), which bounds and how their numbers are written, a flag around mixed
precision, how the optimizer steps (every iteration, every second one, beside a scheduler on one
line), and a batch whose loss is not finite skipped before its backward pass. Run, the rewrite
keeps apex's scale where the floor stops it halving, and over 2,000 steps where the cap stops
it growing; without the bound it would not."""
from __future__ import annotations

import ast
import itertools

import pytest

from generated.small_scripts import compared, script_head
from migrate.api import migrate_source

HOLDERS = ("script", "function", "method")
BOUNDS = ("floor", "cap", "both")
STEPS = ("every", "accumulate", "one_line")

PRELUDE = script_head('parser.add_argument("--no-amp", dest="amp", action="store_false")\n') + """\
data = torch.randn(64, 8, device=device)
target = torch.randn(64, 1, device=device)
"""

MODELS = """\
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
"""


def _bounds(bounds: str, spelled: str) -> str:
    floor, cap = _numbers(bounds, spelled)
    given = {"floor": [f"min_loss_scale={floor}"], "cap": [f"max_loss_scale={cap}"]}
    return ", ".join(given.get(bounds, given["floor"] + given["cap"]))


def _numbers(bounds: str, spelled: str) -> tuple[str, str]:
    """The floor and the cap as the script writes them: the cap alone under 2**16, where the
    scale starts; beside a floor, a cap the scale starts at and halves from, to the floor."""
    floor = "4096" if spelled == "int" else "2.0**12"
    if bounds == "both":
        return floor, "32768" if spelled == "int" else "32768.0"
    return floor, "512" if spelled == "int" else "512.0"


def _step(p: str, steps: str, skip_nan: bool, flag: bool, overflow_at: str) -> str:
    scaled = [f"with amp.scale_loss(loss, {p}optimizer) as scaled_loss:", "    scaled_loss.backward()"]
    if flag:
        scaled = ["if args.amp:", *("    " + line for line in scaled), "else:", "    loss.backward()"]
    if skip_nan:
        scaled = ["if torch.isnan(loss).any():", "    print('skipped')", "else:", *("    " + line for line in scaled)]
    stepping = {"every": [f"{p}optimizer.step()"],
                "accumulate": ["if (step + 1) % 2 == 0:", f"    {p}optimizer.step()", f"    {p}optimizer.zero_grad()"],
                "one_line": [f"{p}optimizer.step(); {p}scheduler.step()"]}[steps]
    clear = [] if steps == "accumulate" else [f"{p}optimizer.zero_grad()"]
    return "\n".join([
        "start = (step * 16) % 64",
        f"loss = F.mse_loss({p}model(data[start:start + 16]), target[start:start + 16])",
        f"if {overflow_at}:",
        '    loss = loss * float("inf")  # an overflow: apex halves the scale, never below its floor',
        *clear, *scaled, *stepping,
    ]) + "\n"


def _script(holder: str, bounds: str, spelled: str, steps: str, skip_nan: bool, flag: bool) -> str:
    p = "self." if holder == "method" else ""
    overflow_at = "step % 4 == 3" if steps == "accumulate" else "step % 3 == 2"  # the last pass of a step
    options = _bounds(bounds, spelled)
    models = f"{p}model, {p}optimizer"
    initialize = f'{models} = amp.initialize({"model, optimizer" if p else models}, opt_level="O1", {options}, verbosity=0)'
    if flag:
        initialize = f"if args.amp:\n    {initialize}"
    loop = "for step in range(args.steps):\n" + _indent(_step(p, steps, skip_nan, flag, overflow_at), 4)
    report = 'print("final scale", amp.state_dict()["loss_scaler0"]["loss_scale"])\n'
    if holder == "script":
        return PRELUDE + MODELS + initialize + "\n" + loop + report
    if holder == "function":
        return PRELUDE + "\n\ndef main():\n" + _indent(MODELS + initialize + "\n" + loop + report, 4) + "\n\nmain()\n"
    trainer = ("class Trainer:\n    def __init__(self, model, optimizer, scheduler):\n"
               "        self.scheduler = scheduler\n" + _indent(initialize, 8) + "\n"
               "\n    def train(self):\n" + _indent(loop + report, 8))
    return PRELUDE + "\n\n" + trainer + "\n\n" + MODELS + "Trainer(model, optimizer, scheduler).train()\n"


def _indent(text: str, depth: int) -> str:
    return "".join(" " * depth + line if line.strip() else line for line in text.splitlines(keepends=True))


def _bound_expression(bounds: str, spelled: str, scaler: str) -> str:
    floor, cap = (text + ".0" if text.isdigit() else text for text in _numbers(bounds, spelled))
    scale = f"{scaler}.get_scale()"
    if bounds in ("floor", "both"):
        scale = f"max({scale}, {floor})"
    scale = f"min({scale}, {cap if bounds != 'floor' else '2.0**24'})"  # a floor alone keeps apex's default cap
    return f"{scaler}.update({scale})"


VARIANTS = list(itertools.product(HOLDERS, BOUNDS, ("int", "float"), STEPS, (False, True), (False, True)))


@pytest.mark.parametrize(("holder", "bounds", "spelled", "steps", "skip_nan", "flag"), VARIANTS)
def test_each_update_puts_the_scale_back_within_apexs_bounds(holder, bounds, spelled, steps, skip_nan, flag):
    source = _script(holder, bounds, spelled, steps, skip_nan, flag)
    result = migrate_source(source, filename="train.py")
    fixed = result.new_source
    assert fixed and "from apex" not in fixed and "TODO(ampmigrate)" not in fixed, fixed
    ast.parse(fixed)
    scaler = "self.scaler" if holder == "method" else "scaler"
    lines = [line.strip() for line in fixed.splitlines()]
    updates = [i for i, line in enumerate(lines) if line.startswith(f"{scaler}.update()") or f"{scaler}.update();" in line]
    assert updates, fixed
    bound = _bound_expression(bounds, spelled, scaler)
    for at in updates:
        after = [line for line in lines[at + 1:] if not line.startswith("#")]
        assert after[0].replace(" ", "") == bound.replace(" ", "") or bound.replace(" ", "") in lines[at].replace(" ", ""), fixed
    if bounds != "floor":  # apex's dynamic scale starts at min(2**16, cap)
        assert f"init_scale={_numbers(bounds, spelled)[1]}" in fixed, fixed
    again = migrate_source(fixed, filename="train.py")
    assert again.new_source in (None, fixed) and not [d for d in again.diagnostics if d.code.startswith("AMP0")], again.diagnostics


@pytest.mark.parametrize(("options", "why"), [
    ("min_loss_scale=args.floor", "`min_loss_scale=args.floor` is known only at run time"),
    ("max_loss_scale=cfg.cap", "`max_loss_scale=cfg.cap` is known only at run time"),
    ("loss_scale=args.loss_scale, max_loss_scale=512.0", "kept only beside a dynamic scale"),
    ("min_loss_scale=-1.0", "`min_loss_scale=-1.0` is not a scale"),
    ("min_loss_scale=1024.0, max_loss_scale=512.0", "above `max_loss_scale=512.0`"),
])
def test_bounds_the_rewrite_cannot_keep_are_unsafe(options, why):
    source = _script("script", "floor", "float", "every", False, False).replace("min_loss_scale=2.0**12", options)
    result = migrate_source(source, filename="train.py")
    assert result.new_source in (None, source)
    reasons = " ".join(d.fix.why_unsafe or "" for d in result.diagnostics if d.fix)
    assert why in reasons, reasons


@pytest.mark.parametrize("options", ["loss_scale=128.0, min_loss_scale=1.0, max_loss_scale=64.0", "min_loss_scale=0", "max_loss_scale=2.0**24"])
def test_bounds_that_never_apply_are_dropped(options):
    # apex bounds only a dynamic scale, applies a floor only where it is truthy, and caps at 2**24 anyway
    source = _script("script", "floor", "float", "every", False, False).replace("min_loss_scale=2.0**12", options)
    fixed = migrate_source(source, filename="train.py").new_source
    assert fixed and "TODO(ampmigrate)" not in fixed and "get_scale()" not in fixed.split("final scale")[0], fixed


@pytest.mark.parametrize(("options", "bound"), [
    ("min_loss_scale=2.0**12", "min(max(scaler.get_scale(), 2.0**12), 2.0**24)"),  # apex's default cap kept beside
    ("min_loss_scale=2.0**12, max_loss_scale=2.0**30", "min(max(scaler.get_scale(), 2.0**12), 2.0**30)"),
    ("max_loss_scale=2.0**30", None),  # above apex's default: alone, dropped as the default is
])
def test_a_floor_keeps_the_cap_apex_had_beside_it(options, bound):
    source = _script("script", "floor", "float", "every", False, False).replace("min_loss_scale=2.0**12", options)
    fixed = migrate_source(source, filename="train.py").new_source
    assert fixed and "TODO(ampmigrate)" not in fixed, fixed
    updates = [line.strip() for line in fixed.splitlines() if "get_scale()" in line and "final scale" not in line]
    assert updates == ([f"scaler.update({bound})"] if bound else []), fixed


def test_a_bound_given_where_the_scale_is_made_in_another_file_is_unsafe(tmp_path):
    from migrate.api import migrate_paths

    (tmp_path / "setup_amp.py").write_text(
        "from apex import amp\n\n\ndef prepare(model, optimizer):\n"
        '    return amp.initialize(model, optimizer, opt_level="O1", max_loss_scale=512.0)\n')
    (tmp_path / "train.py").write_text(
        "from apex import amp\n\n\ndef step(model, optimizer, x):\n    loss = model(x).sum()\n"
        "    with amp.scale_loss(loss, optimizer) as scaled_loss:\n        scaled_loss.backward()\n    optimizer.step()\n")
    report = migrate_paths([tmp_path], unsafe_fixes=False)
    reasons = " ".join(d.fix.why_unsafe or "" for result in report for d in result.diagnostics if d.fix)
    assert "does not keep them" in reasons, reasons
    assert "from apex import amp" in (tmp_path / "setup_amp.py").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(("holder", "bounds", "steps", "skip_nan", "flag"), [
    ("script", "floor", "every", False, False),
    ("method", "both", "accumulate", True, False),
    ("function", "floor", "one_line", False, True),
])
def test_the_rewrite_keeps_apexs_floor_and_the_unbounded_one_does_not(holder, bounds, steps, skip_nan, flag, tmp_path):
    from ampshim.compare import SAME
    from ampshim.compare.report import as_text

    source = _script(holder, bounds, "float", steps, skip_nan, flag)
    fixed = migrate_source(source, filename="train.py").new_source
    kept = compared(tmp_path, source, fixed, "rewritten")
    assert kept.verdict == SAME, as_text(kept)
    dropped = compared(tmp_path, source, _unbounded(fixed), "unbounded")
    assert dropped.verdict != SAME, as_text(dropped)


def _unbounded(fixed: str) -> str:
    """The rewrite without its bounds: each ``update()`` as GradScaler's alone."""
    return "".join(line for line in fixed.splitlines(keepends=True) if "get_scale()" not in line or "final scale" in line)


@pytest.mark.slow
def test_over_two_thousand_steps_the_rewrite_keeps_apexs_cap(tmp_path):
    # apex doubles a clean scale every 2,000 passes, never past max_loss_scale; a cap under 2**16
    # is also where it starts. The original runs on ampshim, which keeps apex's schedule.
    from ampshim.compare import SAME
    from ampshim.compare.report import as_text

    source = _script("script", "cap", "float", "every", False, False).replace("step % 3 == 2", "step < 0")
    fixed = migrate_source(source, filename="train.py").new_source
    steps = 2010  # one growth: 512 stays under the cap, 1024 without it
    kept = compared(tmp_path, source, fixed, "rewritten", steps=steps, args=("--steps", str(steps)))
    assert kept.verdict == SAME, as_text(kept)
    dropped = compared(tmp_path, source, _unbounded(fixed), "unbounded", steps=steps, args=("--steps", str(steps)))
    assert dropped.verdict != SAME and "1024" in as_text(dropped), as_text(dropped)
