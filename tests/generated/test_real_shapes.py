"""Shapes met in real repositories this project was not tuned on, each written here as a small
script of our own and held to its rewrite by running both (``python -m ampshim compare``)."""
import textwrap

import pytest

from ampshim.compare import SAME, Target, compare
from migrate.api import migrate_source

pytestmark = pytest.mark.slow  # an end-to-end run: `-m slow`, and in CI

MARKER = "TODO(ampmigrate)"


def _trains_the_same(folder, source: str, rewritten: str, *runs: list[str]) -> None:
    """The script and its rewrite, run with each of ``runs``' arguments, train the same."""
    original, migrated = folder / "original.py", folder / "migrated.py"
    original.write_text(source)
    migrated.write_text(rewritten)
    for args in runs:
        comparison = compare(Target(str(original)), Target(str(migrated)), args, device="cpu", steps=8, timeout=240)
        assert comparison.verdict == SAME, (args, comparison.difference)

# amp kept on the arguments object only when fp16 is asked, the step in a helper reading it there
STORED_ON_ARGS = textwrap.dedent('''
    import argparse

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from apex import amp


    def train_step(args, model, optimizer, x, y):
        loss = F.mse_loss(model(x), y)
        if args.fp16:
            with args.amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--fp16", action="store_true")
        args = parser.parse_args()
        torch.manual_seed(0)
        model = nn.Linear(8, 1).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.fp16:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
            args.amp = amp
        x = torch.randn(32, 8, device="cuda")
        y = x[:, :1] * 2
        for _ in range(8):
            loss = train_step(args, model, optimizer, x, y)
        print(float(loss))


    if __name__ == "__main__":
        main()
''')


def test_amp_stored_on_args_is_left_alone_and_the_original_runs_both_ways(tmp_path):
    """``args.amp = amp`` under ``if args.fp16:``: ``args`` goes wherever the script sends it (other
    files' callers kept handing on the module and crashed a rewrite expecting a scaler), so the
    file is not rewritten, not even unsafe; the original still runs on ampshim either way."""
    result = migrate_source(STORED_ON_ARGS, filename="train.py", unsafe_fixes=True)
    assert result.new_source == STORED_ON_ARGS
    assert any("passed on or stored here" in d.message for d in result.diagnostics)
    original = tmp_path / "original.py"
    original.write_text(STORED_ON_ARGS)
    for args in ([], ["--fp16"]):
        comparison = compare(Target(str(original)), Target(str(original)), args, device="cpu", steps=8,
                             timeout=240, allow_apex=True)
        assert comparison.verdict == SAME, (args, comparison.difference)


def test_amp_handed_on_from_a_file_that_only_initializes_is_left_alone():
    """The receiver is in another file and the GradScaler would be made there: no rewrite, even
    unsafe (deleting the initialize left the receiver calling the bare module)."""
    source = textwrap.dedent('''
        from apex import amp

        from .base import BaseTrainer


        class Trainer(BaseTrainer):
            def __init__(self, model, optimizer, fp16):
                if fp16:
                    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                    self.amp = amp
                super().__init__(model, optimizer)
    ''')
    result = migrate_source(source, filename="trainer.py", unsafe_fixes=True)
    assert result.new_source == source
    assert any("handed on here to code in another file" in d.message for d in result.diagnostics)


def test_initialize_with_no_scale_loss_anywhere_says_what_it_drops():
    """apex O1 cast the forward even with a plain backward: deleting the call is marked."""
    source = textwrap.dedent('''
        import torch
        from apex import amp


        def main(model, optimizer, loader):
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x, y in loader:
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
    ''')
    result = migrate_source(source, filename="train.py", unsafe_fixes=True)
    assert "amp.initialize" not in result.new_source
    assert f"# {MARKER}: run `model` under torch.autocast" in result.new_source


def test_a_step_skipped_on_a_non_finite_norm_still_updates_the_scale(tmp_path):
    """``if math.isfinite(norm): step``: the update after the test, whichever way it goes (inside
    it, one overflow froze the scale for good); apex also skipped the next step after one, which
    native does not, so the rewrite is unsafe and says so at the test."""
    from generated.apex_scripts import Features
    from generated.judge import judge

    drawn = Features(loss="inline", loop="range", accumulation="plain", boundary="plus_one",
                     clip="master_params", clip_at="boundary", flag="none", import_guard=False,
                     inner_fp32=False, names=("model", "optimizer", "loss"), finite_guard=True,
                     overflow=True)
    outcome = judge(drawn, tmp_path)
    assert outcome.safe == "unchanged"
    assert outcome.unsafe == "differs: skipped-step" and not outcome.unsafe_unmarked
    unsafe = (tmp_path / "unsafe.py").read_text()
    guard = unsafe.index("if math.isfinite(norm):")
    assert unsafe.index("scaler.unscale_(optimizer)") < guard < unsafe.index("scaler.update()")
    assert "next iteration's" in unsafe[:guard]


