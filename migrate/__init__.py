"""ampmigrate: rewrite NVIDIA apex mixed-precision code into native torch.amp, and lint it.

This package never imports torch: it runs in a pre-commit environment with libcst and click only.
"""
