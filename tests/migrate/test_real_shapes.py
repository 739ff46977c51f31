"""Shapes real training code has, each migrated safely where the rewrite is exact."""
from __future__ import annotations

import textwrap

import pytest

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
    assert "model, _ = model.half(), []\n" in result.new_source
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
