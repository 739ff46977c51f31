"""The anti-pattern rules (AMP100-AMP109) on shapes real training code has: each shape once
reported wrongly, or once missed, and the lines reported now."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper

from migrate.engine import run_rules
from migrate.rules import all_rules
from migrate.step_model import Kind, StepModelProvider, Via

_FAMILY = [rule for rule in all_rules() if rule.CODE.startswith("AMP1")]

# One native training step a loop runs; a shape adds its own lines after it.
_NATIVE_STEP = """\
def train(model, optimizer, loader, scaler):
    for x in loader:
        with torch.autocast("cuda"):
            loss = model(x)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
"""

# An out-of-memory retry loop around one batch, in a helper the epoch loop calls.
_RETRY_IN_A_HELPER = """\
        def run_batch(model, optimizer, batch, scaler):
            while True:
                try:
                    with torch.autocast("cuda"):
                        loss = model(batch)
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    return loss.detach()
                except torch.cuda.OutOfMemoryError:
                    optimizer.zero_grad()
                    torch.cuda.empty_cache()

        def train(model, optimizer, loader, scaler):
            for batch in loader:
                loss = run_batch(model, optimizer, batch, scaler)
                scaler.update()
                print(loss.cpu().item())
        """


def _lines(source: str, code: str) -> list[int]:
    result = run_rules(textwrap.dedent(source), "train.py", _FAMILY)
    assert result.error is None, result.error
    return sorted(d.location.row for d in result.diagnostics if d.code == code)


SHAPES = [
    pytest.param(
        "AMP100",
        """\
        def train(model, optimizer, data, scaler):
            model.train()
            optimizer.zero_grad()
            with torch.autocast("cuda"):
                loss = model(data)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

        def evaluate(model, data):
            model.eval()
            with torch.no_grad():
                logits = model(data)
            return float(logits.mean()), (logits.argmax(-1) == data.y).sum().item()

        def run(model, optimizer, data, scaler, epochs):
            results = []
            for epoch in range(epochs):
                train(model, optimizer, data, scaler)
                val_loss, correct = evaluate(model, data)
                results.append(val_loss)
            print(torch.tensor(results).mean().item())
        """,
        [],
        id="an evaluation helper the loop calls, and a driver's summary after its loops, are no training step",
    ),
    pytest.param(
        "AMP100",
        """\
        class Accuracy:
            def __call__(self, logits, labels):
                self.update(logits, labels)

            def update(self, logits, labels):
                self.correct += (logits.argmax(-1) == labels).sum().item()

        def train(model, optimizer, loader, accelerator):
            metric = Accuracy()
            for batch in loader:
                logits = model(batch["input_ids"])
                loss = torch.nn.functional.cross_entropy(logits, batch["labels"])
                accelerator.backward(loss)
                optimizer.step()
                metric(logits, batch["labels"])
        """,
        [15],  # at the loop's call; the method's read related
        id="a read in a method of the file's own class, called through its instance",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, optimizer, loader, compute_loss, pbar, scaler):
            mloss = torch.zeros(4, device="cuda")
            for i, (imgs, targets) in enumerate(loader):
                with torch.autocast("cuda"):
                    loss, loss_items = compute_loss(model(imgs), targets)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                mloss = (mloss * i + loss_items) / (i + 1)
                pbar.set_description(("%10s" + "%10.4g" * 4) % ("train", *mloss))
        """,
        [10],
        id="a running mean of the loss's companion, %-formatted every step",
    ),
    pytest.param(
        "AMP100",
        """\
        class Trainer:
            def fit(self, loader, loss=None):
                self.set_test_params(loss=loss)
                self.train_epoch(loader)

            def train_epoch(self, loader):
                for inputs, targets in loader:
                    with torch.autocast("cuda"):
                        loss, items = self.get_losses(self.net(inputs), targets)
                    self.scaler.scale(loss).backward()
                    self.scaler.step(self.optimizer)
                    self.scaler.update()

            def get_losses(self, outputs, targets):
                loss = self.criterion(outputs, targets)
                if self.names is None:
                    self.set_names(loss)
                return loss, loss.detach()

            def set_names(self, loss):
                criterion_name = self.criterion.__class__.__name__
                self.names = [criterion_name + "/" + str(i) for i in range(len(loss))]
                for name in self.names:
                    print(f"watching {name}")

            def set_test_params(self, loss=None):
                self.criterion = loss or self.criterion
        """,
        [],
        id="a setter's loss parameter is a loss function, not the step's loss",
    ),
    pytest.param(
        "AMP100",
        """\
        def show_receptive_field(img, out):
            loss = out[0, :, 4, 4].sum()
            loss.backward(retain_graph=True)
            grads = img.grad.abs()
            img.grad.fill_(0)
            print(grads.cpu().numpy())

        scaler = torch.amp.GradScaler()
        for layer in range(4):
            out = conv(out)
            show_receptive_field(image, out)
        """,
        [],
        id="backward passes for an input's gradient, cleared and never stepped, are no training",
    ),
    pytest.param(
        "AMP100",
        """\
        class System(LightningModule):
            def training_step(self, batch, batch_idx):
                images, labels = batch
                tgt = self.tokenizer.encode(labels, self.device)
                tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
                memory = self.model.encode(images)
                loss = 0
                n = (tgt_out != self.pad_id).sum().item()
                for i, perm in enumerate(self.perms(tgt)):
                    logits = self.model.decode(tgt_in, memory, perm)
                    loss += n * F.cross_entropy(logits, tgt_out.flatten())
                    if i == 1:
                        tgt_out = torch.where(tgt_out == self.eos_id, self.pad_id, tgt_out)
                        n = (tgt_out != self.pad_id).sum().item()
                return loss
        """,
        [],
        id="a count of target tokens is a batch value, though the loss is computed from it",
    ),
    pytest.param(
        "AMP101",
        """\
        def train(model, optimizer, loader, scaler, clip):
            for it, x in enumerate(loader):
                scaler.scale(model(x)).backward()
                if clip:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                    scaler.step(optimizer)
                else:
                    scaler.step(optimizer)
                scaler.update()
                if it % 100 == 0:
                    for name, p in model.named_parameters():
                        writer.add_histogram(name, p.grad, it)
        """,
        [],
        id="gradients read after each arm of an if has unscaled them",
    ),
    pytest.param(
        "AMP100",
        """\
        def train_one_epoch(model, criterion, loader, optimizer, scaler):
            for samples, targets in loader:
                with torch.autocast("cuda"):
                    loss_dict = criterion(model(samples), targets)
                loss = sum(loss_dict.values())
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                loss_dict_reduced = reduce_dict(loss_dict)
                loss_value = sum(loss_dict_reduced.values())
                if not math.isfinite(loss_value):
                    sys.exit(1)
        """,
        [11],
        id="math.isfinite of a loss reduced across processes",
    ),
    pytest.param(
        "AMP100",
        """\
        class Task(pl.LightningDataModule):
            def common_step(self, batch, stage):
                loss = self.model.loss_func(self.model(batch["X"]), batch["y"])
                if torch.isnan(loss):
                    return None
                return {"loss": loss}

            def training_step(self, batch, batch_idx):
                return self.common_step(batch, "train")
        """,
        [9],  # at the call; the test in the helper related
        id="a Lightning step that returns what its helper returns",
    ),
    pytest.param(
        "AMP100",
        """\
        class Trainer:
            def training_step(self, batch):
                loss = self.model(batch).loss
                loss.backward()
                grad_norm = self.fsdp_model.clip_grad_norm_(max_norm=1.0)
                if not torch.isfinite(grad_norm):
                    self.optimizer.zero_grad()
                else:
                    self.optimizer.step()

            def fit(self, loader):
                for batch in loader:
                    self.training_step(batch)
        """,
        [13],
        id="the norm a sharded model's clip returns, tested every step",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(cfg, model, criterion, optimizer, loader, scaler, step):
            for x, y in loader:
                with torch.autocast("cuda"):
                    d_loss = cfg.LOSS.d_loss(model(x), y)
                scaler.scale(d_loss).backward()
                scaler.step(optimizer)
                scaler.update()
                if cfg.LOSS.apply_r1 and cfg.LOSS.place == "outside" and step % cfg.r1_interval == 0:
                    optimizer.zero_grad()
                    for k in range(cfg.accum):
                        r1 = r1_penalty(model(x), x)
                        r1.backward()
                        print(r1.item())
                    optimizer.step()
        """,
        [],
        id="a settings section named LOSS, and a regulariser's own loop every n steps",
    ),
    pytest.param(
        "AMP102",
        """\
        def train(model, optimizer, loader, scaler):
            for x in loader:
                loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()  # the scaled gradients are gone: the penalty's are plain
                penalty(model, x).backward()
                optimizer.step()
        """,
        [],
        id="a plain step after the scaled gradients were stepped and cleared",
    ),
    pytest.param(
        "AMP101",
        """\
        def train(cfg, model, optimizer, loader, scaler):
            for x in loader:
                scaler.scale(model(x)).backward()
                if cfg.track_grad_norm or (cfg.clip_grad > 0):
                    scaler.unscale_(optimizer)
                if cfg.clip_grad > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
                scaler.step(optimizer)
                scaler.update()
        """,
        [],
        id="unscaled under a condition the clip's own condition implies",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, optimizer, loader, scaler, render_image):
            for rays, pixels in loader:
                rgb, acc, n_samples = render_image(model, rays)
                loss = F.mse_loss(rgb, pixels)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                num_rays = int(len(pixels) * (4096 / float(n_samples)))
        """,
        [],
        id="a count returned beside the loss's operand is no tensor for all we know",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, optimizer, loader, scaler, criterion):
            for x, y in loader:
                with torch.autocast("cuda"):
                    loss_dict = criterion(model(x), y)
                scaler.scale(sum(loss_dict.values())).backward()
                scaler.step(optimizer)
                scaler.update()
                for name in loss_dict:
                    print(f"logged {name}")
        """,
        [],
        id="a loss dict's keys are strings",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, optimizers, loader, scaler):
            for batch in loader:
                with torch.autocast("cuda"):
                    retval = model(**batch)
                loss, optim_idx = retval["loss"], retval.get("optim_idx")
                if optim_idx is not None and not isinstance(optim_idx, int):
                    optim_idx = int(optim_idx.item())
                scaler.scale(loss).backward()
                scaler.step(optimizers[optim_idx])
                scaler.update()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if not torch.isfinite(grad_norm):
                    continue
        """,
        [12],  # the norm's test, not the index the model returns
        id="an index the model returns is not a step tensor",
    ),
    pytest.param(
        "AMP100",
        """\
        class Trainer:
            def run_iteration(self, batch, do_backprop=True, run_online_evaluation=False):
                with torch.autocast("cuda"):
                    output = self.network(batch["data"])
                    loss = self.loss(output, batch["target"])
                if do_backprop:
                    self.scaler.scale(loss).backward()
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                if run_online_evaluation:
                    self.online_eval.append(output.argmax(1).cpu())
                return loss.detach()

            def train(self, loader, epochs):
                for epoch in range(epochs):
                    for batch in loader:
                        self.run_iteration(batch)
        """,
        [],
        id="an opt-in flag the training call leaves off",
    ),
    *(pytest.param(
        code,
        """\
        def train(model, optimizer, loader, cfg):
            scaler = torch.amp.GradScaler("cuda")
            for step, x in enumerate(loader):
                loss = model(x)
                if cfg.amp and cfg.dtype == "float16":
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                if (
                    cfg.amp
                    and cfg.dtype == "float16"
                ):
                    scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if (cfg.amp and cfg.dtype == "float16"):
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
        """,
        [],
        id=f"{code}: one test written in parentheses over lines is the same test",
    ) for code in ("AMP101", "AMP102")),
    pytest.param(
        "AMP100",
        """\
        class Trainer:
            def train_step(self):
                total_loss = 0.0
                for _ in range(self.accum):
                    loss = self.model(next(self.data)) / self.accum
                    total_loss += loss.item()
                    self.accelerator.backward(loss)
                self.optimizer.step()
                return total_loss

            def train(self):
                while self.step < self.max_steps:
                    loss = self.train_step()
                    self.pbar.set_description(f"loss: {loss:.4f}")
        """,
        [6],  # the helper's own `.item()`; what it returns is a float, not the caller's tensor
        id="a float a helper returns is not the step tensor its own loss was",
    ),
    pytest.param(
        "AMP100",
        _NATIVE_STEP.replace("    for x in loader:\n", "    for step, x in enumerate(loader):\n")
        + "        if divisible_by(step, 10):\n            print(loss.item())\n",
        [],
        id="a logging guard written as a helper call",
    ),
    pytest.param(
        "AMP107",
        """\
        def train(model, optimizer, loader):
            scaler = torch.amp.GradScaler("cuda", enabled=False)
            for x in loader:
                with torch.autocast("cuda", enabled=False):
                    loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "last.pt")
        """,
        [],
        id="a scaler made disabled keeps no state to save",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, optimizers, loader, accum, scaler):
            for step in range(1000):
                for micro in range(accum):
                    with torch.autocast("cuda"):
                        loss = model(next(loader)) / accum
                    scaler.scale(loss).backward()
                for opt in optimizers:
                    scaler.step(opt)
                scaler.update()
                print(f"step {step} loss {loss.item() * accum:.3f}")
        """,
        [10],
        id="a loop over the optimizers is part of the step, not its loop",
    ),
    pytest.param(
        "AMP100",
        """\
        import lightning as L

        class Model(L.LightningModule):
            def training_step(self, batch, batch_idx):
                logits = self.backbone(batch["input_ids"])
                loss = torch.nn.functional.cross_entropy(logits, batch["labels"])
                self.log("train/loss", loss.item())
                return loss
        """,
        [7],
        id="Lightning's automatic training_step is one step, its returned value the loss",
    ),
    pytest.param(
        "AMP100",
        _NATIVE_STEP + "        tokens = int(loss.detach().exp())\n",
        [8],
        id="int() of a step tensor waits for it",
    ),
    *(pytest.param(
        code,
        """\
        class Solver:
            def run_step(self, batch):
                with torch.autocast("cuda", enabled=self.scaler is not None):
                    loss = self.model(batch)
                if self.scaler is not None:
                    loss = self.scaler.scale(loss)
                loss.backward()
                if self.scaler is not None:
                    self.scaler.unscale_(self.optimizer)
                if self.max_norm:
                    grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
                if self.scaler is None:
                    self.optimizer.step()
                else:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
        """,
        [],
        id=f"{code}: a loss scaled under `if scaler is not None:`, unscaled and stepped under the same test",
    ) for code in ("AMP101", "AMP102")),
    pytest.param(
        "AMP100",
        """\
        import torch

        model = build()
        scaler = torch.amp.GradScaler("cuda")
        if write_tensors:
            loss = model(x)
            scaler.scale(loss).backward()
            print(loss.item())
        for x in loader:
            loss = model(x)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if step % 100 == 0:
                print(loss.item())

        def _test_scaler():
            loss = model(torch.ones(2))
            scaler.scale(loss).backward()
            print(loss.item())

        if __name__ == "__main__":
            _test_scaler()
        """,
        [],
        id="a script's one-off backward outside any loop, and a _test helper, are no training steps",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, loader, optimizer, scaler, loss_ratio):
            for x in loader:
                with torch.autocast("cuda"):
                    out_a, out_b = model(x)
                loss = loss_ratio[0] * out_a.mean() + loss_ratio[1] * out_b.mean()
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                if loss_ratio[1] > 0:
                    optimizer.zero_grad()
        """,
        [],
        id="a loss's weight from the configuration is no step tensor",
    ),
    pytest.param(
        "AMP100",
        """\
        import deepspeed

        def train_step(data_iterator, model, args, hooks):
            forward_step = hooks["forward_step"]
            lm_loss, metrics = forward_step(data_iterator, model, args)
            reduced_loss = lm_loss.detach().clone()
            torch.distributed.all_reduce(reduced_loss.data)
            if reduced_loss.isnan().any() or reduced_loss.isinf().any():
                print("skipping")
            backward_step(model, lm_loss)
            model.step()
            return {k: v.item() for k, v in metrics.items()}

        def backward_step(model, loss):
            model.backward(loss)
        """,
        [8],  # the test waits for the loss; the metrics' `.item()` is related
        id="a DeepSpeed engine under the model's name, its loss through a helper's parameter",
    ),
    # Issue 34: shapes of real native-AMP code the linter had not been tuned on.
    pytest.param(
        "AMP100",
        """\
        def train(model, optimizer, loader, scaler, schedule):
            for x in loader:
                t = torch.randint(0, 1000, (x.shape[0],), device=x.device)
                index = (schedule == t[0]).nonzero().item()
                noise = torch.randn_like(x)
                with torch.autocast("cuda"):
                    loss = model(x + noise * index)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                lengths = torch.tensor([len(x)])
                print(lengths.item(), torch.tensor([len(x)]).item())
        """,
        [],
        id="an index lookup on sampled inputs and CPU-made tensors are no step tensors",
    ),
    pytest.param(
        "AMP100",
        _NATIVE_STEP + "        print(model.weight.norm().item())\n",
        [8],
        id="a parameter's norm is computed from the step's parameters",
    ),
    pytest.param(
        "AMP100",
        """\
        def train_one_epoch(model, criterion, loader, optimizer, loss_scaler, max_norm, accum_iter):
            for data_iter_step, (samples, targets) in enumerate(loader):
                with torch.cuda.amp.autocast():
                    outputs = model(samples)
                    loss = criterion(outputs, targets)
                loss_value = loss.item()
                loss /= accum_iter
                loss_scaler(loss, optimizer, clip_grad=max_norm, parameters=model.parameters(),
                            update_grad=(data_iter_step + 1) % accum_iter == 0)
                if (data_iter_step + 1) % accum_iter == 0:
                    optimizer.zero_grad()
        """,
        [6],
        id="timm's NativeScaler call is a training step",
    ),
    pytest.param(
        "AMP100",
        """\
        class Module(LightningModule):
            def training_step(self, batch, batch_idx):
                opt = self.optimizers()
                x, y = batch
                logits = self(x)
                loss = F.cross_entropy(logits, y)
                self.manual_backward(loss)
                self.clip_gradients(opt, gradient_clip_val=1.0)
                opt.step()
                opt.zero_grad()
                acc = (logits.argmax(-1) == y).float().mean()
                self.log_dict({"loss": loss, "acc": acc.item()})
        """,
        [12],
        id="Lightning's manual optimisation is a training step",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(models, optimizers, loader, scaler, accum):
            for step, x in enumerate(loader):
                if (step // accum) % 2 == 0:
                    with torch.autocast("cuda"):
                        loss = models[0](x)
                    scaler.scale(loss).backward()
                    scaler.step(optimizers[0])
                    print(loss.item())
                else:
                    with torch.autocast("cuda"):
                        loss = models[1](x)
                    scaler.scale(loss).backward()
                    scaler.step(optimizers[1])
                scaler.update()
        """,
        [8],
        id="an arm that takes turns at a whole step is no logging guard",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, optimizer, loader, scaler):
            for i, x in enumerate(loader):
                with torch.autocast("cuda"):
                    loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                if i % 16 == 0:
                    reg = model.regularizer()
                    reg.backward()
                    optimizer.step()
                    print(reg.item())
        """,
        [],
        id="a lazy regulariser every 16 steps is still a guard",
    ),
    pytest.param(
        "AMP103",
        _RETRY_IN_A_HELPER,
        [],
        id="an out-of-memory retry loop is no training loop",
    ),
    pytest.param(
        "AMP100",
        _RETRY_IN_A_HELPER,
        [17],
        id="an every-batch read after a retry loop is every step",
    ),
    pytest.param(
        "AMP101",
        """\
        def test_scaler_skips_non_finite_steps(model, optimizer):
            scaler = torch.amp.GradScaler("cuda")
            loss = model(torch.ones(2))
            scaler.scale(loss).backward()
            for p in model.parameters():
                p.grad.fill_(float("inf"))
            assert not torch.isfinite(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            scaler.step(optimizer)
            scaler.update()
        """,
        [],
        id="a unit test that feeds a scaler inf on purpose is no training step",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, opt, loader, scaler):
            for x in loader:
                loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                loss_value = loss.item()
                print(f"loss {loss_value:.3f} lr {opt.param_groups[0]['lr']}")
        """,
        [7],
        id="a value read on the host once is a float afterwards",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, opt, loader, scaler):
            for x in loader:
                loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                loss = loss.detach().cpu().numpy()
                total = loss.item()
        """,
        [7],
        id="one pull per chain, and item() of a numpy value is no wait",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, opt, loader, scaler, labels, names):
            for x, y in loader:
                with torch.autocast("cuda"):
                    scores = model(x)
                    loss = criterion(scores, y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                best = torch.argmax(scores.detach().cpu(), 1)
                on_host = scores.detach().cpu().softmax(1)
                for i in range(len(y)):
                    names.append(labels[best[i].item()])
                    if best[i].item() == 0 or on_host[i, 0].item() > 0.5:
                        names.append("none")
        """,
        [9],  # one wait per iteration: the second pull is related to the first
        id="what a torch function or a method computes from a value on the host is on the host",
    ),
    pytest.param(
        "AMP100",
        """\
        class Trainer:
            def fit(self, loader):
                for batch in loader:
                    loss = self.fit_batch(batch)
                    self.average = self.update_average(loss, self.average)

            def fit_batch(self, batch):
                with torch.autocast("cuda"):
                    loss = self.model(batch)
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                if not torch.isfinite(loss):
                    return loss.cpu()
                return loss.detach().cpu()

            def update_average(self, loss, average):
                return average * 0.9 + float(loss) * 0.1
        """,
        [4],  # at the loop's call; the helper's `if not torch.isfinite(loss)` and return are related
        id="what a method of the file returns pulled is on the host where it is called",
    ),
    pytest.param(
        "AMP100",
        """\
        import time

        def train(model, opt, loader, scaler):
            last = time.time()
            for x in loader:
                loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                if time.time() - last > 30:
                    print(loss.item())
                    last = time.time()
        """,
        [],
        id="logging every n seconds is a guard",
    ),
    pytest.param(
        "AMP100",
        """\
        import math, sys

        def train(model, opt, loader, scaler):
            for x in loader:
                loss = model(x)
                if not math.isfinite(loss.item()):
                    print(loss)
                    sys.exit(1)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
        """,
        [6],
        id="the check waits each step, the report before exiting runs once",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, g_opt, loader, scaler, every):
            for i, x in enumerate(loader):
                loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(g_opt)
                regularize = i % every == 0
                if regularize:
                    penalty = model.penalty(x)
                    scaler.scale(penalty).backward()
                    scaler.step(g_opt)
                    penalty_value = penalty.item()
                scaler.update()
        """,
        [],
        id="an extra step every n iterations is an interval, not accumulation",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, opt, loaders, scaler):
            for phase in ("train", "val"):
                for x in loaders[phase]:
                    loss = model(x)
                    if phase == "train":
                        scaler.scale(loss).backward()
                        scaler.step(opt)
                        scaler.update()
                    else:
                        val_loss = loss.item()
        """,
        [],
        id="the validation arm of a phase loop runs no training step",
    ),
    pytest.param(
        "AMP100",
        """\
        class Trainer:
            def fit(self, loader):
                for x in loader:
                    loss = self.model(x)
                    self.scaler.scale(loss).backward()
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                    if self.control.should_log:
                        self.log({"loss": loss.item()})
        """,
        [],
        id="a trainer's should_log flag is a guard",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, opt, loader, scaler):
            for x in loader:
                ce_loss, aux_loss = model(x)
                loss = ce_loss + 0.1 * aux_loss
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                print(f"ce {ce_loss:.3f} aux {aux_loss:.3f}")
                valid, message = check(loss)
                print(message)
        """,
        [8],
        id="the parts of a loss are tensors, what a project function returns is not known",
    ),
    pytest.param(
        "AMP101",
        """\
        def train(model, opt, loader, scaler, args):
            for x in loader:
                loss = model(x)
                if args.fp16:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                if args.fp16:
                    scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
        """,
        [],
        id="unscale_ under the flag the scaled backward is under",
    ),
    pytest.param(
        "AMP103",
        """\
        class Context:
            def step_optimizer(self, optimizer, scaler=None):
                scaler = scaler or self._scaler
                scaler.step(optimizer)
        """,
        [],
        id="a scaler made and updated in another file",
    ),
    pytest.param(
        "AMP105",
        """\
        def train(hyp, model, opt, loader):
            scaler = torch.amp.GradScaler("cuda")
            for epoch in range(hyp.epochs):
                for x in loader:
                    scaler.scale(model(x)).backward()
                    scaler.step(opt)
                    scaler.update()

        def evolve(hyp, model, opt, loader):
            for generation in range(300):
                train(hyp, model, opt, loader)
        """,
        [],
        id="a whole training run called once per trial",
    ),
    pytest.param(
        "AMP105",
        """\
        def train_epoch(model, opt, loader):
            scaler = torch.amp.GradScaler("cuda")
            for chunk in loader:
                for x in chunk:
                    scaler.scale(model(x)).backward()
                    scaler.step(opt)
                    scaler.update()

        def main(model, opt, loader, epochs):
            for epoch in range(epochs):
                train_epoch(model, opt, loader)
        """,
        [2],
        id="a scaler made once per epoch",
    ),
    pytest.param(
        "AMP108",
        """\
        from copy import deepcopy

        def train(model, opt, loader, fp16):
            scaler = torch.amp.GradScaler("cuda")
            model.half().float()
            for x in loader:
                with torch.autocast("cuda"):
                    loss = model(x)
                scaler.scale(loss).backward()
            torch.save({"model": deepcopy(model).half(), "scaler": scaler.state_dict()}, "last.pt")

        def evaluate(model, loader):
            model = model.to(dtype=torch.float16)
            with torch.autocast("cuda"):
                return [model(x) for x in loader]

        def pure_fp16(model, x):
            scaler = torch.amp.GradScaler("cuda", enabled=False)
            model.half()
            scaler.scale(model(x.half())).backward()
        """,
        [],
        id="a round trip, a copy for the checkpoint, an evaluation cast, a disabled scaler",
    ),
    pytest.param(
        "AMP107",
        """\
        def train(model, optimizer, loader, scaler):
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.step(optimizer)
                scaler.update()
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, "last.pt")
        """,
        [7],
        id="a scaler handed in to the function that writes the checkpoint: its state belongs there",
    ),
    pytest.param(
        "AMP100",
        """\
        def train(model, optimizer, loader, scaler, world_size):
            for images, texts in loader:
                with torch.autocast("cuda"):
                    total_loss = model(images, texts)
                gathered = [torch.zeros_like(total_loss) for _ in range(world_size)]
                dist.all_gather(gathered, total_loss)
                gathered = torch.tensor(gathered)
                has_nan = torch.isnan(gathered).any()
                if has_nan:
                    logging.info(f"loss is nan: {has_nan} {gathered}")
                scaler.scale(total_loss).backward()
                scaler.step(optimizer)
                scaler.update()
        """,
        [7],
        id="gathered losses copied to the host by torch.tensor: that copy waits, what is read of it after does not",
    ),
    pytest.param(
        "AMP101",
        """\
        def train(net, opt, loader, scaler):
            for inputs, targets in loader:
                with torch.autocast("cuda"):
                    loss = criterion(net(inputs), targets)
                scaler.scale(loss).backward()
                for name, p in net.named_parameters():
                    print(name, p.grad.dtype, p.grad.shape, p.grad.size(), p.grad is None)
                scaler.step(opt)
                scaler.update()
        """,
        [],
        id="a gradient's dtype, shape and size, the same whatever the scale",
    ),
    pytest.param(
        "AMP100",
        """\
        class Trainer:
            def run(self, chunks):
                for chunk in chunks:
                    with torch.autocast("cuda"):
                        losses = self._step(chunk)
                    name, loss = losses.popitem()
                    self.scaler.scale(loss).backward()
                self.scaler.step(self.optim)
                self.scaler.update()

            def _step(self, chunk):
                outputs = self.model(chunk)
                key, outputs = outputs.popitem()
                self.logger.log(f"Losses/train_{key}_loss")
                return {key: self.loss(outputs, chunk)}
        """,
        [],
        id="the key a dict's popitem gives is a string",
    ),
    pytest.param(
        "AMP100",
        """\
        def forward_batch(batch, model):
            predictions, sequence_loss = model(batch)
            output = {"flow": {}}
            output["flow"]["loss"] = sequence_loss.mean()
            return output

        def train(model, optimizer, loader, scaler, rank, writer):
            for step, batch in enumerate(loader):
                output = forward_batch(batch, model)
                loss = 0
                for name, terms in output.items():
                    loss += terms["loss"]
                if rank == 0:
                    for name, terms in output.items():
                        writer.add_scalar(f"live_{name}_loss", terms["loss"].item(), step)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
        """,
        [15],
        id="a dict a helper fills item by item after making it empty holds the step's tensors",
    ),
    pytest.param(
        "AMP100",
        """\
        def fit(model, optimizer, batches, grad_scaler):
            for batch in batches:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss, stats = model.train_step(batch)
                grad_scaler.scale(loss).backward()
                grad_scaler.step(optimizer)
                grad_scaler.update()
                history.append(stats["accuracy"].item())
        """,
        [8],
        id="a model's own step method runs the model: what it returns is the step's",
    ),
]


