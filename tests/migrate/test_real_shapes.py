"""Shapes real training code has, each migrated safely where the rewrite is exact."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from ampshim.state import _amp_state
from migrate.api import migrate_source


def _migrate(source: str, unsafe_fixes: bool = False):
    result = migrate_source(textwrap.dedent(source), "train.py", unsafe_fixes=unsafe_fixes)
    assert result.error is None, result.error
    return result


def _safe(result) -> bool:
    fixes = {d.fix.applicability.value for d in result.diagnostics if d.fix}
    return fixes == {"safe"} and all(d.applied for d in result.diagnostics if d.fix)


def test_an_availability_check_is_a_flag_the_scaler_can_take():
    result = _migrate("""\
        import torch
        from apex import amp

        def train(model, optimizer, loader):
            if torch.cuda.is_available():
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x in loader:
                loss = model(x)
                if torch.cuda.is_available():
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()
    """)
    assert _safe(result)
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(torch.cuda.is_available()))' in result.new_source


def test_a_loss_scale_chosen_by_a_conditional_expression_keeps_each_choice():
    result = _migrate("""\
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1", loss_scale="dynamic" if cfg.dynamic else 128.0)
        for x in loader:
            loss = model(x)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    """)
    assert _safe(result)
    assert "init_scale=2.0**16 if cfg.dynamic else 128.0" in result.new_source
    assert "growth_interval=2000 if cfg.dynamic else 2**31 - 1" in result.new_source


def test_import_apex_then_apex_amp_is_the_same_as_from_apex_import_amp():
    result = _migrate("""\
        import apex

        model, optimizer = apex.amp.initialize(model, optimizer, opt_level="O1")
        for x in loader:
            loss = model(x)
            with apex.amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    """)
    assert _safe(result)
    assert not [d for d in result.diagnostics if d.code == "AMP016"]
    assert "apex" not in result.new_source


def test_a_second_identical_initialize_starts_a_fresh_scaler_as_apex_did():
    result = _migrate("""\
        import torch
        from apex import amp

        def main(model, optimizer, loader, args):
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            if args.resume:
                checkpoint = torch.load(args.resume)
                model.load_state_dict(checkpoint["model"])
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                amp.load_state_dict(checkpoint["amp"])
            for x in loader:
                loss = model(x)
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
    """)
    assert _safe(result)
    resume = result.new_source[result.new_source.index("if args.resume:"):result.new_source.index("for x in loader")]
    assert 'scaler = torch.amp.GradScaler("cuda")\n        scaler.load_state_dict(' in resume


def test_a_different_second_initialize_stays_unsafe():
    result = _migrate("""\
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        if args.finetune:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1", loss_scale=128.0)
        for x in loader:
            loss = model(x)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    """)
    assert {d.fix.applicability.value for d in result.diagnostics if d.fix} == {"unsafe"}


def test_each_optimizer_of_the_scaled_list_steps_through_the_scaler_and_the_scale_updates_once():
    result = _migrate("""\
        from apex import amp

        model, optimizers = amp.initialize(model, optimizers, opt_level="O1")
        for x in loader:
            loss = model(x)
            with amp.scale_loss(loss, optimizers) as scaled_loss:
                scaled_loss.backward()
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
    """)
    assert _safe(result)
    assert ("    for optimizer in optimizers:\n        scaler.step(optimizer)\n        optimizer.zero_grad()\n"
            "    scaler.update()\n") in result.new_source


O2_SCRIPT = """\
    import argparse
    from apex import amp

    parser = argparse.ArgumentParser()
    parser.add_argument("--opt-level", default="O2")
    args = parser.parse_args()
    model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level, keep_batchnorm_fp32=True)
    for x in loader:
        loss = model(x)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
        optimizer.step()
