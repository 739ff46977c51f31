"""CPU smoke mode: a script written for CUDA runs, unchanged, on a machine without a GPU.

``python -m ampshim --device cpu train.py`` (or ``AMPSHIM_DEVICE=cpu``, which ``torchrun``'s
workers inherit) maps, for the whole process:

- ``.cuda()``, ``.to("cuda")``, ``device="cuda"`` in any tensor factory, ``torch.device("cuda")``
  wherever it is used, ``torch.cuda.FloatTensor`` and friends: to the CPU (a torch function mode,
  so every factory and method is covered, not a list of them);
- ``torch.cuda``'s queries and calls (``is_available``, ``device_count``, ``set_device``,
  ``synchronize``, ``manual_seed``, ``empty_cache``, memory statistics, streams, events, NVTX):
  to CPU stand-ins, with a GPU per local rank;
- ``backend="nccl"`` to ``"gloo"``; DDP's ``device_ids``/``output_device`` dropped;
  ``DataParallel`` to the plain module, as torch does without a GPU;
- float16 autocast and ``GradScaler("cuda")`` to their CPU forms (bfloat16 autocast);
- ``torch.load``'s ``map_location`` to the CPU.

At exit, one line on stderr says what was mapped and how often. What cannot be mapped: custom
CUDA kernels (``amp_C``, ``apex_C``, an extension's ``.cu`` code), Triton, ``torch.compile``,
NCCL-only collectives, ``x.is_cuda``/``x.device.type == "cuda"`` checks (they see the CPU),
tensors created on threads the script starts itself (torch function modes are per thread).
Numbers are a smoke test's, not a GPU's: float16 became bfloat16, and timings and memory
statistics mean nothing.
"""
from __future__ import annotations

import atexit
import collections
import functools
import os
import sys
import time

import torch
import torch.distributed
import torch.nn.parallel
from torch.overrides import TorchFunctionMode

__all__ = ["enable", "is_enabled"]

_mapped: collections.Counter = collections.Counter()
_mode: TorchFunctionMode | None = None
_state = {"device": 0, "pretend_cuda": True}


def enable() -> None:
    """Map CUDA to the CPU for the rest of this process (idempotent)."""
    global _mode
    if _mode is not None:
        return
    _patch_torch_cuda()
    _patch_distributed()
    _patch_amp()
    _patch_load()
    _mode = _CudaToCpu()
    _mode.__enter__()  # never left: the mapping lasts as long as the process
    atexit.register(_report)


def is_enabled() -> bool:
    """Is CUDA mapped to the CPU in this process?"""
    return _mode is not None


def _record(what: str) -> None:
    _mapped[what] += 1


def _report() -> None:
    if _mapped:
        done = ", ".join(f"{what} ({count}x)" for what, count in _mapped.items())
        # The script's output first: in a log that joins both streams, this line comes after
        # its last line instead of landing inside it.
        try:
            sys.stdout.flush()
        except (OSError, ValueError):  # stdout closed or gone: the line below still matters
            pass
        # One write, so the lines of processes sharing the terminal (torchrun's ranks) never mix.
        sys.stderr.write(f"ampshim --device cpu: ran on the CPU in place of CUDA: {done}\n")
        sys.stderr.flush()


# --- tensors and modules: every torch function with a CUDA device goes to the CPU ---------------

def _is_cuda(device) -> bool:
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)  # device=0 means cuda:0


_CUDA_TYPE_NAMES = {f"torch.cuda.{name}": f"torch.{name}" for name in (
    "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
    "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor")}


