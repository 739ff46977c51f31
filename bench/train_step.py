"""Training-step time and peak memory: ampshim's opt levels against hand-written native torch.amp.

Every mode trains the same model from the same weights on the same batch. Modes are measured in
interleaved rounds (each round runs every mode once, in a rotating order) and each mode's figure is
the median over rounds, so drift on a busy machine hits every mode alike. Ratios are to the
reference measured in the same run: native autocast + GradScaler in the dtype ampshim uses on the
device (float16 on CUDA, bfloat16 on the CPU).

    python bench/train_step.py                      # CPU, small shapes, a few minutes
    python bench/train_step.py --device cuda --size large
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import ampshim  # noqa: F401  (serves the apex import name)
from apex import amp
from ampshim.casts_setting import CASTS_ENV_VAR

SIZES = {  # batch, width
    "small": {"mlp": (128, 512), "transformer": (8, 128), "conv": (16, 16)},
    "large": {"mlp": (1024, 4096), "transformer": (32, 1024), "conv": (128, 64)},
}


class TransformerStack(nn.Module):
    def __init__(self, width, layers=4):
        super().__init__()
        layer = nn.TransformerEncoderLayer(width, nhead=8, dim_feedforward=4 * width,
                                           batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, width)

    def forward(self, x):
        return self.head(self.encoder(x))


def conv_net(width):
    def block(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
    return nn.Sequential(*block(3, width), *block(width, width), nn.MaxPool2d(2),
                         *block(width, 2 * width), *block(2 * width, 2 * width),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 10))


def workload(name, size, device):
    """(model factory, input, target, loss function) for one benchmark model."""
    batch, width = SIZES[size][name]
    generator = torch.Generator().manual_seed(0)
    if name == "mlp":
        def make():
            return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                                 nn.ReLU(), nn.Linear(width, 10))
        x = torch.randn(batch, width, generator=generator)
        y = torch.randint(0, 10, (batch,), generator=generator)
        loss_fn = F.cross_entropy
    elif name == "transformer":
        def make():
            return TransformerStack(width)
        x = torch.randn(batch, 64, width, generator=generator)
        y = torch.randn(batch, 64, width, generator=generator)
        loss_fn = F.mse_loss
    else:
        def make():
            return conv_net(width)
        x = torch.randn(batch, 3, 32, 32, generator=generator)
        y = torch.randint(0, 10, (batch,), generator=generator)
        loss_fn = F.cross_entropy
    torch.manual_seed(0)
    initial = make().state_dict()

    def factory():
        model = make()
        model.load_state_dict(initial)
        return model.to(device)
    return factory, x.to(device), y.to(device), loss_fn


def native_amp(factory, x, y, loss_fn, device, dtype):
    model = factory()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype is not None)

    def step():
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return step, lambda: None


def native_master_weights(factory, x, y, loss_fn, device, dtype):
    """O2 written by hand: a half model, fp32 master weights in the optimizer, copy-back."""
    model = factory()
    for module in model.modules():
        if not isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.to(dtype)
    half_params = [p for p in model.parameters() if p.dtype == dtype]
    masters = [p.detach().float().requires_grad_() for p in half_params]
    fp32_params = [p for p in model.parameters() if p.dtype == torch.float32]
    optimizer = torch.optim.AdamW(masters + fp32_params, lr=1e-4)
    scaler = torch.amp.GradScaler(device.type)

    def step():
        optimizer.zero_grad()
        for p in half_params:
            p.grad = None
        loss = loss_fn(model(x.to(dtype)).float(), y)
        scaler.scale(loss).backward()
        for master, p in zip(masters, half_params):
            master.grad = p.grad.float()
        scaler.step(optimizer)
        scaler.update()
        with torch.no_grad():
            torch._foreach_copy_(half_params, masters)
    return step, lambda: None


def ampshim_level(opt_level, casts=None):
    """``casts``: AMPSHIM_CASTS for this mode (None: the device's default)."""
    def setup(factory, x, y, loss_fn, device, dtype):
        model = factory()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        saved = os.environ.pop(CASTS_ENV_VAR, None)
        if casts is not None:
            os.environ[CASTS_ENV_VAR] = casts
        try:  # read once, when initialize makes the O1 handle
            model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, verbosity=0)
        finally:
            os.environ.pop(CASTS_ENV_VAR, None)
            if saved is not None:
                os.environ[CASTS_ENV_VAR] = saved

        def step():
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()

        def teardown():
            handle = getattr(amp._amp_state, "handle", None)
            if handle is not None:
                handle._deactivate()  # O1's process-wide casting must not leak into other modes
        return step, teardown
    return setup


def modes():
    return {
        "fp32": lambda *a: native_amp(*a[:-1], None),
        "native fp16": lambda *a: native_amp(*a[:-1], torch.float16),
        "native bf16": lambda *a: native_amp(*a[:-1], torch.bfloat16),
        "native master weights": native_master_weights,
        "ampshim O1": ampshim_level("O1"),
        "ampshim O1 apex casts": ampshim_level("O1", casts="apex"),
        "ampshim O1 native casts": ampshim_level("O1", casts="native"),
        "ampshim O2": ampshim_level("O2"),
        "ampshim O3": ampshim_level("O3"),
    }


def measure(setup, args, steps, warmup, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    step, teardown = setup(*args)
    try:
        for _ in range(warmup):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) / steps
    finally:
        teardown()
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    return elapsed, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--models", default="mlp,transformer,conv")
    parser.add_argument("--modes", default=None, help="comma-separated subset of the modes")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    device = torch.device(args.device)
    low = torch.float16 if device.type == "cuda" else torch.bfloat16
    reference = "native fp16" if low == torch.float16 else "native bf16"
    all_modes = modes()
    chosen = args.modes.split(",") if args.modes else list(all_modes)
    if reference not in chosen:
        chosen.insert(0, reference)
    print(f"device: {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
          f"torch {torch.__version__}, threads {torch.get_num_threads()}, size {args.size}, "
          f"{args.rounds} rounds x {args.steps} steps; reference: {reference}")
    print("| model | mode | step ms | time / ref | peak MiB | memory / ref |")
    print("|---|---|---:|---:|---:|---:|")
    for name in args.models.split(","):
        work = workload(name, args.size, device)
        times = {mode: [] for mode in chosen}
        peaks = {}
        for round_index in range(args.rounds):
            order = chosen[round_index % len(chosen):] + chosen[:round_index % len(chosen)]
            for mode in order:
                elapsed, peak = measure(all_modes[mode], (*work, device, low),
                                        args.steps, args.warmup, device)
                times[mode].append(elapsed)
                peaks[mode] = peak
        ref_time = statistics.median(times[reference])
        for mode in chosen:
            median = statistics.median(times[mode])
            peak = peaks[mode]
            memory = f"{peak / 2**20:.0f}" if peak is not None else "n/a"
            memory_ratio = f"{peak / peaks[reference]:.2f}" if peak is not None else "n/a"
            print(f"| {name} | {mode} | {median * 1e3:.2f} | {median / ref_time:.3f} | "
                  f"{memory} | {memory_ratio} |", flush=True)


if __name__ == "__main__":
    main()