"""


@pytest.mark.parametrize("level", ['args.opt_level', '"O2"'])
def test_o2_stays_unsafe_unless_the_project_accepts_it_as_autocast(level):
    source = textwrap.dedent(O2_SCRIPT).replace("opt_level=args.opt_level", f"opt_level={level}")
    plain = migrate_source(source, "train.py")
    assert plain.new_source in (None, source)
    assert {d.fix.applicability.value for d in plain.diagnostics if d.fix} == {"unsafe"}
    accepted = migrate_source(source, "train.py", settings={"o2-as-autocast": True})
    assert _safe(accepted)
    assert "O2 as autocast" in next(d.fix.message for d in accepted.diagnostics if d.fix)
    if level == "args.opt_level":  # only O3 stops the run; the default O2 run trains
        checks = accepted.new_source[accepted.new_source.index("if args"):accepted.new_source.index("scaler = ")]
        for opt_level, stops in [("O2", False), ("O1", False), ("O3", True)]:
            try:
                exec(checks, {"args": type("Args", (), {"opt_level": opt_level})})
            except RuntimeError:
                assert stops, opt_level
            else:
                assert not stops, opt_level


def test_o3_inference_makes_the_model_half_as_its_inputs_are():
    source = textwrap.dedent("""\
        from apex import amp

        model, _ = amp.initialize(model, [], opt_level="O3")
        with torch.no_grad():
            out = model(x.cuda().half())
    """)
    assert migrate_source(source, "infer.py").new_source in (None, source)  # precision of the outputs changes
    result = migrate_source(source, "infer.py", unsafe_fixes=True)
    assert "model = model.half()\n" in result.new_source  # the unread `_` for no optimizers goes
    assert "outputs to float32" in next(d.fix.why_unsafe for d in result.diagnostics if d.fix)


def test_a_loss_from_a_helper_method_is_computed_under_autocast_with_the_helper():
    result = _migrate("""\
        from apex import amp

        class Trainer:
            def __init__(self, model, optimizer):
                self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

            def run_batch(self, batch):
                out = self.model(batch["x"])
                return self.criterion(out, batch["y"])

            def train(self, loader):
                for batch in loader:
                    loss = self.run_batch(batch)
                    with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                        scaled_loss.backward()
                    self.optimizer.step()
    """)
    assert _safe(result)
    assert 'with torch.autocast("cuda", dtype=torch.float16):\n                loss = self.run_batch(batch)\n' in result.new_source


@pytest.mark.parametrize("forward", ["loss, stats = self.loss(batch, self.model)", "loss = compute_loss(model=self.model, batch=batch)"])
def test_a_loss_from_a_function_handed_the_model_is_computed_under_autocast(forward):
    result = _migrate(f"""\
        from apex import amp

        class Trainer:
            def __init__(self, model, optimizer):
                self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

            def step(self, batch):
                with profile("forward"):
                    {forward}
                self.optimizer.zero_grad()
                with profile("backward"):
                    with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                        scaled_loss.backward()
                self.optimizer.step()
    """)
    assert _safe(result)
    assert ('with torch.autocast("cuda", dtype=torch.float16):\n            with profile("forward"):\n'
            f'                {forward}\n        self.optimizer.zero_grad()\n') in result.new_source


@pytest.mark.parametrize(
    ("own", "safe"),
    [
        ("torch.cuda.amp.autocast(enabled=True)", True),
        ('torch.autocast("cuda", dtype=torch.float16)', True),
        ('torch.autocast(device_type="cuda")', True),
        ("torch.cuda.amp.autocast(enabled=False)", False),  # apex still cast in there
        ("torch.cuda.amp.autocast(dtype=torch.bfloat16)", False),
        ('torch.autocast("cpu")', False),
        ("torch.cuda.amp.autocast(enabled=args.native)", False),
    ],
)
def test_the_files_own_autocast_inside_the_region_is_safe_only_where_it_repeats_the_region(own, safe):
    result = _migrate(f"""\
        import torch
        from apex import amp

        def train(args, model, optimizer, loader):
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x, y in loader:
                if args.native:
                    with {own}:
                        out = model(x)
                else:
                    out = model(x)
                loss = (out - y).pow(2).mean()
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
    """)
    assert _safe(result) is safe
    if not safe:  # said at the region; the other fixes say they go with it
        reasons = [d.fix.why_unsafe for d in result.diagnostics if d.fix]
        assert any("is inside the region" in reason for reason in reasons), reasons
        assert all("is inside the region" in reason or "applied together with the unsafe fix" in reason
                   for reason in reasons), reasons


def test_an_inference_initialize_at_the_end_of_a_function_puts_what_follows_under_autocast():
    result = _migrate("""\
        import torch
        from apex import amp

        def main(args, model, optimizer, loader):
            if not args.eval_only:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                for x, y in loader:
                    loss = (model(x) - y).pow(2).mean()
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                    optimizer.step()
            else:
                model = amp.initialize(model, opt_level="O1", verbosity=0)
                model.load_state_dict(torch.load(args.path))
                print(evaluate(args, model, loader))
    """)
    assert _safe(result)
    assert ('    else:\n        with torch.autocast("cuda", dtype=torch.float16):\n'
            '            model.load_state_dict(torch.load(args.path))\n'
            '            print(evaluate(args, model, loader))\n') in result.new_source
    assert "GradScaler" in result.new_source.split("else:")[0] and "apex" not in result.new_source


def test_an_inference_only_script_computes_under_autocast_after_its_initialize():
    result = _migrate("""\
        from apex import amp

        def predict(model, batches):
            model = amp.initialize(model, opt_level="O1")
            for x in batches:
                print(model(x).argmax(1))

        predict(load(), batches())
    """)
    assert _safe(result)
    assert result.new_source == textwrap.dedent("""\
        import torch

        def predict(model, batches):
            with torch.autocast("cuda", dtype=torch.float16):
                for x in batches:
                    print(model(x).argmax(1))

        predict(load(), batches())
    """)


@pytest.mark.parametrize(
    "body",
    [
        "model = amp.initialize(model, opt_level='O1')\nmodel.eval()\nreturn model",  # run by the caller
        "for m in models:\n    m = amp.initialize(m, opt_level='O1')\n    print(m(x))",  # the loop runs lines before it again
        "self.model = amp.initialize(self.model, opt_level='O1')\nprint(self.model(x))",  # run by other methods too
        "if flag:\n    model = amp.initialize(model, opt_level='O1')\n    print(model(x))\nprint(model(y))",  # more runs after
        "model = amp.initialize(model, opt_level='O2')\nprint(model(x))",  # fp16 weights
    ],
)
def test_an_inference_initialize_with_more_running_after_its_function_stays_unsafe(body):
    source = "from apex import amp\n\ndef f(self, model, models, x, y, flag):\n" + textwrap.indent(body, "    ") + "\n"
    result = _migrate(source)
    assert not _safe(result)


def test_a_local_name_for_the_model_runs_it():
    result = _migrate("""\
        from apex import amp

        class Trainer:
            def __init__(self, model, optimizer):
                self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

            def train(self, loader):
                net = self.model
                for x, y in loader:
                    out = net(x)
                    loss = self.criterion(out, y)
                    with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                        scaled_loss.backward()
                    self.optimizer.step()
    """)
    assert _safe(result)
    assert ('with torch.autocast("cuda", dtype=torch.float16):\n                out = net(x)\n'
            '                loss = self.criterion(out, y)\n') in result.new_source


def test_a_loss_handed_to_an_optimize_method_is_computed_under_autocast_in_each_caller():
    result = _migrate("""\
        from apex import amp

        class Trainer:
            def __init__(self, model, optimizer):
                self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

            def optimize(self, loss):
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
                self.optimizer.step()

            def train(self, loader):
                for x, y in loader:
                    out = self.model(x)
                    loss = self.criterion(out, y)
                    self.optimize(loss)

            def finetune(self, loader):
                for x, y in loader:
                    self.optimize(self.criterion(self.model(x), y) if False else self.head_loss(x, y))
    """)
    # the second caller hands an expression, not a name: the rewrite cannot place autocast there
    assert not _safe(result)
    simple = _migrate(textwrap.dedent(result.source).split("    def finetune")[0])
    assert _safe(simple)
    assert ('with torch.autocast("cuda", dtype=torch.float16):\n                out = self.model(x)\n'
            '                loss = self.criterion(out, y)\n            self.optimize(loss)\n') in simple.new_source


def test_initialize_calls_beside_each_other_with_the_same_options_share_one_scaler():
    result = _migrate("""\
        from apex import amp

        def train(gen, dis, gen_opt, dis_opt, loader):
            gen, gen_opt = amp.initialize(gen, gen_opt, opt_level="O1")
            dis, dis_opt = amp.initialize(dis, dis_opt, opt_level="O1")
            for x in loader:
                d_loss = dis(x).mean() - dis(gen(x).detach()).mean()
                with amp.scale_loss(d_loss, dis_opt) as scaled_loss:
                    scaled_loss.backward()
                dis_opt.step()
                g_loss = -dis(gen(x)).mean()
                with amp.scale_loss(g_loss, gen_opt) as scaled_loss:
                    scaled_loss.backward()
                gen_opt.step()
    """)
    assert _safe(result)
    assert result.new_source.count("GradScaler(") == 1


def test_initialize_calls_with_different_options_stay_unsafe():
    result = _migrate("""\
        from apex import amp

        def train(gen, dis, gen_opt, dis_opt, loader):
            gen, gen_opt = amp.initialize(gen, gen_opt, opt_level="O1")
            dis, dis_opt = amp.initialize(dis, dis_opt, opt_level="O1", loss_scale=128.0)
            for x in loader:
                loss = dis(gen(x)).mean()
                with amp.scale_loss(loss, [gen_opt, dis_opt]) as scaled_loss:
                    scaled_loss.backward()
                gen_opt.step()
                dis_opt.step()
    """)
    assert {d.fix.applicability.value for d in result.diagnostics if d.fix} == {"unsafe"}


def test_a_probe_for_apex_state_dict_gives_way_to_its_body():
    result = _migrate("""\
        import torch

        try:
            from apex import amp
        except ImportError:
            amp = None

        class ApexScaler:
            def __call__(self, loss, optimizer):
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()

            def state_dict(self):
                if "state_dict" in amp.__dict__:
                    return amp.state_dict()
    """, unsafe_fixes=True)
    assert "__dict__" not in result.new_source and "from apex" not in result.new_source
    assert "    def state_dict(self):\n        return scaler.state_dict()\n" in result.new_source
    assert not [d for d in result.diagnostics if d.code == "AMP009"]


def test_scale_loss_in_both_arms_of_an_if_reuses_one_forward_region_and_the_step_in_one_arm_is_safe():
    result = _migrate("""\
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) / accumulation
            top1.update(accuracy(loss))
            if i % accumulation != 0:
                with amp.scale_loss(loss, optimizer, delay_unscale=True) as scaled_loss:
                    scaled_loss.backward()
            else:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    """)
    assert _safe(result)
    assert result.new_source.count("torch.autocast(") == 1
    assert "TODO(ampmigrate)" not in result.new_source


def test_a_scale_set_through_apex_internals_after_initialize_is_the_scalers_start():
    result = _migrate("""\
        import torch
        from apex import amp

        def main(args, model, optimizer, loader):
            if args.fp16:
                model, optimizer = amp.initialize(models=model, optimizers=optimizer, opt_level="O1")
                amp._amp_state.loss_scalers[0]._loss_scale = 2**20
            for x in loader:
                loss = model(x)
                if args.fp16:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()
    """)
    assert _safe(result)
    assert 'scaler = torch.amp.GradScaler("cuda", init_scale=2**20, enabled=bool(args.fp16))' in result.new_source
    assert "_amp_state" not in result.new_source
    assert not [d for d in result.diagnostics if d.code == "AMP009"]


@pytest.mark.parametrize("handed", ["amp if fp16 else None", "None if not fp16 else amp"])
def test_amp_stored_only_when_fp16_hands_on_the_scaler_only_when_fp16(handed):
    result = _migrate(f"""\
        import torch
        from apex import amp

        class Trainer:
            def __init__(self, model, optimizer, fp16):
                if fp16:
                    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                self.amp = {handed}
                self.model, self.optimizer = model, optimizer

            def train_step(self, x):
                loss = self.model(x)
                if self.amp is not None:
                    with self.amp.scale_loss(loss, self.optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                self.optimizer.step()
    """, unsafe_fixes=True)
    new = result.new_source
    assert "import apex" not in new and "from apex" not in new and "TODO" not in new
    assert ("with torch.autocast(\n            \"cuda\",\n            dtype=torch.float16,\n"
            "            enabled=self.amp is not None and self.amp.is_enabled(),\n"
            "        ):\n            loss = self.model(x)") in new  # within 88 columns, as a formatter lays it out
    # None still means "mixed precision is off": the code testing for it keeps its meaning.
    assert f"self.amp = {handed.replace('amp', 'self.scaler')}" in new
    assert "self.amp.scale(loss).backward()" in new
    assert "if self.amp is not None:\n            self.amp.step(self.optimizer)\n            self.amp.update()\n        else:\n            self.optimizer.step()" in new


def test_amp_passed_only_when_fp16_turns_autocast_on_only_with_the_scaler():
    result = _migrate("""\
        import torch
        from apex import amp

        def train_epoch(model, optimizer, loader, amp=None):
            for x in loader:
                loss = model(x)
                if amp is not None:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()

        def main(model, optimizer, loader, args):
            if args.fp16:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            train_epoch(model, optimizer, loader, amp=amp if args.fp16 else None)
    """, unsafe_fixes=True)
    new = result.new_source
    assert "train_epoch(model, optimizer, loader, amp=scaler if args.fp16 else None)" in new
    assert 'enabled=amp is not None and amp.is_enabled()' in new
    assert "amp.step(optimizer)" in new and "        else:\n            optimizer.step()" in new


def test_o0_with_a_saved_amp_state_keeps_fp32_and_a_disabled_scaler_holds_the_state():
    result = _migrate("""\
        import torch
        from apex import amp

        def main(model, optimizer, loader, resume):
            model, optimizer = amp.initialize(model, optimizer, opt_level="O0")
            if resume:
                amp.load_state_dict(torch.load(resume)["amp"])
            for x in loader:
                loss = model(x)
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
            torch.save({"amp": amp.state_dict()}, "last.pt")
    """)
    assert _safe(result)
    new = result.new_source
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=False)' in new
    assert "autocast" not in new and "scaler.step" not in new
    assert "loss.backward()" in new and 'torch.save({"amp": scaler.state_dict()}, "last.pt")' in new


def test_o0_under_a_flag_with_a_saved_amp_state_stays_reported():
    result = _migrate("""\
        import torch
        from apex import amp

        def main(model, optimizer, fp32):
            if fp32:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O0")
            torch.save({"amp": amp.state_dict()}, "last.pt")
    """, unsafe_fixes=True)
    # The disabled scaler would exist only when the flag is set; the state is saved either way.
    assert result.new_source == result.source
    assert {d.code for d in result.diagnostics} == {"AMP002", "AMP005"}


def test_an_ema_copy_initialized_for_inference_beside_the_model_joins_its_autocast_region():
    result = _migrate("""\
        import torch
        from apex import amp

        def main(model, model_ema, optimizer, loader, args):
            if args.amp:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                if isinstance(model_ema, torch.nn.Module):
                    model_ema = amp.initialize(model_ema, opt_level="O1")
            for x in loader:
                with torch.no_grad():
                    target = model_ema(x)
                loss = (model(x) - target).pow(2).mean()
                optimizer.zero_grad()
                if args.amp:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()
    """)
    assert _safe(result)
    new = result.new_source
    assert "amp.initialize" not in new and "isinstance" not in new and "pass" not in new
    assert 'with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):\n            with torch.no_grad():\n                target = model_ema(x)' in new


@pytest.mark.parametrize("second", [
    'model_ema = amp.initialize(model_ema, opt_level="O2")',  # other options
    'model_ema = amp.initialize(model_ema, None, "O1")',  # options by position
])
def test_an_inference_initialize_that_differs_stays_unsafe(second):
    result = _migrate(f"""\
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        {second}
        for x in loader:
            loss = model(x) - model_ema(x)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    """)
    assert not _safe(result)


def test_an_inference_initialize_after_training_started_stays_unsafe():
    result = _migrate("""\
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        loss = model(x)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        model_ema = amp.initialize(model_ema, opt_level="O1")
    """)
    assert not _safe(result)


CHECKPOINT_UTILITY = """\
    import torch
    try:
        from apex import amp
    except ImportError:
        amp = None

    def load_checkpoint(config, model, optimizer):
        checkpoint = torch.load(config.resume, map_location="cpu")
        model.load_state_dict(checkpoint["model"])
        if "amp" in checkpoint and config.opt_level != "O0":
            amp.load_state_dict(checkpoint["amp"])

    def save_checkpoint(config, model, optimizer, *extra):
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        if config.opt_level != "O0":
            state["amp"] = amp.state_dict()
            state["scale"] = amp.state_dict()["loss_scaler0"]["loss_scale"]
        torch.save(state, "last.pth")
"""


def test_a_checkpoint_utility_takes_the_scaler_from_its_callers_under_unsafe_fixes():
    assert not _safe(_migrate(CHECKPOINT_UTILITY))
    result = _migrate(CHECKPOINT_UTILITY, unsafe_fixes=True)
    new = result.new_source
    compile(new, "utils.py", "exec")
    assert "import apex" not in new and "from apex" not in new and "amp." not in new
    assert "def load_checkpoint(config, model, optimizer, scaler=None):" in new
    assert "def save_checkpoint(config, model, optimizer, *extra, scaler=None):" in new
    assert 'if scaler is not None:\n            scaler.load_state_dict(_scaler_state_from_apex(checkpoint["amp"], scaler))' in new
    assert 'if scaler is not None:\n            state["amp"] = scaler.state_dict()' in new
    assert 'state["scale"] = scaler.get_scale()' in new
    # The callers live elsewhere: the file says so until they pass their scaler.
    assert new.count("TODO(ampmigrate): pass the GradScaler as `scaler=`") == 2
    assert {d.code for d in result.remaining} == {"AMP017"}
    assert _migrate(new, unsafe_fixes=True).new_source == new


def test_a_checkpoint_utility_that_uses_the_state_inside_an_expression_saves_the_given_scalers():
    # the expression reads the state of the scaler the function is now handed, None without one
    # (tests/migrate/test_checkpoint_utility_expressions.py runs such rewrites)
    result = _migrate("""\
        import torch
        from apex import amp

        def save(model, use_amp):
            torch.save({"model": model.state_dict(), "amp": amp.state_dict() if use_amp else None}, "last.pth")
    """, unsafe_fixes=True)
    assert "def save(model, use_amp, scaler=None):" in result.new_source
    assert '"amp": (scaler.state_dict() if scaler is not None else None) if use_amp else None,' in result.new_source
    assert "apex" not in result.new_source


def test_the_scaler_is_never_handed_to_code_that_calls_initialize_on_it():
    source = """\
        from apex import amp

        def setup(model, optimizer, amp=None):
            if amp is not None:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            return model, optimizer

        def train(model, optimizer, loader, amp=None):
            for x in loader:
                loss = model(x)
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()

        model, optimizer = setup(model, optimizer, amp=amp)
        train(model, optimizer, loader, amp=amp)
    """
    result = _migrate(source, unsafe_fixes=True)
    assert result.new_source == result.source
    assert any("`amp.initialize` is called on the handed-on module" in d.message for d in result.diagnostics)


@pytest.mark.parametrize("own", [
    "torch.cuda.amp.autocast(enabled=args.amp == 'native')",
    "torch.autocast('cuda', enabled=args.amp == 'native')",
])
def test_a_native_path_beside_apex_turns_its_own_autocast_on_for_the_apex_path_too(own):
    result = _migrate(f"""\
        import torch
        from apex import amp

        def train(model, optimizer, loader, args):
            if args.amp == "apex":
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            scaler = torch.cuda.amp.GradScaler(enabled=args.amp == "native")
            for x in loader:
                with {own}:
                    loss = model(x)
                if args.amp == "apex":
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                elif args.amp == "native":
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                if args.amp == "native":
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
    """)
    assert _safe(result)
    new = result.new_source
    # One region, on for either path: a second one around it would be switched off by this one.
    assert new.count("autocast(") == 1
    assert "enabled=(args.amp == 'native') or grad_scaler.is_enabled()\n        ):" in new
    assert 'grad_scaler = torch.amp.GradScaler("cuda", enabled=args.amp == "apex")' in new


def test_a_bfloat16_region_of_the_file_is_reused_but_unsafe():
    result = _migrate("""\
        import torch
        from apex import amp

        def train(model, optimizer, loader, fp16):
            if fp16:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not fp16):
                    loss = model(x)
                if fp16:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()
    """)
    assert not _safe(result)


def test_amp_kept_on_self_and_only_called_there_is_the_module_under_another_name():
    result = _migrate("""\
        import torch
        from apex import amp

        class Trainer:
            def __init__(self, model, optimizer):
                self.model, self.optimizer, self.amp = model, optimizer, None

            def setup(self):
                self.amp = amp
                self.model, self.optimizer = self.amp.initialize(models=self.model, optimizers=self.optimizer, opt_level="O1")

            def save(self):
                return {"model": self.model.state_dict(), "amp": self.amp.state_dict()}

            def step(self, x):
                loss = self.model(x)
                with self.amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
                self.optimizer.step()
    """)
    assert _safe(result)
    assert {d.code for d in result.diagnostics} <= {"AMP002", "AMP003", "AMP005"}
    new = result.new_source
    assert "self.amp = amp" not in new and "self.amp." not in new
    assert '"amp": self.scaler.state_dict()' in new and "self.scaler.scale(loss).backward()" in new


def test_amp_kept_on_self_and_tested_elsewhere_stays_a_handed_on_module():
    result = _migrate("""\
        from apex import amp

        class Trainer:
            def setup(self, model, optimizer):
                self.amp = amp
                self.model, self.optimizer = self.amp.initialize(model, optimizer, opt_level="O1")

            def step(self, x):
                loss = self.model(x)
                if self.amp:
                    with self.amp.scale_loss(loss, self.optimizer) as scaled_loss:
                        scaled_loss.backward()
                self.optimizer.step()
    """, unsafe_fixes=True)
    assert result.new_source == result.source


TRAINER_SETTING_UP_AMP_LATE = """\
    import torch
    from apex import amp

    class Base:
        def __init__(self, path):
            self.path = path
            self.net, self.amp = [None, None]

    class Trainer(Base):
        def __init__(self, **options):
            super().__init__(**options)

        def setup(self):
            self.net = build_net().to(self.device)
            self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
            self.amp = amp
            self.net, self.opt = self.amp.initialize(self.net, self.opt, opt_level="O1")
            self.resume()

        def resume(self):
            state = torch.load(self.path)
            self.amp.load_state_dict(state["amp"])

        def save(self):
            torch.save({"amp": self.amp.state_dict()}, self.path)

        def fit_batch(self, x, y):
            self.opt.zero_grad()
            loss = self.loss_fn(self.net(x), y)
            with self.amp.scale_loss(loss, self.opt) as scaled:
                scaled.backward()
            self.opt.step()
