"""The training frameworks the rules on training steps know, and a correct loop in each.

Every rule of the family says how it applies in each (``Rule.FRAMEWORKS``) and shows it with
examples; these loops are the VALID example of each framework where a rule reports nothing in
it, and none of the family may report on any of them.
"""
from __future__ import annotations

from migrate.rules._training_step import CORRECT_LOOP

GRAD_SCALER = "torch GradScaler"
FACTORY = "a scaler from a factory"
TIMM = "timm loss_scaler"
ACCELERATE = "Accelerate"
LIGHTNING = "Lightning (manual optimisation)"
FABRIC = "Fabric"
DEEPSPEED = "DeepSpeed"
FRAMEWORKS = (GRAD_SCALER, FACTORY, TIMM, ACCELERATE, LIGHTNING, FABRIC, DEEPSPEED)

CORRECT_FACTORY_LOOP = '''\
import torch


def train(model, optimizer, loader, cfg):
    scaler = build_grad_scaler(cfg)
    for epoch in range(cfg.epochs):
        for step, (x, y) in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()},
                   "last.pt")
'''

CORRECT_TIMM_LOOP = '''\
import torch
from timm.utils import NativeScaler


def train(model, criterion, optimizer, loader, epochs, clip_grad=1.0):
    loss_scaler = NativeScaler()
    for epoch in range(epochs):
        for step, (samples, targets) in enumerate(loader):
            with torch.autocast("cuda"):
                loss = criterion(model(samples), targets)
            loss_scaler(loss, optimizer, clip_grad=clip_grad, parameters=model.parameters())
            optimizer.zero_grad()
            if step % 100 == 0:
                print(f"loss {loss.item():.4f}")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scaler": loss_scaler.state_dict()}, "last.pt")
'''

CORRECT_ACCELERATE_LOOP = '''\
from accelerate import Accelerator


def train(model, optimizer, loader, epochs):
    accelerator = Accelerator(mixed_precision="fp16")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader):
            with accelerator.autocast():
                loss = model(x, y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            if step % 100 == 0:
                accelerator.print(f"loss {loss.item():.4f}")
        accelerator.save_state("checkpoint")
'''

CORRECT_LIGHTNING_STEP = '''\
import lightning as L


class Model(L.LightningModule):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.net(*batch)
        opt.zero_grad()
        self.manual_backward(loss)
        self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        opt.step()
        self.log("loss", loss)
        return loss
'''

CORRECT_FABRIC_LOOP = '''\
from lightning.fabric import Fabric


def train(model, optimizer, loader, epochs):
    fabric = Fabric(precision="16-mixed")
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader):
            loss = model(x, y)
            optimizer.zero_grad()
            fabric.backward(loss)
            fabric.clip_gradients(model, optimizer, max_norm=1.0)
            optimizer.step()
            if step % 100 == 0:
                fabric.print(f"loss {loss.item():.4f}")
        fabric.save("last.ckpt", {"model": model, "optimizer": optimizer})
'''

CORRECT_DEEPSPEED_LOOP = '''\
import deepspeed


def train(model, args, loader, epochs):
    model_engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader):
            loss = model_engine(x.to(model_engine.device), y.to(model_engine.device))
            model_engine.backward(loss)
            model_engine.step()
            if step % 100 == 0:
                print(f"loss {loss.item():.4f}")
        model_engine.save_checkpoint("checkpoints")
'''

CORRECT = {GRAD_SCALER: CORRECT_LOOP, FACTORY: CORRECT_FACTORY_LOOP, TIMM: CORRECT_TIMM_LOOP,
           ACCELERATE: CORRECT_ACCELERATE_LOOP, LIGHTNING: CORRECT_LIGHTNING_STEP, FABRIC: CORRECT_FABRIC_LOOP,
           DEEPSPEED: CORRECT_DEEPSPEED_LOOP}