# a teacher's forward before the student's, the opt level set in the block that initializes
DISTILL = textwrap.dedent('''
    import argparse

    import torch
    import torch.nn as nn
    from apex import amp


    def distill(teacher, student, inputs, optimizer, steps, use_amp=False):
        targets = torch.arange(8, device="cuda") % 4
        for _ in range(steps):
            optimizer.zero_grad()
            outputs = teacher(inputs)
            loss = nn.functional.cross_entropy(outputs, targets)
            if use_amp:
                loss = loss + 0.1 * student(inputs).pow(2).mean()
            loss = loss + 1e-4 * torch.norm(inputs, 2)
            if use_amp:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
        print(float(loss))


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--amp", action="store_true")
        args = parser.parse_args()
        torch.manual_seed(0)
        teacher = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).cuda()
        student = nn.Linear(16, 4).cuda()
        inputs = torch.randn((8, 16), requires_grad=True, device="cuda")
        optimizer = torch.optim.Adam([inputs], lr=0.05)
        if args.amp:
            opt_level = "O1"
            [student, teacher], optimizer = amp.initialize([student, teacher], optimizer, opt_level=opt_level)
        distill(teacher, student, inputs, optimizer, 6, use_amp=args.amp)
''')


def test_a_teachers_forward_and_an_opt_level_set_beside_initialize(tmp_path):
    """The scaler is made where the block that sets its opt level ran (made before the ``if``, it
    read the name before it was set); autocast covers the teacher's forward the loss is computed
    from, not only the student's the codemod recognised."""
    result = migrate_source(DISTILL, filename="distill.py", unsafe_fixes=True)
    original, migrated = tmp_path / "original.py", tmp_path / "migrated.py"
    original.write_text(DISTILL)
    migrated.write_text(result.new_source)
    assert "from apex" not in result.new_source
    for args in ([], ["--amp"]):
        comparison = compare(Target(str(original)), Target(str(migrated)), args, device="cpu", steps=6, timeout=240)
        assert comparison.verdict == SAME, (args, comparison.difference)


# `initialize` in a block of the epoch loop (a disabled scaler stands in before the loop), the
# gradients clipped under `if fp16:` in each iteration: the `unscale_` planned inside the loop
# was lost when the stand-in's line was placed before the loop
INITIALIZED_IN_THE_EPOCH_LOOP = textwrap.dedent('''
    import argparse

    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    def main(args, epochs=2):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1)).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        x = torch.randn(16, 8, device="cuda")
        y = x[:, 1:2] * 3
        for epoch in range(epochs):
            if args.fp16 and epoch == 0:
                from apex import amp
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
            for _ in range(4):
                loss = F.mse_loss(model(x), y)
                if args.fp16:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                if args.fp16:
                    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 0.5)
                else:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                optimizer.step()
                optimizer.zero_grad()
        return float(loss)


    if __name__ == "__main__":
        options = argparse.ArgumentParser()
        options.add_argument("--fp16", action="store_true")
        print(main(options.parse_args()))
''')


def test_an_unscale_inside_the_loop_a_stand_in_scaler_precedes(tmp_path):
    result = migrate_source(INITIALIZED_IN_THE_EPOCH_LOOP, filename="train.py", unsafe_fixes=True)
    assert result.new_source.count("scaler.unscale_(optimizer)") == 1, result.new_source
    _trains_the_same(tmp_path, INITIALIZED_IN_THE_EPOCH_LOOP, result.new_source, [], ["--fp16"])