"""


def test_a_scaler_made_where_self_amp_was_set_is_safe_when_every_use_goes_through_self_amp():
    # Every use of the scaler was a use of `self.amp`, set (other than to None) only just before
    # `initialize`: where `setup()` has not run, the original failed on `self.amp` as the rewrite
    # fails on the scaler.
    result = _migrate(TRAINER_SETTING_UP_AMP_LATE)
    assert _safe(result)
    setup = result.new_source[result.new_source.index("def setup"):result.new_source.index("def resume")]
    assert 'self.scaler = torch.amp.GradScaler("cuda")' in setup and "self.amp." not in result.new_source
    assert "self.scaler.scale(loss).backward()" in result.new_source


def test_a_scaler_made_late_by_a_class_without_its_own_init_has_a_class_attribute_standing_in(tmp_path):
    # A method uses the module itself (`amp.state_dict()`), so `self.amp` is no stand-in; the class's
    # `__init__` only calls its base's: a disabled scaler made as a class attribute stands in until
    # `setup()` runs. Run: a save before `setup()` writes the disabled scaler's empty state (apex
    # raised there) and loading it back changes nothing.
    source = TRAINER_SETTING_UP_AMP_LATE.replace('{"amp": self.amp.state_dict()}', '{"amp": amp.state_dict()}')
    result = _migrate(source)
    assert _safe(result)
    fixed = result.new_source
    head = fixed[fixed.index("class Trainer(Base):"):fixed.index("def __init__(self, **options)")]
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=False)  # until `setup()` runs' in head, fixed
    assert "global " not in fixed
    namespace: dict = {}
    exec(compile(fixed, "fixed.py", "exec"), namespace)
    path = tmp_path / "checkpoint.pt"
    namespace["Trainer"](path=path).save()
    assert torch.load(path) == {"amp": {}}
    namespace["Trainer"](path=path).resume()


def test_a_scaler_made_late_with_self_amp_also_set_elsewhere_has_the_class_stand_in(tmp_path, monkeypatch):
    # An earlier test in the same process may have run `amp.initialize`; this one needs apex's state
    # as a fresh process has it (monkeypatch puts it back afterwards).
    monkeypatch.delattr(_amp_state, "opt_properties", raising=False)
    # `attach()` gives `self.amp` the module without `initialize`: apex refused `scale_loss` there
    # (run: RuntimeError); the rewrite's disabled class scaler trains in fp32, as the module-level
    # stand-in does before the function making the scaler has run (docs/codemod.md).
    source = TRAINER_SETTING_UP_AMP_LATE.replace("        def resume(self):", "        def attach(self):\n            self.amp = amp\n\n        def resume(self):")
    result = _migrate(source)
    assert _safe(result)
    for code, fails in ((textwrap.dedent(source), True), (result.new_source, False)):
        namespace: dict = {}
        exec(compile(code, "trainer.py", "exec"), namespace)
        trainer = namespace["Trainer"](path=tmp_path / "unused.pt")
        trainer.net = torch.nn.Linear(3, 1)
        trainer.opt = torch.optim.SGD(trainer.net.parameters(), lr=0.1)
        trainer.loss_fn = torch.nn.functional.mse_loss
        trainer.attach()
        before = trainer.net.weight.detach().clone()
        if fails:
            with pytest.raises(RuntimeError, match="has not been initialized"):
                trainer.fit_batch(torch.randn(4, 3), torch.randn(4, 1))
        else:
            trainer.fit_batch(torch.randn(4, 3), torch.randn(4, 1))
            assert not torch.equal(before, trainer.net.weight)


RUN_ONCE_BLOCK = """\
    import torch
    from apex import amp

    def train(args, model, loader):
        for epoch in range(args.epochs):
            if epoch == args.start_epoch:
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                if args.fp16:
                    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x in loader:
                loss = model(x)
                if {scaled_under}:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()
{extra}"""


def test_a_local_scaler_made_in_a_run_once_block_of_the_epoch_loop_has_a_disabled_stand_in_before():
    # Scaled only under initialize's flag: where it is off neither ran; where on, a scale_loss
    # before the block raised under apex (not initialized). So the stand-in is safe, with a note.
    result = _migrate(RUN_ONCE_BLOCK.format(scaled_under="args.fp16", extra=""))
    new = result.new_source
    assert new and {d.fix.applicability.value for d in result.diagnostics if d.fix} == {"safe"}
    assert any("apex raised at `amp.scale_loss`" in d.fix.message for d in result.diagnostics if d.fix)
    # Defined on every path where it is read, off until the block has run, as apex was.
    stand_in = new.index('scaler = torch.amp.GradScaler("cuda", enabled=False)')
    assert stand_in < new.index("for epoch in range") < new.index('scaler = torch.amp.GradScaler("cuda")\n')
    assert 'torch.autocast(' in new and '"cuda", dtype=torch.float16, enabled=scaler.is_enabled()' in new
    assert "scaler.step(optimizer)" in new
    compile(new, "train.py", "exec")


@pytest.mark.parametrize(("scaled_under", "extra"), [
    ("args.fp16 and x.numel()", ""),  # still the flag, joined: safe
    ("x.numel()", ""),  # scaled whatever the flag: where it is off apex always raised, the rewrite trains
    ("args.fp16", "    teacher = amp.initialize(torch.nn.Linear(2, 2), opt_level='O1')\n"),  # apex initialized before
])
def test_the_run_once_stand_in_is_safe_only_where_every_scaled_backward_is_under_initializes_flag(scaled_under, extra):
    result = _migrate(RUN_ONCE_BLOCK.format(scaled_under=scaled_under, extra=extra), unsafe_fixes=True)
    reasons = " ".join(d.fix.why_unsafe or "" for d in result.diagnostics if d.fix)
    stands_in = "a disabled one stands in" in reasons
    assert stands_in == (scaled_under != "args.fp16 and x.numel()"), reasons


def test_a_step_after_a_nan_skip_goes_through_the_scaler_where_the_optimizer_holds_gradients():
    # `torch.isnan(loss).any()` cannot be asked again at the step; after `zero_grad()` a skipped
    # batch leaves no gradient, where `scaler.step` would fail and apex's step did nothing.
    result = _migrate("""\
        import torch
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for x in loader:
            loss = model(x)
            if torch.isnan(loss).any():
                print("skipped")
            else:
                if args.amp:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    """, unsafe_fixes=True)
    assert {d.fix.applicability.value for d in result.diagnostics if d.fix} == {"unsafe"}
    assert ("    if args.amp and any(\n"
            '        p.grad is not None for group in optimizer.param_groups for p in group["params"]\n'
            "    ):\n"
            "        scaler.step(optimizer)\n        scaler.update()\n    else:\n"
            "        # nothing was scaled on this path: a plain step, as apex did\n"
            "        optimizer.step()  # noqa: AMP102\n") in result.new_source
    # the plain step is right on that path: the rewrite passes its own lint, but for the review
    # its unsafe fix asks for in the code, and the file's own `if torch.isnan(loss).any():`, which
    # waits for the loss every step (AMP100)
    assert [d.code for d in migrate_source(result.new_source, "train.py", select=["ALL"]).diagnostics] == ["AMP017", "AMP100"]


def test_an_unused_legacy_handle_beside_o1_and_a_log_line_naming_apex_go_with_apex_safely():
    # O1's `initialize` runs `amp.init()` itself: a second handle in its function patched the same casts.
    result = _migrate("""\
        import logging
        from apex import amp

        logger = logging.getLogger(__name__)

        def train(model, optimizer, loader):
            try:
                logger.info("apex from {}".format(amp.__path__))
            except NameError:
                raise RuntimeError("apex is not installed")
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            handle = amp.init(enabled=True)
            for x in loader:
                loss = model(x)
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
    """)
    new = result.new_source
    assert {d.fix.applicability.value for d in result.diagnostics if d.fix} == {"safe"}
    assert "amp" not in new.replace("torch.amp", "").replace("torch.autocast", "")
    assert "try:" not in new and "NameError" not in new  # the check that apex was imported goes, as dead code
    assert "def train(model, optimizer, loader):\n    scaler = torch.amp.GradScaler" in new
    assert not [d for d in result.diagnostics if d.code in ("AMP009", "AMP016")]


def test_an_unused_legacy_handle_where_no_o1_initialize_runs_is_unsafe():
    result = _migrate("""\
        from apex import amp

        def fit(net, opt, batches):
            net, opt = amp.initialize(net, opt, opt_level="O1")
            for batch in batches:
                loss = net(batch).mean()
                with amp.scale_loss(loss, opt) as scaled:
                    scaled.backward()
                opt.step()

        def evaluate(model, loader):
            amp.init()
            return [model(x) for x in loader]
    """)
    reasons = {d.fix.why_unsafe for d in result.diagnostics if d.fix}
    assert reasons and all("legacy `amp.init()` handle (line 12)" in reason for reason in reasons)
    assert result.new_source == result.source


def test_a_used_legacy_handle_is_still_reported():
    result = _migrate("""\
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        handle = amp.init(enabled=True)
        with handle.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
    """, unsafe_fixes=True)
    assert "handle = amp.init(enabled=True)" in result.new_source
    assert [d for d in result.diagnostics if d.code == "AMP009"]


def test_a_scaler_made_in_one_arm_of_a_mode_switch_is_asked_for_before_every_step():
    # `configure()` makes the scaler only in the "amp" mode: the other modes step (and clip) as
    # before instead of failing on a scaler that was never made.
    result = _migrate("""\
        import torch
        from apex import amp

        class Engine:
            def __init__(self, model, optimizer, mode):
                self.model, self.optimizer, self.mode = model, optimizer, mode
                self.configure()

            def configure(self):
                if self.mode == "fp16":
                    self.optimizer = LossScaledOptimizer(self.optimizer)
                elif self.mode == "amp":
                    self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")

            def backward(self, loss):
                if self.mode == "amp":
                    with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()

            def step(self):
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
    """, unsafe_fixes=True)
    step = result.new_source[result.new_source.index("def step"):]
    assert step.count('if getattr(self, "scaler", None) is not None:') == 2
    assert "        else:\n            self.optimizer.step()" in step


TEACHER_TRAINER = """\
    import torch
    from apex import amp

    class Distiller:
        def __init__(self, student, optimizer, teachers, fp16):
            self.fp16 = fp16
            self.teachers = []
            for teacher in teachers:
                if self.fp16:
                    teacher = amp.initialize(teacher, opt_level="O1")
                self.teachers.append(teacher.eval())
            self.student, self.optimizer = student, optimizer
            if {guard}:
                self.student, self.optimizer = amp.initialize(self.student, self.optimizer, opt_level="O1")

        def step(self, x):
            soft = sum(teacher(x) for teacher in self.teachers)
            loss = (self.student(x) - soft).pow(2).mean()
            self.optimizer.zero_grad()
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
            self.optimizer.step()
