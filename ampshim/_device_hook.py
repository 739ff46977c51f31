"""``AMPSHIM_DEVICE=cpu``: map CUDA to the CPU as soon as the script imports torch, in every process.

Runs when ampshim is imported, at interpreter start through the ``.pth`` hook too, so it never
imports torch: it waits for the script's own ``import torch``, then turns on
:mod:`ampshim.cuda_on_cpu`. Processes launched by ``torchrun`` inherit the variable, and with it the
mapping.
"""
from __future__ import annotations

import os
import sys

__all__ = ["DEVICE_ENV_VAR", "maps_cuda_to_cpu", "install"]

DEVICE_ENV_VAR = "AMPSHIM_DEVICE"


def maps_cuda_to_cpu(value: str) -> bool:
    """True for ``"cpu"``, False for ``""``/``"cuda"`` (nothing to map); a clear error otherwise."""
    value = value.strip().lower()
    if value in ("", "cuda"):
        return False
    if value == "cpu":
        return True
    raise ValueError(
        f"{DEVICE_ENV_VAR}={value!r}: ampshim can run CUDA scripts on 'cpu' only. Set "
        f"{DEVICE_ENV_VAR}=cpu (or run python -m ampshim --device cpu), or unset it to use CUDA.")


def _enable_requested() -> None:
    if maps_cuda_to_cpu(os.environ.get(DEVICE_ENV_VAR, "")):
        importing = sys.modules.get("ampshim.cuda_on_cpu")
        if importing is not None and not hasattr(importing, "enable"):
            return  # torch was imported by cuda_on_cpu's own import: it turns itself on at its end
        from ampshim import cuda_on_cpu

        cuda_on_cpu.enable()


class _AfterTorchImport:
    """A meta-path finder that lets torch import as usual, then runs :func:`_enable_requested`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _enable_requested()

        spec.loader.exec_module = exec_module  # this spec's own loader instance
        return spec


def install() -> None:
    """With ``AMPSHIM_DEVICE`` set, map CUDA to the CPU now (torch imported) or once torch is imported."""
    if not os.environ.get(DEVICE_ENV_VAR, "").strip():
        return
    if "torch" in sys.modules:
        _enable_requested()
    elif not any(isinstance(finder, _AfterTorchImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())