@pytest.mark.parametrize(("code", "source", "expected"), SHAPES)
def test_real_shape_is_reported_where_the_pattern_is_and_nowhere_else(code, source, expected):
    assert _lines(source, code) == expected


def _model(source: str):
    wrapper = MetadataWrapper(cst.parse_module(textwrap.dedent(source)))
    return wrapper.resolve(StepModelProvider)[wrapper.module]


def test_model_enters_helpers_and_orders_the_step_as_it_runs():
    model = _model("""\
        class Trainer:
            def fit(self, loader):
                for batch in loader:
                    loss = self.forward(batch)
                    self.backward(loss)
                    self.optimizer_step()

            def forward(self, batch):
                with torch.autocast("cuda"):
                    return self.model(batch)

            def backward(self, loss):
                self.scaler.scale(loss).backward()

            def optimizer_step(self):
                self.scaler.unscale_(self.optimizer)
                self.scaler.step(self.optimizer)
                self.scaler.update()
        """)
    fit = next(steps for steps in model.roots if getattr(steps.root, "name", None) and steps.root.name.value == "fit")
    kinds = [event.kind for event in fit.events if event.kind is not Kind.FORWARD]
    assert kinds == [Kind.AUTOCAST, Kind.LOSS, Kind.BACKWARD, Kind.UNSCALE, Kind.SCALER_STEP, Kind.UPDATE]
    backward = fit.of(Kind.BACKWARD)[0]
    assert backward.scaler == "self.scaler" and backward.how.value == "scaled"
    assert any(isinstance(frame, Via) for frame in backward.frames)
    assert fit.of(Kind.SCALER_STEP)[0].subject == "self.optimizer"
    assert fit.same_iteration(backward, fit.of(Kind.UPDATE)[0])