"""


def test_a_teacher_readied_for_inference_beside_the_training_initialize_goes_safely():
    # O1's casts are global once the training `initialize` ran, under the same test: the
    # teacher's own call adds none. The scaler is made where the training call was, not in the loop.
    result = _migrate(TEACHER_TRAINER.format(guard="self.fp16"))
    assert _safe(result), {d.fix.why_unsafe for d in result.diagnostics if d.fix}
    new = result.new_source
    assert "amp.initialize" not in new and "if self.fp16:\n                teacher" not in new
    assert '        self.scaler = torch.amp.GradScaler("cuda", enabled=bool(self.fp16))\n' in new
    assert new.index("self.scaler = ") > new.index("self.teachers.append")


def test_a_teacher_readied_under_a_test_the_training_initialize_does_not_share_stays_unsafe():
    result = _migrate(TEACHER_TRAINER.format(guard="self.fp16 and not self.teachers"))
    reasons = {d.fix.why_unsafe for d in result.diagnostics if d.fix}
    assert reasons and all("without optimizers" in reason for reason in reasons)
    assert result.new_source == result.source


VALIDATE = """\
    import torch
    from apex import amp

    def validate(model, loader, args):
        model = model.cuda()
        if args.amp:
{arm}
        model.eval()
        total = 0.0
        with torch.no_grad():
            for x, y in loader:
                total += (model(x).argmax(-1) == y).float().sum().item()
{after}
        return {{"top1": total}}