# `initialize` in both arms of `if dynamic:` (options differ) under `if fp16:`: the scaler was
# made before the inner `if`, enabled by its test, inside `if fp16:` only, and autocast asked it
# on every run (UnboundLocalError in the default fp32 run)
INITIALIZE_IN_BOTH_ARMS = textwrap.dedent('''
    import argparse

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from apex import amp


    def run(options):
        torch.manual_seed(2)
        net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1)).cuda()
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        if options.fp16:
            if options.loss_scale == 0:
                net, opt = amp.initialize(net, opt, opt_level="O1", loss_scale="dynamic", verbosity=0)
            else:
                net, opt = amp.initialize(net, opt, opt_level="O1", loss_scale=options.loss_scale, verbosity=0)
        inputs = torch.randn(24, 6, device="cuda")
        targets = inputs.sum(dim=1, keepdim=True)
        for _ in range(6):
            loss = (net(inputs) - targets).abs().mean()
            if options.fp16:
                with amp.scale_loss(loss, opt) as scaled:
                    scaled.backward()
            else:
                loss.backward()
            opt.step(); opt.zero_grad()  # noqa: E702
        return loss.item()


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--fp16", action="store_true")
        parser.add_argument("--loss_scale", type=float, default=0)
        print(run(parser.parse_args()))
''')


def test_initialize_in_both_arms_of_a_test_is_left_alone(tmp_path):
    """The rewrite would make its GradScaler in the first arm only: `--fp16 --loss_scale 128`
    trained in fp32 with the disabled stand-in. Left alone, in either mode, saying why."""
    result = migrate_source(INITIALIZE_IN_BOTH_ARMS, filename="train.py", unsafe_fixes=True)
    assert result.new_source == INITIALIZE_IN_BOTH_ARMS
    assert any("in arms that exclude each other" in d.message for d in result.diagnostics)


# two entry points initializing apex each, the evaluation one first in the file and never run
TWO_ENTRIES = textwrap.dedent('''
    import argparse

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from apex import amp


    def make(args):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(12, 40), nn.ReLU(), nn.Linear(40, 3)).cuda()
        return model, torch.optim.SGD(model.parameters(), lr=0.05)


    def evaluate(args):
        model, optimizer = make(args)
        if args.amp:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
        with torch.no_grad():
            return model(torch.randn(2, 12, device="cuda")).argmax(1)


    def fit(model, optimizer, batches, use_amp):
        for x, y in batches:
            loss = F.cross_entropy(model(x), y)
            if use_amp:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()


    def run(args):
        model, optimizer = make(args)
        if args.amp:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
        batches = [(torch.randn(8, 12, device="cuda"), torch.randint(0, 3, (8,), device="cuda")) for _ in range(4)]
        for _ in range(2):
            fit(model, optimizer, batches, args.amp)


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--amp", action="store_true")
        run(parser.parse_args())
''')


def test_of_two_entry_points_initializing_the_one_that_trains_makes_the_scaler(tmp_path):
    """The GradScaler is made where the ``initialize`` whose function goes on to scale a loss ran
    (``run()`` calling ``fit()``), not at the first in the file (``evaluate()``, never called):
    there mixed-precision training ran in fp32 with no loss scaling, silently."""
    result = migrate_source(TWO_ENTRIES, filename="train.py", unsafe_fixes=True)
    assert MARKER in result.new_source  # the evaluation entry loses apex's casts, and says so
    _trains_the_same(tmp_path, TWO_ENTRIES, result.new_source, [], ["--amp"])


# a trainer whose `scale_loss` body hands the scaled loss to a backward method of its own, and
# steps in another method; a teacher readied for inference with `amp.initialize(teacher, None)`
SCALED_LOSS_HANDED_ON = textwrap.dedent('''
    import sys

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from apex import amp


    class Trainer:
        def __init__(self, clip):
            self.clip = clip
            self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).cuda()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1", verbosity=0)
            self.teacher = ready(nn.Linear(8, 1).cuda())

        def _backward(self, scaled_loss):
            scaled_loss.backward()

        def _step(self):
            self.optimizer.step()
            self.optimizer.zero_grad()

        def train_step(self, x):
            with torch.no_grad():
                y = self.teacher(x).float()
            loss = F.mse_loss(self.model(x).float(), y)
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                self._backward(scaled_loss)
            if self.clip:
                torch.nn.utils.clip_grad_norm_(amp.master_params(self.optimizer), 0.5)
            self._step()
            return loss


    def ready(teacher):
        teacher.eval()
        teacher = amp.initialize(teacher, None, opt_level="O1", verbosity=0)
        return teacher


    def main():
        torch.manual_seed(0)
        trainer = Trainer(clip="--clip" in sys.argv)
        x = torch.randn(32, 8, device="cuda")
        for _ in range(8):
            loss = trainer.train_step(x)
        print(float(loss))


    if __name__ == "__main__":
        main()
''')


