"""ampmigrate: rewrite NVIDIA apex mixed-precision code into native torch.amp, and lint it.

This package never imports torch: it runs in a pre-commit environment with libcst and click only.
"""
from migrate.api import Interrupted, migrate_paths, migrate_source, select_rules
from migrate.types import Diagnostic, FileResult, Fix, Position, Safety

__all__ = ["Diagnostic", "FileResult", "Fix", "Interrupted", "Position", "Safety", "migrate_paths",
           "migrate_source", "select_rules"]
