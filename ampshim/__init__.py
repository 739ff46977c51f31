"""ampshim: legacy NVIDIA apex mixed-precision code, running unchanged on native ``torch.amp``.

Importing this package makes the ``apex`` import name available (``from apex import amp``).
It never imports torch itself: torch is loaded when an ``apex`` module is first imported.
"""
from ampshim._alias import install, uninstall

__all__ = ["install", "uninstall"]

install()
