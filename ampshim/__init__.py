"""ampshim: legacy NVIDIA apex mixed-precision code, running unchanged on native ``torch.amp``.

Importing this package makes the ``apex`` import name available (``from apex import amp``) and,
with ``AMPSHIM_DEVICE=cpu``, runs CUDA code on the CPU once torch is imported.
It never imports torch itself: torch is loaded when an ``apex`` module is first imported.
"""
from ampshim._alias import install, uninstall
from ampshim._device_hook import install as _install_device_hook

__all__ = ["install", "uninstall"]

install()
_install_device_hook()