class _CudaToCpu(TorchFunctionMode):
    """Rewrites CUDA devices in the arguments of every torch call to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            _record(".cuda()")
            return args[0]
        if func is torch.Tensor.pin_memory:
            return args[0]
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            _record("device='cuda'")
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            _record(".to('cuda')")
            args = (args[0], "cpu", *args[2:])
        elif func is torch.Tensor.type and len(args) > 1 and isinstance(args[1], str) \
                and args[1] in _CUDA_TYPE_NAMES:
            _record(".type('torch.cuda.*Tensor')")
            args = (args[0], _CUDA_TYPE_NAMES[args[1]], *args[2:])
        return func(*args, **kwargs)


# --- torch.cuda: CPU stand-ins ---------------------------------------------------------------------

class _Event:
    """``torch.cuda.Event`` on the CPU: ``elapsed_time`` measures wall-clock time between records."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self._time = None

    def record(self, stream=None):
        self._time = time.perf_counter()

    def elapsed_time(self, end_event):
        return (end_event._time - self._time) * 1000.0

    def query(self):
        return True

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass


class _Stream(torch.cpu.Stream):
    """``torch.cuda.Stream`` on the CPU, where work is done when it returns."""

    def __init__(self, device=None, priority=0, **kwargs):
        super().__init__()

    def synchronize(self):
        pass

    def query(self):
        return True


_DEFAULT_STREAM = _Stream()

# Answered, not reported: torch itself calls these all the time (torch.manual_seed seeds CUDA too).
_UNREPORTED = {"is_available", "is_initialized", "device_count", "current_device", "get_device_name",
               "get_device_capability", "is_bf16_supported", "current_stream", "default_stream",
               "manual_seed", "manual_seed_all", "seed", "seed_all",
               "record_stream", "nvtx.range_push", "nvtx.range_pop", "nvtx.mark"}


class _DeviceScope:
    """``with torch.cuda.device(i):``: the current device is ``i`` inside."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        self._previous = _state["device"]
        _set_device(self.device)

    def __exit__(self, *exc):
        _state["device"] = self._previous


def _set_device(device):
    if isinstance(device, (str, torch.device)):
        device = torch.device(device).index or 0
    _state["device"] = device if isinstance(device, int) and device >= 0 else _state["device"]


def _device_count():
    # One GPU per local process, so `local_rank % device_count()` and `set_device(local_rank)` work.
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def _nothing(*args, **kwargs):
    return None


def _zero(*args, **kwargs):
    return 0


_CUDA_STAND_INS = {
    "is_available": lambda: _state["pretend_cuda"],
    "is_initialized": lambda: True,
    "device_count": _device_count,
    "current_device": lambda: _state["device"],
    "set_device": _set_device,
    "device": _DeviceScope,
    "synchronize": _nothing,
    "empty_cache": _nothing,
    "manual_seed": _nothing,  # the CPU generator, which now makes "CUDA" numbers, has torch.manual_seed
    "manual_seed_all": _nothing,
    "seed": _nothing,
    "seed_all": _nothing,
    "memory_allocated": _zero,
    "max_memory_allocated": _zero,
    "memory_reserved": _zero,
    "max_memory_reserved": _zero,
    "reset_peak_memory_stats": _nothing,
    "reset_max_memory_allocated": _nothing,
    "get_device_name": lambda device=None: "CPU (ampshim --device cpu)",
    "get_device_capability": lambda device=None: (0, 0),
    "is_bf16_supported": lambda *args, **kwargs: True,
    "Stream": _Stream,
    "stream": torch.cpu.stream,
    "current_stream": lambda device=None: _DEFAULT_STREAM,
    "default_stream": lambda device=None: _DEFAULT_STREAM,
    "Event": _Event,
}


def _installed(name, stand_in):
    """The callable to install as ``torch.cuda.<name>``: a function of its own for each name, as
    torch.compile's tables hold every torch function once."""
    if isinstance(stand_in, type):
        return stand_in
    report = name not in _UNREPORTED

    @functools.wraps(stand_in)
    def call(*args, **kwargs):
        if report:
            _record(f"torch.cuda.{name}")
        return stand_in(*args, **kwargs)

    return call