def test_model_walks_the_functions_that_reach_a_step_and_no_other():
    source = """\
        import torch
        from torch.amp import GradScaler as Scaler

        def backward(loss):
            loss.backward()

        def run_batch(model, batch):
            backward(model(batch))

        def run_epoch(model, loader):
            for batch in loader:
                run_batch(model, batch)
                print(model(batch).item())

        def collate(items):
            return torch.stack([item.to("cuda") for item in items]).item()

        def make_scaler():
            return Scaler()

        def to_half(model):
            return model.to(torch.float16)

        def checkpoint(model, path):
            torch.save(model.state_dict(), path)

        class Trainer:
            def fit(self, loader):
                run_epoch(self.model, loader)

            def evaluate(self, loader):
                return [self.model(batch).item() for batch in loader]
        """
    model = _model(source)
    walked = [getattr(steps.root, "name", None) for steps in model.roots]
    assert [name.value for name in walked] == ["backward", "run_batch", "run_epoch", "make_scaler", "to_half", "checkpoint", "fit"]
    assert _lines(source, "AMP100") == [13]  # the pull in the loop whose step is two calls away


def test_model_pairs_two_ifs_on_one_flag():
    model = _model("""\
        def step(model, opt, x, scaler):
            loss = model(x)
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if scaler is None:
                opt.step()
        """)
    steps = model.roots[-1]
    scaled, plain = steps.of(Kind.BACKWARD)
    step = steps.of(Kind.STEP)[0]
    assert steps.exclusive(scaled, step)
    assert not steps.exclusive(plain, step)