def test_a_scaled_loss_handed_to_a_backward_method_is_scaled_once(tmp_path):
    """Scaled again in the method, the gradients came out 65,536 times too large; and
    ``amp.initialize(teacher, None)`` became ``teacher = teacher, None``, a tuple called. The
    teacher's lost casts make the rewrite unsafe: safe fixes leave the file alone."""
    assert migrate_source(SCALED_LOSS_HANDED_ON, filename="train.py").new_source in (None, SCALED_LOSS_HANDED_ON)
    result = migrate_source(SCALED_LOSS_HANDED_ON, filename="train.py", unsafe_fixes=True)
    assert "scale(scaled_loss)" not in result.new_source and "= teacher, None" not in result.new_source
    _trains_the_same(tmp_path, SCALED_LOSS_HANDED_ON, result.new_source, [], ["--clip"])


# the loss computed in part above the `if` holding the scaled backward (from the output the
# caller's forward hands in), in part in its arm
LOSS_ABOVE_THE_ARM = textwrap.dedent('''
    import argparse

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from apex import amp


    class Trainer:
        def __init__(self, model, optimizer, fp16):
            self.model, self.optimizer, self.fp16 = model, optimizer, fp16
            self.proj = torch.randn(1, 4, device="cuda")
            if fp16:
                self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1", verbosity=0)

        def update(self, out, y):
            self.optimizer.zero_grad()
            loss = F.mse_loss(out, y) + 0.01 * (out @ self.proj).pow(2).mean()
            if self.fp16:
                loss = loss / 2
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            self.optimizer.step()
            return loss

        def fit(self, x, y, steps):
            for _ in range(steps):
                out = self.model(x)
                loss = self.update(out, y)
            return loss


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--fp16", action="store_true")
        args = parser.parse_args()
        torch.manual_seed(0)
        model = nn.Linear(8, 1).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = Trainer(model, optimizer, args.fp16)
        x = torch.randn(32, 8, device="cuda")
        y = x[:, :1] * 2
        print(float(trainer.fit(x, y, 8)))


    if __name__ == "__main__":
        main()
''')


def test_a_loss_computed_above_the_arm_goes_under_autocast_and_trains_the_same(tmp_path):
    """The matmul above the arm ran in half precision under apex; left outside autocast, it met
    the caller's half output with a float32 operand and raised."""
    result = migrate_source(LOSS_ABOVE_THE_ARM, filename="train.py")
    assert "from apex" not in result.new_source and MARKER not in result.new_source, result.new_source
    _trains_the_same(tmp_path, LOSS_ABOVE_THE_ARM, result.new_source, [], ["--fp16"])


# `amp.initialize` handed a list of objectives and a list of optimizers; the loop takes each model
# from the list by index
LISTS_OF_MODELS = textwrap.dedent('''
    import argparse

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from apex import amp


    class Objective(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.body = nn.Linear(8, width)
            self.head = nn.Linear(width, 1)

        def forward(self, x, y):
            return F.mse_loss(self.head(torch.relu(self.body(x))), y)


    def fit(loss_models, optimizers, batches, steps, use_apex_amp, opt_level):
        if use_apex_amp:
            loss_models, optimizers = amp.initialize(loss_models, optimizers, opt_level=opt_level, verbosity=0)
        for _ in range(steps):
            for train_idx in range(len(loss_models)):
                loss_model = loss_models[train_idx]
                optimizer = optimizers[train_idx]
                x, y = batches[train_idx]
                loss_value = loss_model(x, y)
                if use_apex_amp:
                    with amp.scale_loss(loss_value, optimizer) as scaled_loss_value:
                        scaled_loss_value.backward()
                    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
                else:
                    loss_value.backward()
                    torch.nn.utils.clip_grad_norm_(loss_model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
        return loss_value


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--apex", action="store_true")
        args = parser.parse_args()
        torch.manual_seed(0)
        loss_models = [Objective(16).cuda(), Objective(4).cuda()]
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in loss_models]
        x = torch.randn(32, 8, device="cuda")
        batches = [(x, x[:, :1] * 2), (x, x[:, 1:2].sin())]
        print(float(fit(loss_models, optimizers, batches, 8, args.apex, "O1")))


    if __name__ == "__main__":
        main()
''')


