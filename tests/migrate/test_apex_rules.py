"""What the apex rewrites guarantee beyond their examples: one consistent rewrite per file or none,
free names, the checkpoint helper, and safety decided per file."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from migrate.apex_plan import HELPER_SOURCE
from migrate.api import migrate_source
from migrate.rules import all_rules
from migrate.types import Safety


def _migrate(source: str, unsafe_fixes: bool = False):
    result = migrate_source(textwrap.dedent(source), "train.py", unsafe_fixes=unsafe_fixes)
    assert result.error is None, result.error
    return (result.new_source if result.new_source is not None else result.source), result.diagnostics


CANONICAL = """\
    from apex import amp

    model, optimizer = amp.initialize(model, optimizer, opt_level="{level}")
    for x in loader:
        loss = model(x)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""


def _helper():
    namespace: dict = {}
    exec(HELPER_SOURCE, namespace)
    return namespace["_scaler_state_from_apex"]


class _FreshScaler:
    def __init__(self, growth_interval=2000):
        self.growth_interval = growth_interval

    def state_dict(self):
        return {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": self.growth_interval, "_growth_tracker": 0}


def test_checkpoint_helper_turns_apex_state_into_grad_scaler_state():
    convert = _helper()
    state = convert({"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 7}}, _FreshScaler())
    assert state == {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": 7}


def test_checkpoint_helper_keeps_a_static_scale_static():
    state = _helper()({"loss_scaler0": {"loss_scale": 128.0, "unskipped": 7}}, _FreshScaler(2**31 - 1))
    assert state["growth_interval"] == 2**31 - 1


def test_checkpoint_helper_passes_native_state_through():
    native = {"scale": 512.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": 3}
    assert _helper()(native, _FreshScaler()) is native


def test_checkpoint_helper_state_loads_into_a_grad_scaler():
    torch = pytest.importorskip("torch")
    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict(_helper()({"loss_scaler0": {"loss_scale": 256.0, "unskipped": 5}}, scaler))
    assert scaler.state_dict()["scale"] == 256.0
    assert scaler.state_dict()["_growth_tracker"] == 5


def test_checkpoint_helper_keeps_the_scaler_state_for_an_empty_one():
    # a disabled GradScaler saves {}; apex's load_state_dict of an empty dict only warned and kept its scale
    assert _helper()({}, _FreshScaler()) == _FreshScaler().state_dict()


def test_checkpoint_from_a_disabled_scaler_resumes_an_enabled_one():
    torch = pytest.importorskip("torch")
    saved = torch.amp.GradScaler("cpu", enabled=False).state_dict()
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
    scaler.load_state_dict(_helper()(saved, scaler))
    assert scaler.state_dict()["scale"] == 512.0


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_o2_o3_rewrite_is_all_or_nothing_by_default(level):
    source = CANONICAL.format(level=level)
    output, diagnostics = _migrate(source)
    assert output == textwrap.dedent(source), "an unsafe file must not be half-rewritten by default"
    assert {d.code for d in diagnostics} >= {"AMP002", "AMP003"}
    assert all(d.fix is not None and d.fix.applicability.value == "unsafe" for d in diagnostics)
    unsafe_output, _ = _migrate(source, unsafe_fixes=True)
    assert "apex" not in unsafe_output and "scaler.scale(loss).backward()" in unsafe_output


def test_scaler_name_avoids_a_name_already_in_the_file():
    output, _ = _migrate(
        """\
        from apex import amp

        scaler = make_scaler()
        model, optimizer = amp.initialize(model, optimizer)
        for x in loader:
            loss = model(x)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
        """
    )
    assert 'grad_scaler = torch.amp.GradScaler("cuda")' in output
    assert "grad_scaler.scale(loss).backward()" in output and "scaler = make_scaler()" in output


def test_a_file_with_any_unplannable_site_is_only_reported():
    source = """\
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        context = amp.scale_loss(other_loss, optimizer)
        """
    output, diagnostics = _migrate(source, unsafe_fixes=True)
    assert output == textwrap.dedent(source)
    assert [d.code for d in diagnostics].count("AMP003") == 2
    assert all(d.fix is None and "not rewritten" in d.message for d in diagnostics)


def test_missing_optimizer_step_blocks_the_rewrite():
    source = """\
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer)

        def backward(loss):
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        """
    output, diagnostics = _migrate(source, unsafe_fixes=True)
    assert output == textwrap.dedent(source)
    assert any("optimizer.step()" in d.message for d in diagnostics)


def test_initialize_under_a_flag_creates_a_scaler_that_exists_on_every_path():
    output, _ = _migrate(
        """\
        from apex import amp

        if args.fp16:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for x in loader:
            loss = model(x)
            if args.fp16:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
        """
    )
    assert output.startswith('import torch\n\nscaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))\n')
    assert "enabled=scaler.is_enabled()" in output
    assert "    scaler.step(optimizer)\n    scaler.update()\n" in output  # the disabled scaler steps plainly


def test_step_after_a_conditional_backward_keeps_the_plain_path_when_the_scaler_is_always_on():
    output, _ = _migrate(
        """\
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for x in loader:
            loss = model(x)
            if use_amp:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
        """
    )
    assert "    if use_amp:\n        scaler.step(optimizer)\n        scaler.update()\n    else:\n        optimizer.step()\n" in output


def test_two_clips_of_one_optimizer_unscale_once():
    output, _ = _migrate(
        """\
        import torch
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer)
        for x in loader:
            loss = model(x)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            norm = get_grad_norm(amp.master_params(optimizer))
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
            optimizer.step()
        """
    )
    assert output.count("scaler.unscale_(optimizer)") == 1
    assert output.index("scaler.unscale_(optimizer)") < output.index("get_grad_norm(")


def test_the_four_planned_rules_form_one_fix_group():
    groups = {rule.CODE: getattr(rule, "FIX_GROUP", None) for rule in all_rules()}
    assert {groups[code] for code in ("AMP002", "AMP003", "AMP004", "AMP005")} == {"apex.amp"}


def test_every_apex_rule_declares_the_apex_trigger():
    for rule in all_rules():
        if "AMP001" <= rule.CODE <= "AMP019":
            assert "apex" in rule.TRIGGERS, rule


def test_every_renamed_name_is_an_apex_name():
    """The rename rules look up only names an apex import binds: a target outside apex would be missed."""
    from migrate.rules._apex_rename import ApexRename

    renames = [rule for rule in all_rules() if issubclass(rule, ApexRename) and rule._target is ApexRename._target]
    assert len(renames) >= 7
    for rule in renames:
        assert all(target.startswith("apex.") for target in rule.TARGETS), rule


def test_an_apex_name_rebound_through_an_alias_import_is_still_found():
    source = "import apex.optimizers as fast\nopt = fast.FusedAdam(params, lr=1e-3)\n"
    [finding] = migrate_source(source).diagnostics
    assert finding.code == "AMP012" and finding.fix is not None and "torch.optim.AdamW" in finding.fix.message


@pytest.mark.parametrize("selection", [("AMP003",), ("AMP002", "AMP004", "AMP005")])
def test_selecting_part_of_the_fix_group_reports_without_fixing(selection):
    source = textwrap.dedent(CANONICAL.format(level="O1"))
    result = migrate_source(source, "train.py", select=selection)
    assert (result.new_source or source) == source
    assert result.diagnostics and all(d.fix is None for d in result.diagnostics)
    assert all("select AMP002-AMP005 together" in d.message for d in result.diagnostics)


def test_a_computed_opt_level_is_a_safe_rewrite_that_stops_o2_and_o3_runs():
    source = CANONICAL.replace('opt_level="{level}"', "opt_level=cfg.opt_level")
    output, diagnostics = _migrate(source)
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=cfg.opt_level != "O0")' in output
    assert 'torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled())' in output
    assert diagnostics and all(d.fix.applicability.value == "safe" and d.applied for d in diagnostics if d.fix)
    guard = output[output.index("if cfg.opt_level"):output.index("scaler = ")]
    for level, stops in [("O0", False), ("O1", False), ("O2", True), ("O3", True)]:
        cfg = type("Config", (), {"opt_level": level})
        try:
            exec(guard, {"cfg": cfg})
        except RuntimeError as error:
            assert stops and repr(level) in str(error)
        else:
            assert not stops


def test_a_computed_opt_level_that_is_not_pure_stays_unsafe():
    source = CANONICAL.replace('opt_level="{level}"', "opt_level=choose_level()")
    output, diagnostics = _migrate(source)
    assert "from apex import amp" in output
    assert diagnostics and all(d.fix.applicability.value == "unsafe" for d in diagnostics if d.fix)


@pytest.mark.parametrize(
    "setup",
    [
        'opt_level = "O1" if use_mixed_precision else "O0"\n',
        'parser.add_argument("--opt-level", default="O1", choices=["O0", "O1"])\nopt_level = parser.parse_args().opt_level\n',
    ],
)
def test_an_opt_level_that_can_only_be_o0_or_o1_is_a_safe_rewrite(setup):
    source = setup + textwrap.dedent(CANONICAL.replace('opt_level="{level}"', "opt_level=opt_level"))
    output, diagnostics = _migrate(source)
    assert 'enabled=opt_level != "O0"' in output
    assert all(d.fix.applicability.value == "safe" for d in diagnostics if d.fix)


def test_an_opt_level_that_may_be_o2_stays_unsafe():
    source = 'opt_level = "O2" if args.big else "O1"\n' + textwrap.dedent(CANONICAL.replace('opt_level="{level}"', "opt_level=opt_level"))
    output, diagnostics = _migrate(source)
    assert output == source


def test_the_opt_level_setting_makes_a_computed_opt_level_safe():
    source = textwrap.dedent(CANONICAL.replace('opt_level="{level}"', "opt_level=choose_level()"))
    unchanged = migrate_source(source, "train.py")
    assert (unchanged.new_source or source) == source
    result = migrate_source(source, "train.py", settings={"opt-level": "O1"})
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=choose_level() != "O0")' in result.new_source
    assert all(d.fix.applicability.value == "safe" for d in result.diagnostics if d.fix)


@pytest.mark.parametrize("options, safe", [
    ('opt_level="O1", max_loss_scale=2.**24', True),  # apex's default cap: GradScaler has none, and never gets there
    ('opt_level="O1", max_loss_scale=args.max_scale', False),  # a cap known at run time: no bound to write
    ('opt_level="O1", loss_scale=128.0, max_loss_scale=64.0', True),  # a static scale never grows: no cap to keep
    ("opt_level=args.opt_level, keep_batchnorm_fp32=args.keep_bn", True),  # O2/O3 only; they stop at run time
    ('opt_level="O0", master_weights=True', True),
    ('opt_level="O2", keep_batchnorm_fp32=True', False),
    ('opt_level="O1", min_loss_scale=args.floor', False),  # a floor known at run time, maybe None
])
def test_options_dropped_only_where_they_change_nothing(options, safe):
    source = textwrap.dedent(CANONICAL.replace('opt_level="{level}"', options))
    output, diagnostics = _migrate(source, unsafe_fixes=True)
    assert "from apex import" not in output
    fixes = {d.fix.applicability.value for d in diagnostics if d.fix}
    assert fixes == ({"safe"} if safe else {"unsafe"})


def test_a_cap_below_the_start_starts_the_scaler_there_and_bounds_each_update():
    # apex's dynamic scale starts at min(2**16, max_loss_scale) and never grows past the cap
    source = CANONICAL.replace('opt_level="{level}"', 'opt_level="O1", max_loss_scale=512.0')
    output, diagnostics = _migrate(source)
    assert 'scaler = torch.amp.GradScaler("cuda", init_scale=512.0)' in output
    assert "scaler.update()\n    # apex's max_loss_scale=512.0\n    scaler.update(min(scaler.get_scale(), 512.0))\n" in output
    assert all(d.fix.applicability.value == "safe" for d in diagnostics if d.fix)


def test_a_run_time_loss_scale_picks_the_scalers_start_and_growth_at_run_time():
    # A CLI default of 1 (a static scale under apex) must run, not stop at a guard.
    source = CANONICAL.replace('opt_level="{level}"', "opt_level=args.opt_level, loss_scale=args.loss_scale")
    output, diagnostics = _migrate(source)
    assert "from apex import" not in output
    assert all(d.fix.applicability.value == "safe" for d in diagnostics if d.fix)
    checks = output[output.index("if args"):output.index("for x in loader")]

    class _Torch:
        class amp:
            @staticmethod
            def GradScaler(device, **options):
                return options

    for level, scale, expected in [("O1", None, (2.0**16, 2000)), ("O1", "dynamic", (2.0**16, 2000)),
                                   ("O1", 1, (1.0, 2**31 - 1)), ("O1", "128", (128.0, 2**31 - 1)),
                                   ("O2", None, RuntimeError)]:
        namespace = {"args": type("Args", (), {"opt_level": level, "loss_scale": scale}), "torch": _Torch}
        try:
            exec(checks, namespace)
        except RuntimeError:
            assert expected is RuntimeError, (level, scale)
            continue
        options = namespace["scaler"]
        assert (options["init_scale"], options["growth_interval"]) == expected, (level, scale)
        assert options["enabled"] == (level != "O0")


BRANCHED_CLIP = """\
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x in loader:
    loss = model(x)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    if clip:
        norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    else:
        norm = grad_norm(amp.master_params(optimizer))
    optimizer.step()
"""


def test_every_branch_reading_gradients_unscales_once():
    output, _ = _migrate(BRANCHED_CLIP)
    lines = [line.strip() for line in output.splitlines()]
    assert lines.count("scaler.unscale_(optimizer)") == 2  # one per branch
    for index, line in enumerate(lines):
        if "grad_norm(" in line:
            assert lines[index - 1] == "scaler.unscale_(optimizer)"


SKIP_AFTER_THE_CLIP = """\
import math
import torch
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x in loader:
    loss = model(x)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    if not math.isfinite(norm):
        optimizer.zero_grad()
        continue
    optimizer.step()
"""


def test_an_iteration_that_may_end_before_the_step_is_not_unscaled_and_is_unsafe():
    # `unscale_` there, with no `update()` on the skipping path, fails on the next iteration; and
    # natively the skipping path never lowers the scale, which apex did as `scale_loss` exited.
    safe, diagnostics = _migrate(SKIP_AFTER_THE_CLIP)
    assert safe == SKIP_AFTER_THE_CLIP
    reasons = {d.fix.why_unsafe for d in diagnostics if d.fix}
    assert all("the iteration may end at line 13 (`continue`)" in reason for reason in reasons)
    output, _ = _migrate(SKIP_AFTER_THE_CLIP, unsafe_fixes=True)
    assert "unscale_" not in output
    assert "1.0*scaler.get_scale(),)/scaler.get_scale()" in "".join(output.split())  # one argument a line


@pytest.mark.parametrize("leaving", ["return", "break", "continue"])
def test_leaving_after_the_read_is_seen_in_any_statement_on_the_way(leaving):
    source = SKIP_AFTER_THE_CLIP.replace("continue", leaving)
    _, diagnostics = _migrate(source)
    assert all(d.fix.applicability.value == "unsafe" for d in diagnostics if d.fix)


def test_a_continue_of_a_loop_over_the_parameters_does_not_end_the_iteration():
    source = SKIP_AFTER_THE_CLIP.replace(
        "    norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)\n"
        "    if not math.isfinite(norm):\n        optimizer.zero_grad()\n        continue\n",
        "    total = 0.0\n    for p in amp.master_params(optimizer):\n        if p.grad is None:\n"
        "            continue\n        total += p.grad.norm() ** 2\n",
    )
    output, diagnostics = _migrate(source)
    assert all(d.fix.applicability.value == "safe" for d in diagnostics if d.fix)
    assert "    total = 0.0\n    scaler.unscale_(optimizer)\n    for p in" in output


def test_gradients_read_after_a_nested_unscale_are_reported_not_unscaled_twice():
    # The step is in another function: each master_params consumer is unscaled where it is.
    source = textwrap.dedent("""\
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")


        def backward(loss):
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            if clip:
                norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
            total = grad_norm(amp.master_params(optimizer))


        def update():
            optimizer.step()
        """)
    output, diagnostics = _migrate(source, unsafe_fixes=True)
    assert output == source
    assert any("unscale once, by hand" in d.message for d in diagnostics)


GRADIENTS_READ_BEFORE_STEP = """\
import torch
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for step, (x, y) in enumerate(loader):
    loss = model(x)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    norms = [p.grad.norm() for p in model.parameters()]
    optimizer.step()
"""


def test_gradients_read_before_the_step_are_unscaled_first():
    # apex unscaled when scale_loss exited: clipping model.parameters() saw true gradients.
    output, diagnostics = _migrate(GRADIENTS_READ_BEFORE_STEP)
    lines = [line.strip() for line in output.splitlines()]
    unscale = lines.index("scaler.unscale_(optimizer)")
    assert lines[unscale - 1] == "scaler.scale(loss).backward()"
    assert lines[unscale + 1].startswith("torch.nn.utils.clip_grad_norm_(model.parameters()")
    assert lines.count("scaler.unscale_(optimizer)") == 1
    assert all(d.applied for d in diagnostics)


def test_gradients_read_where_the_step_may_not_follow_make_the_fix_unsafe():
    # Read at every micro-step, stepped every fourth: natively the grads cannot be unscaled there.
    source = GRADIENTS_READ_BEFORE_STEP.replace(
        "    optimizer.step()\n", "    if (step + 1) % 4 == 0:\n        optimizer.step()\n"
    )
    output, diagnostics = _migrate(source)
    assert output == source
    assert any("does not always follow" in (d.fix.why_unsafe if d.fix else "") for d in diagnostics)
    output, _ = _migrate(source, unsafe_fixes=True)
    assert "scaler.unscale_" not in _code_only(output)


def test_gradients_read_between_two_scaled_backward_passes_make_the_fix_unsafe():
    source = GRADIENTS_READ_BEFORE_STEP.replace(
        "    optimizer.step()\n",
        "    with amp.scale_loss(loss * 2, optimizer) as scaled_loss:\n        scaled_loss.backward()\n    optimizer.step()\n",
    )
    output, diagnostics = _migrate(source)
    assert output == source
    assert any("gradients are read between two scaled backward passes" in (d.fix.why_unsafe if d.fix else "") for d in diagnostics)


def test_min_loss_scale_beside_a_static_scale_is_dropped_safely():
    # apex bounds only a dynamic scale: with loss_scale=1024.0 the floor never applies.
    source = CANONICAL.format(level="O1").replace('opt_level="O1"', 'opt_level="O1", loss_scale=1024.0, min_loss_scale=1.0')
    output, diagnostics = _migrate(source)
    assert 'GradScaler("cuda", init_scale=1024.0, growth_interval=2**31 - 1)' in output
    assert all(d.applied for d in diagnostics)


def test_a_floor_known_only_at_run_time_is_unsafe():
    source = CANONICAL.format(level="O1").replace('opt_level="O1"', 'opt_level="O1", min_loss_scale=args.floor')
    output, diagnostics = _migrate(source)
    assert output == textwrap.dedent(source)
    assert any("`min_loss_scale=args.floor` is known only at run time" in d.fix.why_unsafe for d in diagnostics if d.fix)


def test_a_floor_beside_a_loss_scale_chosen_at_run_time_is_unsafe():
    # a static scale chosen at run time: apex left it unbounded, the bound would change it
    source = CANONICAL.format(level="O1").replace('opt_level="O1"', 'opt_level="O1", loss_scale=args.loss_scale, min_loss_scale=1.0')
    output, diagnostics = _migrate(source)
    assert output == textwrap.dedent(source)
    assert any("kept only beside a dynamic scale" in d.fix.why_unsafe for d in diagnostics if d.fix)


def test_opt_level_zero_one_is_read_as_o1_and_says_so():
    source = CANONICAL.format(level="01")
    output, diagnostics = _migrate(source)
    assert "GradScaler" in output
    assert all(d.applied and "read as 'O1'" in d.fix.message for d in diagnostics if d.fix)


def test_a_scaler_created_inside_a_block_of_another_function_has_a_disabled_stand_in():
    source = """\
        import torch
        from apex import amp


        def setup(model, optimizer, args):
            if args.fp16 and not args.resumed:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                args.resumed = True
            return model, optimizer


        def train_step(model, optimizer, batch):
            loss = model(batch)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
        """
    output, diagnostics = _migrate(source)
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=False)  # until `setup()` runs' in output
    assert "global scaler" in output
    assert 'with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):' in output
    assert all(d.applied for d in diagnostics if d.fix)
    compile(output, "train.py", "exec")


def test_a_forward_pass_the_rewrite_cannot_see_stays_reported_after_the_fix():
    source = """\
        import torch
        from apex import amp


        class Learner:
            def __init__(self, model, optimizer):
                self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

            def update(self, loss):
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
                self.optimizer.step()
        """
    output, diagnostics = _migrate(source)
    assert output == textwrap.dedent(source)  # autocast cannot be placed here: unsafe
    output, _ = _migrate(source, unsafe_fixes=True)
    assert "# TODO(ampmigrate): compute `loss` (the forward pass) under" in output
    assert "#   torch.autocast" in output  # wrapped to the line length
    result = migrate_source(output, "train.py")
    assert [d.code for d in result.diagnostics] == ["AMP017"]
    assert result.new_source == output


def test_loss_ids_merged_into_one_scaler_update_it_once_per_iteration():
    # both loss ids step both optimizers: no GradScaler per loss id can unscale them (``per_loss``)
    source = """\
        from apex import amp

        [netD, netG], [optD, optG] = amp.initialize([netD, netG], [optD, optG], opt_level="O1", num_losses=2)
        for real, noise in loader:
            lossD = netD(real).mean() - netD(netG(noise).detach()).mean()
            with amp.scale_loss(lossD, [optD, optG], loss_id=0) as scaled:
                scaled.backward()
            optD.step()
            lossG = -netD(netG(noise)).mean()
            with amp.scale_loss(lossG, [optG, optD], loss_id=1) as scaled:
                scaled.backward()
            optG.step()
        """
    output, diagnostics = _migrate(source)
    assert output == textwrap.dedent(source)  # apex kept a scaler per loss: unsafe
    output, _ = _migrate(source, unsafe_fixes=True)
    lines = [line.strip() for line in output.splitlines()]
    assert lines.count("scaler.update()") == 1
    assert lines[-2:] == ["scaler.step(optG)", "scaler.update()"]


def test_amp_stored_on_an_object_other_code_receives_is_left_alone():
    """``model.amp = amp`` (or ``args.amp``) goes wherever the object goes, other files included,
    which would go on handing the module to code rewritten to expect a GradScaler: no rewrite,
    not even unsafe, and the line says why."""
    source = """\
        import torch
        from apex import amp


        def attach(model, optimizer):
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            model.amp = amp
            return model, optimizer


        def step(model, optimizer, batch, amp=None):
            loss = model(batch)
            if amp:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()


        def save(model):
            torch.save({"amp": model.amp.state_dict()}, "last.pt")
        """
    output, diagnostics = _migrate(source)
    assert output == textwrap.dedent(source)
    assert any("passed on or stored here" in d.message for d in diagnostics)
    output, _ = _migrate(source, unsafe_fixes=True)
    assert output == textwrap.dedent(source)


# Shapes that once crashed the rewrite or changed training in safe mode.

def test_an_opt_level_read_from_a_dict_gets_a_check_that_compiles_before_python_3_12():
    source = CANONICAL.format(level="O1").replace('opt_level="O1"', 'opt_level=cfg["opt_level"], loss_scale=cfg["loss_scale"]')
    output, diagnostics = _migrate(source)
    # over two lines where one would be too long: the `%` applies to the whole, joined, string
    assert ('"opt_level %r: migrated from apex for O0 and O1; "\n        "native torch.amp has no O2/O3" % (cfg["opt_level"],)'
            in output)
    assert "f\"" not in output  # no f-string: `cfg["opt_level"]` cannot sit in one before Python 3.12
    namespace = {"cfg": {"opt_level": "O2"}}
    check = output[output.index("if cfg"):output.index("    )\n") + 6]
    with pytest.raises(RuntimeError, match="opt_level 'O2': migrated from apex for O0 and O1; native torch.amp has no O2/O3"):
        exec(compile(check, "check", "exec"), namespace)
    assert all(d.applied for d in diagnostics if d.fix)


def test_a_loss_over_several_lines_gives_a_one_line_todo():
    source = """\
        from apex import amp
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        with amp.scale_loss(criterion(model(x),
                                      y), optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        """
    output, _ = _migrate(source, unsafe_fixes=True)
    assert "# TODO(ampmigrate): compute `criterion(model(x), y)` (the forward pass)" in output


@pytest.mark.parametrize(
    "shape",
    [
        # a test with a call picks the scaled or the plain backward: the step cannot test it again
        "    if coin.flip():\n        with amp.scale_loss(loss, optimizer) as scaled_loss:\n            scaled_loss.backward()\n"
        "    else:\n        loss.backward()\n    optimizer.step()\n",
        # a plain backward in the same pass: apex kept those gradients, scaler.step would divide them
        "    model.aux_loss(x).backward()\n    with amp.scale_loss(loss, optimizer) as scaled_loss:\n        scaled_loss.backward()\n"
        "    optimizer.step()\n",
        # a step in another branch may run before anything was scaled
        "    if i % 2:\n        with amp.scale_loss(loss, optimizer) as scaled_loss:\n            scaled_loss.backward()\n"
        "    else:\n        optimizer.step()\n",
        # a step in `finally:` also runs where the forward raised
        "    try:\n        with amp.scale_loss(loss, optimizer) as scaled_loss:\n            scaled_loss.backward()\n"
        "    finally:\n        optimizer.step()\n",
    ],
    ids=["computed-branch", "plain-backward-before", "step-in-other-branch", "step-in-finally"],
)
def test_shapes_the_scaler_cannot_follow_are_not_rewritten_by_default(shape):
    source = 'from apex import amp\nmodel, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
    source += "for i, x in enumerate(loader):\n    loss = model(x)\n" + shape
    output, diagnostics = _migrate(source)
    assert output == source
    assert diagnostics


def test_initialize_under_a_once_only_test_in_a_loop_is_not_read_as_a_flag():
    source = """\
        from apex import amp
        for epoch in range(epochs):
            if epoch == 0:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x in loader:
                loss = model(x)
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
        """
    output, _ = _migrate(source)
    assert "enabled=epoch == 0" not in output


def test_the_scaled_loss_read_after_the_block_stays_bound():
    source = CANONICAL.format(level="O1").replace("    optimizer.step()\n", "    print(scaled_loss.item())\n    optimizer.step()\n")
    output, _ = _migrate(source)
    assert "scaled_loss = scaler.scale(loss)" in output


def test_a_scaler_created_in_the_main_block_has_a_module_level_stand_in():
    source = """\
        from apex import amp

        def train(model, optimizer, x):
            loss = model(x)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()

        if __name__ == "__main__":
            if args.fp16:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            train(model, optimizer, x)
        """
    output, _ = _migrate(source)
    assert output.index('scaler = torch.amp.GradScaler("cuda", enabled=False)') < output.index("def train")


def test_a_scaler_created_in_an_optional_method_exists_from_construction():
    source = """\
        from apex import amp

        class Trainer:
            def __init__(self, model, optimizer):
                super().__init__()
                self.model, self.optimizer = model, optimizer

            def enable_amp(self):
                self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")

            def step(self, x):
                loss = self.model(x)
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
                self.optimizer.step()
        """
    output, diagnostics = _migrate(source)
    lines = [line.strip() for line in output.splitlines()]
    init = lines.index("super().__init__()")
    assert lines[init + 1] == 'self.scaler = torch.amp.GradScaler("cuda", enabled=False)  # until `enable_amp()` runs'
    assert 'with torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler.is_enabled()):' in lines
    assert all(d.applied for d in diagnostics if d.fix)


def test_autocast_does_not_stay_on_across_a_yield():
    source = """\
        from apex import amp
        def steps(model, optimizer, loader):
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x in loader:
                out = model(x)
                yield out
                loss = out.mean()
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
        """
    output, _ = _migrate(source, unsafe_fixes=True)
    lines = [line.strip() for line in output.splitlines()]
    assert lines[lines.index("yield out") + 1].startswith("with torch.autocast(")


def test_a_look_alike_module_named_amp_is_not_reported():
    result = migrate_source("import mylib\nwith mylib.amp.scale_loss(loss, opt) as s:\n    s.backward()\n", "x.py")
    assert result.diagnostics == ()


def test_a_file_whose_only_amp_like_call_is_a_model_state_dict_is_left_alone():
    result = migrate_source("use_amp = True\nsd = model.state_dict()\n", "x.py")
    assert result.error is None and result.diagnostics == ()


def test_o0_under_a_flag_with_an_else_is_removed_without_a_scaler():
    source = """\
        from apex import amp

        def train(model, optimizer, loader):
            if FLAGS.fp16:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O0")
            else:
                pass
            for x in loader:
                with amp.scale_loss(model(x), optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
        """
    output, diagnostics = _migrate(source)
    assert "GradScaler" not in output and "amp" not in output
    assert "model(x).backward()" in output
    assert all(d.applied for d in diagnostics if d.fix)


def test_an_if_left_empty_by_the_import_removal_goes_and_a_users_own_stays():
    source = """\
        import torch
        if DEBUG:
            pass
        if use_amp:
            from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for x in loader:
            loss = model(x)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
        """
    output, _ = _migrate(source)
    assert "if DEBUG:\n    pass\n" in output
    assert "use_amp" not in output


def _unused_import_fixes(source: str, filename: str):
    result = migrate_source(textwrap.dedent(source), filename, unsafe_fixes=False)
    assert result.error is None, result.error
    return [d for d in result.diagnostics if d.code == "AMP001"], result


def test_an_unused_apex_import_in_a_module_is_removed_safely():
    found, result = _unused_import_fixes("import torch\nfrom apex import optimizers\n\nopt = torch.optim.SGD(p)\n", "train.py")
    assert [d.fix.applicability.value for d in found] == ["safe"]
    assert "`from apex import optimizers` is never used" in found[0].message
    assert result.new_source == "import torch\n\nopt = torch.optim.SGD(p)\n"


def test_an_unused_apex_import_in_a_packages_init_may_be_imported_by_other_modules():
    source = "from .layers import Block\nfrom apex.normalization import FusedLayerNorm\n"
    found, result = _unused_import_fixes(source, "pkg/__init__.py")
    assert [d.fix.applicability.value for d in found] == ["unsafe"]
    assert "other modules may import `FusedLayerNorm`" in found[0].fix.why_unsafe
    assert result.new_source in (None, result.source)
    fixed = migrate_source(source, "pkg/__init__.py", unsafe_fixes=True)
    assert fixed.new_source == "from .layers import Block\n"


@pytest.mark.parametrize(
    "used",
    [
        "model.amp = amp\n",  # stored for later: the name is read
        "print(f'{amp}')\n",
        "handle = globals()['amp']\n",
        "def f():\n    return amp.scale_loss\n",
        "del amp\n",
    ],
)
def test_an_apex_import_read_anywhere_is_not_reported_unused(used):
    found, _ = _unused_import_fixes("from apex import amp\n" + used, "train.py")
    assert not [d for d in found if "never used" in d.message]


def test_a_name_spelled_only_as_an_attribute_does_not_keep_an_unused_import():
    found, result = _unused_import_fixes("import torch\nfrom apex import amp\n\nuse = args.amp\nmodel.amp = True\n", "train.py")
    assert [d.fix.applicability.value for d in found] == ["safe"]
    assert result.new_source == "import torch\n\nuse = args.amp\nmodel.amp = True\n"


def test_a_dead_guard_left_by_an_unused_import_goes_with_it():
    source = """\
        import torch
        try:
            from apex.parallel import DistributedDataParallel as DDP
        except ImportError:
            print("apex is not installed")

        model = torch.nn.parallel.DistributedDataParallel(model)
    """
    _, result = _unused_import_fixes(source, "train.py")
    assert result.new_source == "import torch\n\nmodel = torch.nn.parallel.DistributedDataParallel(model)\n"


def test_an_unused_apex_import_named_only_in_a_message_is_reported():
    source = 'import torch\ntry:\n    import apex\nexcept ImportError:\n    raise ImportError("Please install apex from github")\n'
    found, result = _unused_import_fixes(source, "train.py")
    # the import's removal, and the next round's of the `try` it leaves guarding nothing
    assert [(d.fix.message, d.fix.applicability.value) for d in found] == [
        ("Remove the unused import", "safe"), ("Replace the `try` statement by its body", "safe")]
    assert result.new_source == "import torch\n"


def test_comments_ending_the_rewritten_lines_are_kept():
    output, _ = _migrate("""\
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")  # TODO: try O2 again
        for x in loader:
            loss = model(x)
            with amp.scale_loss(loss, optimizer) as scaled_loss:  # apex handles overflow
                scaled_loss.backward()  # backprop
            optimizer.step()
        """)
    assert 'scaler = torch.amp.GradScaler("cuda")  # TODO: try O2 again\n' in output
    assert "    # backprop\n    scaler.scale(loss).backward()  # apex handles overflow\n" in output


def test_comments_between_the_lines_of_initialize_go_above_the_scaler():
    output, _ = _migrate("""\
        from apex import amp

        # mixed precision
        model, optimizer = amp.initialize(
            model, optimizer,
            opt_level="O1",  # O2 diverged
            # loss_scale=128.0,
        )  # TODO: try O2 again
        for x in loader:
            loss = model(x)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
        """)
    assert ('# mixed precision\n# O2 diverged\n# loss_scale=128.0,\n'
            'scaler = torch.amp.GradScaler("cuda")  # TODO: try O2 again\n') in output


@pytest.mark.parametrize("options", [
    "delay_allreduce=True", "delay_allreduce=args.delay, message_size=2**22", "delay_allreduce=False, num_allreduce_streams=1",
    "message_size=10000000, prof=False",
])
def test_apex_ddp_overlap_options_go_and_unused_parameters_stay_tolerated(options):
    # apex bucketed only the parameters the first backward reached (or, delayed, whatever got a
    # gradient): torch's DDP allows parameters without one only with find_unused_parameters.
    output, diagnostics = _migrate(f"import apex\nmodel = apex.parallel.DistributedDataParallel(model, {options})\n")
    [ddp] = [d for d in diagnostics if d.code == "AMP010"]
    assert ddp.fix.applicability is Safety.SAFE and ddp.applied
    # and buffers stay each rank's own, as apex left them (wrapped past 88 characters)
    assert "model = torch.nn.parallel.DistributedDataParallel(\n    model, find_unused_parameters=True, broadcast_buffers=False\n)\n" in output


_UNUSED_PARAMETER = """
import os
import tempfile

import torch
import torch.distributed as dist
from apex.parallel import DistributedDataParallel as DDP


class WithPooler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.pooler = torch.nn.Linear(4, 4)  # computed, never reaches the loss

    def forward(self, x):
        hidden = self.body(x)
        self.pooler(hidden)
        return hidden


dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
model = DDP(WithPooler())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
print("trained")
dist.destroy_process_group()  # gloo's threads left to interpreter exit can abort it
"""


def test_apex_ddp_rewrite_trains_a_model_with_a_parameter_the_loss_never_uses(tmp_path):
    """Run: before, the rewrite gave torch's DDP no `find_unused_parameters` and the second
    iteration raised (apex's DDP trained such a model)."""
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not built in")
    output, _ = _migrate(_UNUSED_PARAMETER)
    assert "from apex" not in output
    script = tmp_path / "train.py"
    script.write_text(output)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "trained" in run.stdout, run.stderr[-2000:]


def test_apex_ddp_options_that_change_the_maths_are_named_plainly():
    _, diagnostics = _migrate("import apex\nmodel = apex.parallel.DistributedDataParallel(model, gradient_predivide_factor=8.0)\n")
    [ddp] = [d for d in diagnostics if d.code == "AMP010"]
    assert ddp.fix is None and ddp.message.endswith("`gradient_predivide_factor` has no native equivalent")


def test_apex_only_arguments_are_named_plainly():
    source = ("from apex.optimizers import FusedAdam\n"
              "from apex.parallel import SyncBatchNorm\n"
              "opt = FusedAdam(params, lr=1e-3, master_weights=True)\n"
              "norm = SyncBatchNorm(64, channel_last=True, fuse_relu=True)\n")
    _, diagnostics = _migrate(source)
    adam, norm = sorted((d for d in diagnostics if d.code in ("AMP012", "AMP011")), key=lambda d: d.location.row)
    assert adam.message.endswith("not rewritten: `master_weights` has no native equivalent")
    assert norm.message.endswith("not rewritten: `channel_last`, `fuse_relu` have no native equivalent")


@pytest.mark.parametrize("head", ["from apex.fp16_utils import to_python_float\n", "from apex.fp16_utils import *\n"])
def test_to_python_float_is_told_its_native_spelling_not_fp16_optimizers(head):
    _, diagnostics = _migrate(head + "value = to_python_float(loss)\nmodel = network_to_half(model)\n")
    found = {d.location.row: d.message for d in diagnostics if d.code == "AMP015"}
    assert found[2].endswith("`t.item()` is what it returns for a tensor: use that in place of `to_python_float(t)`")
    if "*" in head:  # the rest of the package keeps its own advice
        assert "`network_to_half` with autocast" in found[3]


def _code_only(text: str) -> str:
    """``text`` without its comment lines (a marker may name a call the rewrite did not make)."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def test_amp_handed_on_where_it_may_be_none_stays_none_when_off():
    """``else: amp = None`` then ``train(..., amp)``: the receiver tests ``if amp:``; a disabled
    GradScaler would pass that test where apex was off, so None is handed on there."""
    source = """\
        import torch


        def train(model, optimizer, loader, amp):
            for x in loader:
                loss = model(x).sum()
                if amp:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()


        def main(model, optimizer, loader, level):
            if level == "O1":
                from apex import amp
                model, optimizer = amp.initialize(model, optimizer, opt_level=level)
            else:
                amp = None
            train(model, optimizer, loader, amp)
        """
    output, _ = _migrate(source, unsafe_fixes=True)
    assert "    train(model, optimizer, loader, scaler if scaler.is_enabled() else None)\n" in output
    assert "from apex import" not in output


def test_a_flag_block_preparing_the_models_still_makes_the_scaler_before_it():
    """The block sets the models ``initialize`` takes, not the options the scaler is made from:
    the scaler still goes before the ``if``, enabled by its flag, and the rewrite is safe."""
    source = """\
        from apex import amp


        def train(model, optimizer, loader, fp16):
            if fp16:
                model = model.cuda()
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x in loader:
                loss = model(x).sum()
                if fp16:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()
        """
    output, diagnostics = _migrate(source)
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=bool(fp16))\n    if fp16:\n' in output
    assert all(d.applied for d in diagnostics if d.fix)


@pytest.mark.parametrize("decorator, cast", [("float_function", "float32"), ("half_function", "float16"),
                                             ("bfloat16_function", "bfloat16")])
@pytest.mark.parametrize("params", ["x", "q, k", "self, x, scale=2.0, *, bias=None"])
def test_a_cast_decorator_on_a_plain_function_casts_its_floating_cuda_inputs_at_entry_where_autocast_is_on(decorator, cast, params):
    """apex cast the floating-point CUDA arguments where O1 was on (its ops left to O1's casts):
    the rewrite does so where autocast is on. Run with a stand-in for torch (no CUDA here)."""
    names = [p.split("=")[0].strip() for p in params.split(",") if p.strip() not in ("*", "self")]
    source = (f"from apex import amp\n\n\n@amp.{decorator}\ndef f({params}):\n"
              f"    return {', '.join(names)}\n")
    output, diagnostics = _migrate(source)
    assert "apex import" not in output and f"# as apex's @amp.{decorator} did" in output and all(d.applied for d in diagnostics)

    class Tensor:
        def __init__(self, dtype, cuda=True, floating=True):
            self.dtype, self.is_cuda, self.floating = dtype, cuda, floating

        def is_floating_point(self):
            return self.floating

        def float(self):
            return Tensor("float32", self.is_cuda)

        def half(self):
            return Tensor("float16", self.is_cuda)

        def bfloat16(self):
            return Tensor("bfloat16", self.is_cuda)

    for enabled in (True, False):
        torch = type("torch", (), {"Tensor": Tensor, "is_autocast_enabled": staticmethod(lambda device, on=enabled: on)})
        namespace = {}
        exec(compile(output.replace("import torch\n", ""), "rewritten", "exec"), {"torch": torch}, namespace)
        inputs = {name: Tensor("float64") for name in names}
        inputs[names[-1]] = Tensor("int64", floating=False)  # not floating: apex left it alone
        args = ([None] if params.startswith("self") else []) + [inputs[n] for n in names if n != "bias"]
        got = namespace["f"](*args, **({"bias": inputs["bias"]} if "bias" in inputs else {}))
        got = got if isinstance(got, tuple) else (got,)
        expected = [cast if enabled and n != names[-1] else inputs[n].dtype for n in names]
        assert [t.dtype for t in got] == expected


@pytest.mark.parametrize("imported", ["from timm.utils import ApexScaler", "from timm.utils import *",
                                      "from timm.utils import ApexScaler as Scaler"])
def test_timms_apex_scaler_keeps_initialize_where_it_is(imported):
    """timm's ``ApexScaler()`` calls ``amp.scale_loss`` itself: with ``initialize`` rewritten
    away, every mixed-precision step raised (even unsafe). The file is only reported."""
    scaler = "Scaler" if " as " in imported else "ApexScaler"
    source = textwrap.dedent(f"""\
        from apex import amp
        {imported}


        def setup(model, optimizer, use_amp):
            loss_scaler = None
            if use_amp == "apex":
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                loss_scaler = {scaler}()
            return model, optimizer, loss_scaler
        """)
    result = migrate_source(source, filename="train.py", unsafe_fixes=True)
    assert result.new_source == source
    assert any("timm's `ApexScaler`" in d.message for d in result.diagnostics)


def test_a_subclass_handing_its_apex_base_apex_only_arguments_keeps_its_base():
    """``super().__init__(module, message_size=..., delay_allreduce=...)``: torch's DDP takes
    neither, so swapping the base would raise where the class is made."""
    source, diagnostics = _migrate("""\
        from apex.parallel import DistributedDataParallel


        class ApexDDP(DistributedDataParallel):
            def __init__(self, module, message_size=1e8, delay_allreduce=True):
                super().__init__(module, message_size=message_size, delay_allreduce=delay_allreduce)
                self.callback_queued = False
    """, unsafe_fixes=True)
    assert "from apex.parallel import DistributedDataParallel" in source
    assert any("`ApexDDP` subclasses it" in d.message for d in diagnostics)


@pytest.mark.parametrize("init", ["super().__init__(hidden_size, eps=eps)", "FusedLayerNorm.__init__(self, hidden_size, eps=eps)"])
def test_a_subclass_whose_base_takes_the_same_arguments_natively_changes_its_base(init):
    source, _ = _migrate(f"""\
        from apex.normalization import FusedLayerNorm


        class BertLayerNorm(FusedLayerNorm):
            def __init__(self, hidden_size, eps=1e-12):
                {init}
    """)
    assert "class BertLayerNorm(torch.nn.LayerNorm):" in source and "apex" not in source


_HALF_EVALUATION = """\
    import torch
    from apex import amp


    def validate(model, loader):
        model.eval()
        model{cast}
        with torch.no_grad():
            return [model(x).argmax(1) for x in loader]


    def main(model, optimizer, train_loader, val_loader):
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for step, (images, labels) in enumerate(train_loader):
            outputs = model(images)
            loss = torch.nn.functional.cross_entropy(outputs, labels)
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
            optimizer.step()
        return validate(model, val_loader)
"""


@pytest.mark.parametrize("cast", [".half()", ".to(torch.float16)"])
def test_a_model_cast_to_float16_leaves_initialize_to_a_person(cast):
    """apex's O1 casts let a float16 model take float32 inputs in the evaluation pass too; native
    autocast covers the training step only, and the float16 model then fails on float32 inputs:
    even the unsafe rewrite would crash there, so the file is reported, not rewritten."""
    for unsafe_fixes in (False, True):
        source, diagnostics = _migrate(_HALF_EVALUATION.format(cast=cast), unsafe_fixes=unsafe_fixes)
        assert "amp.initialize(model, optimizer" in source and "amp.scale_loss" in source
        assert any("casts a model to float16" in d.message for d in diagnostics if d.code == "AMP002")


def test_an_input_cast_to_float16_outside_every_autocast_makes_the_rewrite_unsafe():
    """``model(x.half())`` in an evaluation after training: apex O1 cast the float32 weights' op
    inputs, natively the pass raises outside autocast. The safe run leaves the file; the unsafe
    one marks the line (it used to be rewritten as safe, and crashed at the evaluation)."""
    half = _HALF_EVALUATION.format(cast=".eval()").replace("model(x).argmax(1)", "model(x.half()).argmax(1)")
    source, _ = _migrate(half)
    assert "amp.initialize(model, optimizer" in source
    source, _ = _migrate(half, unsafe_fixes=True)
    assert "amp.initialize" not in source
    assert "# TODO(ampmigrate): run it under `torch.autocast`" in source.partition("return [model(x.half())")[0], source


def test_an_if_left_holding_only_a_fixs_todo_keeps_it():
    """``if fp16: from apex import amp; model = amp.initialize(model, ...)``: the unsafe fix's TODO
    is all that says fp16 runs changed; the emptied ``if`` stays to hold it."""
    source, _ = _migrate("""\
        import torch


        def load(fp16=False):
            model = torch.nn.Linear(2, 2)
            if fp16:
                from apex import amp
                model = amp.initialize(model, opt_level="O1")
            return model
    """, unsafe_fixes=True)
    assert "    if fp16:\n        # TODO(ampmigrate)" in source and "import" not in source.replace("import torch", "")


def test_the_marker_for_a_model_handed_in_a_list_names_the_model():
    source, _ = _migrate("""\
        import torch


        class Evaluator:
            def __init__(self, model, fp16=False, level="O1"):
                self.model = model
                if fp16:
                    from apex import amp
                    [self.model] = amp.initialize([self.model], opt_level=level)
    """, unsafe_fixes=True)
    assert "run `self.model` under torch.autocast" in source


def test_a_model_cast_to_float16_by_an_option_of_its_own_leaves_the_rewrite_as_it_was():
    """``if args.fp16_full_eval: model = model.to(dtype=torch.float16)``: the option casts for
    inputs it suits (token ids), as a native trainer does too."""
    source, _ = _migrate(_HALF_EVALUATION.format(cast=".eval()").replace(
        "        model.eval()\n",
        "        model.eval()\n        if args.fp16_full_eval:\n            model = model.to(dtype=torch.float16)\n"))
    assert "amp.initialize" not in source and "GradScaler" in source


@pytest.mark.parametrize("guard", ["if args.fp16:", "if args.fp16 and torch.cuda.is_available():"])
def test_the_marker_of_an_unsafe_rewrite_stands_where_apex_was_set_up_even_when_its_if_goes(guard):
    """The scaler made before the flag's test replaces the whole ``if``: the reasons go there, not
    to the scaled backward pass further down."""
    source, _ = _migrate(f"""\
        import torch
        from apex import amp


        def train(args, model, optimizer, loader):
            {guard}
                model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
            for x, y in loader:
                loss = model(x, y)
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
    """, unsafe_fixes=True)
    marker = source.index("# TODO(ampmigrate): review, this rewrite is unsafe")
    assert marker < source.index("scaler = torch.amp.GradScaler(") < source.index("for x, y in loader:"), source


@pytest.mark.parametrize("use", ["model.disable_allreduce()", "model.enable_allreduce()", "model.needs_reduction = False",
                                 "self.net.sync_bucket_structure()"])
@pytest.mark.parametrize("unsafe_fixes", [False, True])
def test_apex_ddp_stays_where_the_file_uses_what_only_apex_has(use, unsafe_fixes):
    # torch's DistributedDataParallel has none of these: rewritten, the file raised AttributeError there
    source = textwrap.dedent(f"""\
        from apex.parallel import DistributedDataParallel as DDP

        def wrap(model):
            return DDP(model)

        def accumulate(model, self):
            {use}
            return isinstance(model, DDP)
        """)
    fixed, diagnostics = _migrate(source, unsafe_fixes=unsafe_fixes)
    assert fixed == source
    assert any("only apex's class has" in d.message for d in diagnostics if d.code == "AMP010")