def _patch_torch_cuda():
    for name, stand_in in _CUDA_STAND_INS.items():
        setattr(torch.cuda, name, _installed(name, stand_in))
    for cuda_name, cpu_name in _CUDA_TYPE_NAMES.items():
        setattr(torch.cuda, cuda_name.rpartition(".")[2], getattr(torch, cpu_name.rpartition(".")[2]))
    torch.Tensor.record_stream = _installed("record_stream", _nothing)  # its parser refuses CPU streams
    for name in ("range_push", "range_pop", "mark"):
        setattr(torch.cuda.nvtx, name, _installed(f"nvtx.{name}", _nothing))
    data_parallel_init = torch.nn.DataParallel.__init__

    @functools.wraps(data_parallel_init)
    def plain_module_data_parallel(self, *args, **kwargs):
        _record("DataParallel -> the module itself")
        _state["pretend_cuda"] = False  # what DataParallel does without a GPU: call the module
        try:
            data_parallel_init(self, *args, **kwargs)
        finally:
            _state["pretend_cuda"] = True

    torch.nn.DataParallel.__init__ = plain_module_data_parallel


# --- torch.distributed: gloo for nccl, no device_ids ------------------------------------------------

def _gloo_for_nccl(function):
    @functools.wraps(function)
    def call(*args, **kwargs):
        if args and _is_nccl(args[0]):
            args = ("gloo", *args[1:])
            _record("backend 'nccl' -> 'gloo'")
        if _is_nccl(kwargs.get("backend")):
            kwargs["backend"] = "gloo"
            _record("backend 'nccl' -> 'gloo'")
        return function(*args, **kwargs)

    return call


def _is_nccl(backend) -> bool:
    return isinstance(backend, str) and "nccl" in backend.lower()


def _patch_distributed():
    dist = torch.distributed
    if dist.is_available():
        dist.init_process_group = _gloo_for_nccl(dist.init_process_group)
        dist.distributed_c10d.init_process_group = dist.init_process_group
        dist.new_group = dist.distributed_c10d.new_group = _gloo_for_nccl(dist.new_group)
    ddp_init = torch.nn.parallel.DistributedDataParallel.__init__

    @functools.wraps(ddp_init)
    def cpu_ddp_init(self, module, device_ids=None, output_device=None, *args, **kwargs):
        if device_ids is not None or output_device is not None:
            _record("DDP device_ids dropped")
        ddp_init(self, module, None, None, *args, **kwargs)

    torch.nn.parallel.DistributedDataParallel.__init__ = cpu_ddp_init


# --- mixed precision: float16 autocast becomes the CPU's bfloat16 autocast -------------------------

def _patch_amp():
    autocast_init = torch.amp.autocast_mode.autocast.__init__

    @functools.wraps(autocast_init)
    def cpu_autocast_init(self, device_type, dtype=None, *args, **kwargs):
        if device_type == "cuda":
            _record("float16 autocast -> bfloat16 on the CPU")
            device_type = "cpu"
            dtype = torch.bfloat16 if dtype in (None, torch.float16) else dtype
        autocast_init(self, device_type, dtype, *args, **kwargs)

    torch.amp.autocast_mode.autocast.__init__ = cpu_autocast_init
    scaler_init = torch.amp.GradScaler.__init__

    @functools.wraps(scaler_init)
    def cpu_scaler_init(self, device="cuda", *args, **kwargs):
        scaler_init(self, "cpu" if device == "cuda" else device, *args, **kwargs)

    torch.amp.GradScaler.__init__ = cpu_scaler_init


def _patch_load():
    load = torch.load

    @functools.wraps(load)
    def cpu_load(f, map_location=None, *args, **kwargs):
        meta = map_location in ("meta", torch.device("meta"))
        return load(f, map_location if meta else "cpu", *args, **kwargs)

    torch.load = torch.serialization.load = cpu_load


# AMPSHIM_DEVICE=cpu asks for the mapping as soon as torch is imported; when this module's own
# import brought torch in, the start-up hook left the switch to this line (see _device_hook).
from ampshim._device_hook import DEVICE_ENV_VAR, maps_cuda_to_cpu  # noqa: E402

if maps_cuda_to_cpu(os.environ.get(DEVICE_ENV_VAR, "")):
    enable()