"""


def test_an_inference_initialize_under_a_flag_puts_the_lines_after_the_flag_under_autocast():
    result = _migrate(VALIDATE.format(arm='            model = amp.initialize(model, opt_level="O1")', after=""))
    assert _safe(result), {d.fix.why_unsafe for d in result.diagnostics if d.fix}
    new = result.new_source
    assert "if args.amp" not in new
    assert '    with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.amp)):\n        model.eval()\n' in new
    assert '\n        return {"top1": total}\n' in new  # a return of numbers goes inside the region


def test_the_flag_arm_keeps_its_other_lines_and_the_else():
    arm = '            print("mixed precision")\n            model = amp.initialize(model, opt_level="O1")\n        else:\n            print("fp32")'
    result = _migrate(VALIDATE.format(arm=arm, after=""))
    assert _safe(result)
    new = result.new_source
    assert '    if args.amp:\n        print("mixed precision")\n    else:\n        print("fp32")\n    with torch.autocast(' in new


def test_an_inference_flag_changed_later_or_a_model_handed_back_is_not_a_tail():
    flag_changed = VALIDATE.format(arm='            model = amp.initialize(model, opt_level="O1")', after="        args.amp = False")
    model_returned = VALIDATE.format(arm='            model = amp.initialize(model, opt_level="O1")', after="").replace(
        'return {"top1": total}', "return model")
    in_elif = VALIDATE.format(arm='            pass\n        elif args.half:\n            model = amp.initialize(model, opt_level="O1")', after="")
    for source in (flag_changed, model_returned, in_elif):
        result = _migrate(source)
        assert not _safe(result) and result.new_source == result.source


@pytest.mark.parametrize("args, kept", [
    ("None, False, False", "None, False, False"),
    ("None, False, False,", "None, False, False"),
    ("retain_graph=True", "retain_graph=True"),
    ("gradient , retain_graph = keep", "gradient, retain_graph = keep"),
])
def test_the_scaled_backward_keeps_its_arguments_however_spelled(args, kept):
    """``scaled_loss.backward(gradient, retain_graph, create_graph)`` positionally: each argument
    once, commas between (each argument's own comma was written twice, and the file not parsed)."""
    result = _migrate(f"""\
        from apex import amp
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        loss = model(x).sum()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward({args})
        optimizer.step()
    """)
    assert f"scaler.scale(loss).backward({kept})\n" in result.new_source
    compile(result.new_source, "train.py", "exec")


LONG_FLAGS = '''import torch
from apex import amp


def main(arguments, model, optimizer, loader):
    if arguments.{flag}:
        model, optimizer = amp.initialize(model, optimizer, opt_level=arguments.{level})
    for x in loader:
        loss = model(x)
        if arguments.{flag}:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
'''


@pytest.mark.parametrize("flag, level", [("fp16", "opt_level"), ("use_mixed_precision", "mixed_precision_opt_level"),
                                         ("apex", "apex_optimization_level_for_training")])
@pytest.mark.parametrize("longest", [0, 120])
def test_the_lines_a_rewrite_writes_fit_the_files_own_length_or_88(flag, level, longest):
    source = LONG_FLAGS.format(flag=flag, level=level) + ("# " + "x" * (longest - 2) + "\n" if longest else "")
    result = migrate_source(source, "train.py")
    assert result.error is None and result.new_source != source
    limit = max(88, *(len(line) for line in source.splitlines()))  # the file's own length, or 88
    written = [line for line in result.new_source.splitlines() if line not in source.splitlines()]
    assert written and all(len(line) <= limit for line in written), [line for line in written if len(line) > limit]
    if longest and flag == "fp16":  # a file of long lines keeps the scaler on one line where it fits
        assert any("GradScaler(\"cuda\", enabled=" in line for line in written)


def test_a_long_flag_in_a_file_of_short_lines_is_wrapped_as_a_formatter_would():
    source = LONG_FLAGS.format(flag="use_mixed_precision_for_the_training_runs_of_this_model", level="lvl")
    source = source.replace("opt_level=arguments.lvl", "opt_level=lvl")
    result = migrate_source(source, "train.py")
    assert max(len(line) for line in source.splitlines()) <= 88
    assert result.error is None and max(len(line) for line in result.new_source.splitlines()) <= 88
    assert "    if (\n        bool(arguments.use_mixed_precision_for_the_training_runs_of_this_model)\n        and lvl not in" in result.new_source
    compile(result.new_source, "train.py", "exec")


def test_the_helper_that_reads_old_apex_checkpoints_fits_88_columns():
    source = (Path(__file__).resolve().parents[2] / "fixtures" / "migrate" / "state_dict_checkpoint.in.py").read_text()
    result = migrate_source(source, "train.py")
    assert result.error is None and "def _scaler_state_from_apex(" in result.new_source
    helper = result.new_source.split("def _scaler_state_from_apex(")[1].split("\n\n\n")[0]
    assert max(len(line) for line in helper.splitlines()) <= 88, helper


WRAPPED_PER_CALL = """\
    import torch
    from apex import amp


    class Trainer:
        def __init__(self, model, use_apex=True):
            self.model, self.use_apex = model, use_apex
            self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def _wrap_model(self, model, {param}=True):
            if {test}:
                model, self.optimizer = amp.initialize(model, self.optimizer, opt_level="O1")
            return model

        def evaluate(self, x):
            model = self._wrap_model(self.model, {off})
            with torch.no_grad():
                return model(x).sum().item()

        def train(self, batches):
            model = self._wrap_model(self.model)
            for x, y in batches:
                loss = ((model(x) - y) ** 2).mean()
                with amp.scale_loss(loss, self.optimizer) as scaled:
                    scaled.backward()
                self.optimizer.step()
                self.optimizer.zero_grad()
                self.evaluate(x)
    """


@pytest.mark.parametrize("param", ["training", "is_train"])
@pytest.mark.parametrize("test", ["self.use_apex and {p}", "{p} and self.use_apex", "{p}"])
@pytest.mark.parametrize("off", ["{p}=False", "False"])
def test_a_scaler_whose_guard_tests_a_parameter_is_not_made_again_by_a_call_passing_false(monkeypatch, param, test, off):
    # Evaluation calls the helper that ran `initialize` with `training=False`: made before the `if`
    # (`GradScaler(enabled=... and training)`), the scaler would be made again, disabled, over the
    # live one; made in the `if`, it is made where apex was initialized. Run with CUDA reported
    # available (no kernel runs): the scaler stays on, with its scale, across evaluations.
    source = WRAPPED_PER_CALL.format(param=param, test=test.format(p=param), off=off.format(p=param))
    fixed = _migrate(source, unsafe_fixes=True).new_source
    guard = fixed[fixed.index("def _wrap_model"):fixed.index("def evaluate")]
    assert guard.index(f"if {test.format(p=param)}:") < guard.index("self.scaler = torch.amp.GradScaler"), guard
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    namespace: dict = {}
    exec(compile(fixed, "trainer.py", "exec"), namespace)
    trainer = namespace["Trainer"](torch.nn.Linear(4, 1))
    trainer.train([(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(3)])
    assert trainer.scaler.is_enabled() and trainer.scaler.state_dict()["_growth_tracker"] == 3  # one scaler, three steps


RESUMED_THROUGH_KEYWORDS = """\
import torch
from apex import amp


def restart(path, **objects):
    ckpt = torch.load(path)
{load}


def main(path):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    restart(path, state_dict=model, optimizer=optimizer, amp=amp)
    loss = model(torch.randn(8, 4)).pow(2).mean()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    torch.save({"amp": amp.state_dict()}, path)
"""
KEYWORD_LOADS = {
    "items": "    for key, obj in objects.items():\n        if key in ckpt and obj is not None:\n            obj.load_state_dict(ckpt[key])",
    "subscript": '    objects["amp"].load_state_dict(ckpt["amp"])',
    "get": '    if objects.get("amp") is not None:\n        objects.get("amp").load_state_dict(ckpt["amp"])',
}


@pytest.mark.parametrize("load", list(KEYWORD_LOADS))
def test_amp_handed_to_a_loader_through_keywords_loads_old_apex_checkpoints(monkeypatch, tmp_path, load):
    # `restart(path, amp=amp)` into `def restart(path, **objects)`: the GradScaler in its place
    # is given an apex checkpoint's `{"loss_scaler0": ...}`, converted on the way (a KeyError
    # 'scale' in GradScaler.load_state_dict before). Run with CUDA reported available.
    source = RESUMED_THROUGH_KEYWORDS.replace("{load}", KEYWORD_LOADS[load])
    fixed = _migrate(source, unsafe_fixes=True).new_source
    assert "_scaler_state_from_apex(" in fixed[fixed.index("def restart"):fixed.index("def main")], fixed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    model = torch.nn.Linear(4, 1)
    path = tmp_path / "old.pt"
    torch.save({"state_dict": model.state_dict(), "optimizer": torch.optim.SGD(model.parameters(), lr=0.1).state_dict(),
                "amp": {"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 17}}}, path)
    namespace: dict = {}
    exec(compile(fixed, "train.py", "exec"), namespace)
    namespace["main"](path)
    assert torch.load(path)["amp"]["scale"] == 1024.0 and torch.load(path)["amp"]["_growth_tracker"] == 18


UPDATE_FROM_HANDED = """\
import torch
from apex import amp


class Trainer:
    def __init__(self):
        self.gen, self.dis = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
        self.opt = torch.optim.SGD([*self.gen.parameters(), *self.dis.parameters()], lr=0.1)
        [self.gen, self.dis], self.opt = amp.initialize([self.gen, self.dis], self.opt, opt_level="O1")

    def generate(self, x):
        return self.gen(x)

    def update(self, fake, target):
        loss = ((fake - target) ** 2).mean() - self.dis(fake).mean()
        with amp.scale_loss(loss, self.opt) as scaled:
            scaled.backward()
        self.opt.step()


def prepare(x):
    return x * 2


def train(trainer, batches):
    for x, y in batches:
{make}
"""
HANDED = {  # how the caller makes what it hands `update`, and whether a forward pass made it
    "method_then_name": ("fake = trainer.generate(x)\ntrainer.update(fake, y)", True),
    "method_inline": ("trainer.update(trainer.generate(x), y)", True),
    "model_attribute": ("fake = trainer.gen(x)\ntrainer.update(fake, y)", True),
    "either_arm": ("if y.sum() > 0:\n    fake = trainer.generate(x)\nelse:\n    fake = x\ntrainer.update(fake, y)", True),
    "batch_itself": ("trainer.update(x, y)", False),
    "moved": ("fake = x.float()\ntrainer.update(fake, y)", False),
    "prepared_by_a_helper": ("fake = prepare(x)\ntrainer.update(fake, y)", False),
    "rebound_after": ("fake = trainer.generate(x)\nfake = x.clone()\ntrainer.update(fake, y)", False),
}


@pytest.mark.parametrize("made", list(HANDED))
def test_a_loss_computed_from_a_forward_pass_a_caller_made_is_no_safe_region(made):
    # apex cast every forward pass after `initialize`; the region in `update` covers the loss, not
    # the caller's `trainer.generate(x)` that made `fake`: unsafe (the caller's forward runs in fp32)
    lines, forward = HANDED[made]
    source = UPDATE_FROM_HANDED.replace("{make}", textwrap.indent(lines, " " * 8))
    result = _migrate(source, unsafe_fixes=True)
    reasons = " ".join(d.fix.why_unsafe or "" for d in result.diagnostics if d.fix)
    assert ("the loss is computed from `fake`" in reasons or "computed from `x`" in reasons) == forward, reasons
    assert _safe(result) == (not forward)


HANDED_TO_ANOTHER_FILE = """\
import torch
from apex import amp
from utils import restart_from_checkpoint


def main(path, loader):
    model = torch.nn.Linear(4, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    {handed}
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("handed", ["restart_from_checkpoint(path, state_dict=model, optimizer=optimizer, amp=amp)",
                                    "restart_from_checkpoint(path, model, optimizer, amp)",
                                    "loader.dataset.restore(amp=amp)"])
@pytest.mark.parametrize("unsafe_fixes", [False, True])
def test_amp_handed_to_code_the_file_does_not_show_is_left_as_it_is(handed, unsafe_fixes):
    # SwAV's `restart_from_checkpoint(..., amp=apex.amp)` in utils.py loads every object's state:
    # a GradScaler in amp's place was fed apex's `{"loss_scaler0": ...}` on resume (KeyError 'scale')
    source = HANDED_TO_ANOTHER_FILE.replace("{handed}", handed)
    result = _migrate(source, unsafe_fixes=unsafe_fixes)
    assert result.new_source in (None, source)
    assert any("not rewritten" in d.message and ("does not show" in d.message or "cannot be seen" in d.message)
               for d in result.diagnostics), [d.message for d in result.diagnostics]