def test_linting_never_imports_torch():
    script = (
        "import sys\n"
        "from migrate.api import migrate_source\n"
        "from migrate.rules._training_step import CORRECT_LOOP\n"
        "migrate_source(CORRECT_LOOP, 'train.py')\n"
        "assert 'torch' not in sys.modules, 'migrate imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def test_a_validation_pass_inside_the_training_loop_is_not_the_step():
    source = """\
        def range_test(model, opt, loader, val_loader, scaler, iterations):
            for iteration in range(iterations):
                loss = model(next(loader))
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                total = 0.0
                for x in val_loader:
                    total += model(x).item()
                for p in model.parameters():
                    total += p.grad.norm().item()
        """
    assert _lines(source, "AMP100") == [11]


def test_model_binds_each_loss_where_it_is_assigned():
    model = _model("""\
        def train(model, opt, loader, scaler):
            for x, y in loader:
                with torch.autocast("cuda"):
                    out = model(x)
                    loss = criterion(out, y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
        """)
    steps = model.roots[-1]
    kinds = [event.kind for event in steps.events]
    assert kinds.index(Kind.LOSS) < kinds.index(Kind.BACKWARD)
    loss = steps.of(Kind.LOSS)[0]
    assert loss.subject == "loss" and loss.regions() and loss.loops()


def _amp101(source: str, unsafe_fixes: bool = False):
    result = run_rules(textwrap.dedent(source), "train.py", _FAMILY, unsafe_fixes=unsafe_fixes)
    assert result.error is None, result.error
    return result, [d for d in result.diagnostics if d.code == "AMP101"]


_CLIP_THEN_STEP = """\
def train(model, optimizer, loader, scaler):
    for x, y in loader:
        scaler.scale(model(x, y)).backward()
        {reader}
        scaler.step(optimizer)
        scaler.update()
"""


@pytest.mark.parametrize("reader", [
    "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    "if args.clip:\n            norm = clip_grad_norm_(model.parameters(), args.clip)",
])
def test_amp101_unscales_by_default_where_the_step_always_follows(reader):
    source = _CLIP_THEN_STEP.format(reader=reader)
    result, [finding] = _amp101(source)
    assert finding.fix.applicability.value == "safe" and finding.applied
    lines = result.source.splitlines()
    assert lines[3] == "        scaler.unscale_(optimizer)" and lines[4] == "        " + reader.splitlines()[0]
    again, findings = _amp101(result.source)
    assert findings == [] and again.source == result.source


@pytest.mark.parametrize("source", [
    pytest.param("""\
        def train(model, optimizer, loader, scaler, accumulation):
            for i, batch in enumerate(loader):
                scaler.scale(model(batch) / accumulation).backward()
                clip_grad_norm_(model.parameters(), 1.0)
                if (i + 1) % accumulation == 0:
                    scaler.step(optimizer)
                    scaler.update()
        """, id="accumulation: the step every k micro-batches"),
    pytest.param("""\
        def train(model, optimizer, loader, scaler, warmup):
            for i, batch in enumerate(loader):
                scaler.scale(model(batch)).backward()
                if i < warmup:
                    norm = clip_grad_norm_(model.parameters(), 1.0)
                else:
                    scaler.step(optimizer)
                    scaler.update()
        """, id="the step in the other arm"),
    pytest.param("""\
        def train(model, optimizer, loader, scaler):
            for x in loader:
                scaler.scale(model(x)).backward()
                if not torch.isfinite(clip_grad_norm_(model.parameters(), 1.0)):
                    continue
                scaler.step(optimizer)
                scaler.update()
        """, id="the step skipped by a continue"),
    pytest.param("""\
        def train(model, optimizer, loader, scaler):
            for x, y in loader:
                scaler.scale(model(x)).backward()
                clip_grad_norm_(model.parameters(), 1.0)
                scaler.scale(model(y)).backward()
                scaler.step(optimizer)
                scaler.update()
        """, id="another backward pass before the step"),
])
def test_amp101_offers_no_fix_where_unscaling_could_raise_or_mix_scales(source):
    for unsafe_fixes in (False, True):
        result, [finding] = _amp101(source, unsafe_fixes)
        assert finding.fix is None and result.source == textwrap.dedent(source)


def test_amp101_fix_inside_a_try_in_the_loop_is_unsafe():
    source = """\
    def train(model, optimizer, loader, scaler):
        for x in loader:
            try:
                scaler.scale(model(x)).backward()
                clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            except torch.cuda.OutOfMemoryError:
                optimizer.zero_grad()
    """
    result, [finding] = _amp101(source)
    assert finding.fix.applicability.value == "unsafe" and not finding.applied
    assert "the next `unscale_` raises" in finding.fix.why_unsafe
    assert result.source == textwrap.dedent(source)
    fixed, _ = _amp101(source, unsafe_fixes=True)
    assert "            scaler.unscale_(optimizer)\n            clip_grad_norm_" in fixed.source
    # a `try` around the whole loop ends the training on an exception: the step always follows
    around = """\
    def train(model, optimizer, loader, scaler):
        try:
            for x in loader:
                scaler.scale(model(x)).backward()
                clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
        finally:
            save(model)
    """
    result, [finding] = _amp101(around)
    assert finding.fix.applicability.value == "safe" and "scaler.unscale_(optimizer)" in result.source


def test_a_helper_called_at_every_step_of_a_script_is_read_once(monkeypatch):
    """A script's top level calling the file's function at each of its thousands of steps: whether
    the function returns a value on the host is worked out once, not at each call."""
    from migrate import tree_walk

    read: list[cst.CSTNode] = []
    real_descendants = tree_walk.descendants

    def counting(root, enter=None):
        if type(root) is cst.IndentedBlock:
            read.append(root)
        return real_descendants(root, enter)

    monkeypatch.setattr(tree_walk, "descendants", counting)

    def reads(steps: int) -> tuple[int, int]:
        read.clear()
        step = ("for batch in loader:\n    with torch.autocast('cuda'):\n        loss = fetch(model, batch)\n"
                "    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n    scaler.update()\n")
        text = ("import torch\n\n\ndef fetch(model, batch):\n    return model(batch).sum().item()\n\n\n"
                "scaler = torch.amp.GradScaler('cuda')\n" + step * steps)
        found = run_rules(text, "script.py", all_rules(), fix=False).diagnostics
        return len(read), len(found)

    few, many = reads(5), reads(200)
    assert many[1] == few[1] == 1  # the pull in `fetch`, reported where it is
    assert many[0] == few[0]


def test_the_items_of_a_container_are_found_under_each_prefix_a_subscript_follows():
    """AMP107 reads what is added to a checkpoint later (``state["scaler"] = ...``): the
    assignments are looked up by container, as ``target.startswith(container + "[")`` would."""
    from migrate.step_model.build import Assignment
    from migrate.step_model.model import Steps

    first = Assignment(("state['scaler']", "a[0].b['k']", "state['epoch']"), cst.Name("x"), 0)
    second = Assignment(("state",), cst.Name("y"), 1)
    steps = Steps(cst.Module(body=()), [], [first, second])

    assert steps.items_assigned("state") == [(first, "state['scaler']"), (first, "state['epoch']")]
    assert steps.items_assigned("a") == steps.items_assigned("a[0].b") == [(first, "a[0].b['k']")]
    assert steps.items_assigned("a[0]") == [] and steps.items_assigned("b") == []
    assert steps.assigned("state") == [second] and steps.assigned("a") == []


def test_whether_an_inner_loop_only_evaluates_is_worked_out_once_per_loop(monkeypatch):
    """Each event in a loop inside the training loop asks whether that loop is a validation pass:
    the answer is the loop's, worked out once (it was a scan of the loop's events per event)."""
    from migrate.step_model.model import Steps

    asked: list = []
    real_within = Steps._within
    monkeypatch.setattr(Steps, "_within", lambda self, frame: asked.append(frame) or real_within(self, frame))

    def asks(pulls: int) -> tuple[int, int]:
        asked.clear()
        text = _scaled_loop("for x in loader:\n", after="    for v in val:\n        out = model(v)\n"
                                                       + "        print(out.item())\n" * pulls)
        found = run_rules(text, "script.py", all_rules(), fix=False).diagnostics
        return len([frame for frame in asked if type(frame).__name__ == "Loop"]), len(found)

    few, many = asks(3), asks(60)
    assert few[1] == many[1] == 0  # a validation pass: its pulls are not the training step's
    assert many[0] == few[0]


def test_whether_a_flag_is_set_every_n_steps_is_worked_out_once_per_value(monkeypatch):
    """Each ``if`` testing a flag asks whether any value the flag was given counts steps
    (``show = step % 10 == 0``): each value is read once, not at each ``if``."""
    from migrate.step_model import vocabulary

    read: list[cst.CSTNode] = []
    real_walk = vocabulary.walk
    monkeypatch.setattr(vocabulary, "walk", lambda root, visitor: read.append(root) or real_walk(root, visitor))

    def reads(tests: int) -> tuple[int, int]:
        read.clear()
        text = _scaled_loop("for step, x in enumerate(loader):\n    show = step % 10 == 0\n",
                            after="    if show:\n        print(loss.item())\n" * tests)
        found = run_rules(text, "script.py", all_rules(), fix=False).diagnostics
        return len([root for root in read if type(root) is cst.Comparison]), len(found)

    few, many = reads(3), reads(60)
    assert few[1] == many[1] == 0  # pulled every 10 steps only: not reported
    assert many[0] == few[0] == 1


def _scaled_loop(head: str, after: str) -> str:
    """A script training with a GradScaler in a loop: ``head`` (the ``for`` line and what comes
    before the step), the scaled step, then ``after``."""
    return ("import torch\n\nscaler = torch.amp.GradScaler('cuda')\n" + head
            + "    with torch.autocast('cuda'):\n        loss = model(x)\n"
            "    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n    scaler.update()\n" + after)


_ONE_ITERATION = """\
class Trainer:
    def fit(self, loader):
        for step, batch in enumerate(loader):
            with torch.autocast("cuda"):
                loss = self.model(batch)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.log_step(loss)
            print(f"step {step}: {loss.item():.3f}")

    def log_step(self, loss):
        self.history.append(float(loss))
"""


def test_one_iteration_is_one_finding_with_its_other_reads_related():
    result = run_rules(_ONE_ITERATION, "train.py", _FAMILY)
    found = [d for d in result.diagnostics if d.code == "AMP100"]
    assert len(found) == 1
    finding = found[0]
    # at the call the loop makes, naming the helper's line and the loop's
    assert finding.location.row == 9 and "`self.log_step(loss)`" in finding.message
    assert "(line 13)" in finding.message and "loop at line 3" in finding.message
    assert "running_loss += loss.detach()" in finding.message
    assert [r.location.row for r in finding.related] == [13, 10]


def test_related_locations_reach_every_output_format():
    import json

    from migrate import report
    from migrate.rules import all_rules
    from migrate.types import FileResult

    result = run_rules(_ONE_ITERATION, "train.py", _FAMILY)
    results = [FileResult("train.py", tuple(d for d in result.diagnostics if d.code == "AMP100"))]
    text = report.format_results(results, "text")
    assert "  also: train.py:13:" in text and "  also: train.py:10:" in text
    item = json.loads(report.format_results(results, "json"))[0]
    assert [r["location"]["row"] for r in item["related"]] == [13, 10]
    sarif = json.loads(report.format_results(results, "sarif", all_rules()))
    related = sarif["runs"][0]["results"][0]["relatedLocations"]
    assert [r["physicalLocation"]["region"]["startLine"] for r in related] == [13, 10]
    assert all(r["message"]["text"] for r in related)
    assert "(also line 13:" in report.format_results(results, "github")


def test_one_missing_unscale_is_one_finding_with_its_reads_related():
    source = textwrap.dedent("""\
        def train(model, optimizer, loader, scaler, writer):
            for step, x in enumerate(loader):
                scaler.scale(model(x)).backward()
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                grads = [p.grad.norm() for p in model.parameters()]
                writer.add_histogram("grad", model.fc.weight.grad, step)
                total = sum(p.grad.abs().sum() for p in model.parameters())
                scaler.step(optimizer)
                scaler.update()
        """)
    result = run_rules(source, "train.py", _FAMILY)
    found = [d for d in result.diagnostics if d.code == "AMP101"]
    assert len(found) == 1 and found[0].location.row == 4
    assert "(4 reads in this step)" in found[0].message
    assert [r.location.row for r in found[0].related] == [5, 6, 7]


def test_a_read_of_a_value_the_code_does_not_name_is_not_named_after_a_module():
    # `float(torch.nn.utils.clip_grad_norm_(...))` in a helper: the advice once read
    # "accumulate on the device (`running_torch += torch.detach()`)"
    source = textwrap.dedent("""\
        def clip(model):
            return float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))


        def train(model, optimizer, loader, scaler):
            for x in loader:
                with torch.autocast("cuda"):
                    loss = model(x)
                scaler.scale(loss).backward()
                clip(model)
                scaler.step(optimizer)
                scaler.update()
        """)
    messages = [d.message for d in run_rules(source, "train.py", _FAMILY).diagnostics if d.code == "AMP100"]
    assert messages and all("running_torch" not in message for message in messages), messages