def test_models_taken_from_the_list_initialize_was_handed_train_the_same(tmp_path):
    result = migrate_source(LISTS_OF_MODELS, filename="train.py")
    assert "from apex import" not in result.new_source and MARKER not in result.new_source, result.new_source
    _trains_the_same(tmp_path, LISTS_OF_MODELS, result.new_source, [], ["--apex"])


LOSS_FROM_A_LIST = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from apex import amp


    def compute_losses(logits, target):
        return [F.cross_entropy(logits, target), logits.float().pow(2).mean()]


    def main():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 10)).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
        x = torch.randn(64, 16, device="cuda") * 4
        y = (x[:, 0] * 3).long().clamp(0, 9)
        for _ in range(8):
            logits = model(x)
            loss_list = compute_losses(logits, y)
            with amp.scale_loss(loss_list[0], optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(float(loss_list[0]))


    if __name__ == "__main__":
        main()
''')


def test_a_loss_read_from_a_list_is_computed_under_autocast_and_trains_the_same(tmp_path):
    """``amp.scale_loss(loss_list[0], ...)``: the line computing the list from the logits is in the
    region; left out, its cross-entropy ran in half precision where apex ran it in float32."""
    result = migrate_source(LOSS_FROM_A_LIST, filename="train.py")
    assert "apex" not in result.new_source and MARKER not in result.new_source, result.new_source
    _trains_the_same(tmp_path, LOSS_FROM_A_LIST, result.new_source, [])


EVALUATED_THEN_TRAINED = textwrap.dedent('''
    import argparse

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from apex import amp


    def evaluate(model, x, y):
        with torch.no_grad():
            return float(F.mse_loss(model(x), y))


    def train(model, x, y):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
        for _ in range(8):
            loss = F.mse_loss(model(x), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(float(loss))


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--resume", action="store_true")
        args = parser.parse_args()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).cuda()
        x = torch.randn(64, 8, device="cuda")
        y = x[:, :1].sin()
        if args.resume:
            model = amp.initialize(model, opt_level="O1", verbosity=0)
            print(evaluate(model, x, y))
            train(model, x, y)
        else:
            train(model, x, y)


    if __name__ == "__main__":
        main()
''')


def test_an_inference_initialize_before_a_training_call_keeps_the_training_out_of_its_region(tmp_path):
    """``model = amp.initialize(model, opt_level="O1")`` then an evaluation, then ``train(...)``:
    the region around the evaluation stops before the call. Around it, the loop's own regions were
    nested, autocast kept the first step's cast weights, and the loss never moved."""
    result = migrate_source(EVALUATED_THEN_TRAINED, filename="train.py")
    assert "apex" not in result.new_source, result.new_source
    _trains_the_same(tmp_path, EVALUATED_THEN_TRAINED, result.new_source, [], ["--resume"])


FROZEN_ENCODER_METHOD = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from apex import amp


    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 16)
            self.codebook = nn.Parameter(torch.randn(32, 16))

        def encode(self, x):
            z = self.proj(x)
            distances = torch.addmm(self.codebook.pow(2).sum(1), z, self.codebook.t(), alpha=-2.0)
            return torch.argmin(distances.float(), dim=-1)


    def main():
        torch.manual_seed(0)
        encoder = Encoder().cuda()
        encoder.load_state_dict(Encoder().state_dict())
        encoder.eval()
        vocoder = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 4)).cuda()
        optimizer = torch.optim.Adam(vocoder.parameters(), lr=1e-2)
        vocoder, optimizer = amp.initialize(vocoder, optimizer, opt_level="O1", verbosity=0)
        x = torch.randn(256, 8, device="cuda") * 3
        y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
        for _ in range(8):
            with torch.no_grad():
                codes = encoder.encode(x)
            loss = F.cross_entropy(vocoder(codes), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(float(loss))


    if __name__ == "__main__":
        main()
''')


def test_a_frozen_networks_method_without_gradients_runs_under_autocast_and_trains_the_same(tmp_path):
    """``codes = encoder.encode(x)`` under ``torch.no_grad()``, the encoder loaded and in eval():
    apex O1 cast its pass, which picks the codes the model trains on."""
    result = migrate_source(FROZEN_ENCODER_METHOD, filename="train.py")
    assert "apex" not in result.new_source and MARKER not in result.new_source, result.new_source
    _trains_the_same(tmp_path, FROZEN_ENCODER_METHOD, result.new_source, [])
