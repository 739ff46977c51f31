"""The ``apex`` import name: a ``sys.meta_path`` finder serving apex's modules from ampshim.

Only the modules that a real installed apex lacks are served. Today's apex still ships
``apex.optimizers`` and ``apex.normalization`` (CUDA builds); it no longer ships ``amp``,
``fp16_utils`` or ``parallel``. A real apex that still has ``apex/amp`` is used untouched.

This module runs at interpreter start (through the ``.pth`` hook), so it imports nothing beyond
what Python has already loaded, and probes the file system only when ``apex`` is imported.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import sys

# apex module name -> the ampshim module that implements it.
_MODULES = {
    "apex": "ampshim._apex",
    "apex.amp": "ampshim.amp",
    "apex.amp.frontend": "ampshim.opt_levels",
    "apex.amp.scaler": "ampshim.scaler",
    "apex.amp._amp_state": "ampshim.state",
    "apex.amp._initialize": "ampshim.initialize",
    "apex.amp._process_optimizer": "ampshim.optimizer",
    "apex.amp.handle": "ampshim.handle",
    "apex.amp.opt": "ampshim.handle",
    "apex.amp.lists": "ampshim.lists",
    "apex.fp16_utils": "ampshim.fp16_utils",
    "apex.parallel": "ampshim.parallel",
    "apex.optimizers": "ampshim.optimizers",
    "apex.normalization": "ampshim.normalization",
    "apex.multi_tensor_apply": "ampshim.multi_tensor_apply",
}


def target_of(fullname: str) -> str | None:
    """The ampshim module behind an apex module name, or None if ampshim has none.

    An exact entry wins; otherwise the submodules of a mapped package follow it
    (``apex.fp16_utils.loss_scaler`` -> ``ampshim.fp16_utils.loss_scaler``).
    """
    if fullname in _MODULES:
        return _MODULES[fullname]
    parent, _, child = fullname.rpartition(".")
    while parent:
        if parent in _MODULES and parent != "apex" and parent != "apex.amp":
            return f"{_MODULES[parent]}.{child}"
        parent, _, head = parent.rpartition(".")
        child = f"{head}.{child}"
    return None


class _AliasLoader:
    """Loads an apex name as the already-importable ampshim module, shared, not copied."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._own_spec = None

    def get_code(self, fullname):
        # For `python -m apex.parallel.multiproc`: runpy runs the target's own code as __main__.
        return _find(self.target).loader.get_code(self.target)

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The import system stamped the apex spec on the shared module; give it back its own,
        # so ampshim's modules stay what they are (reload, pickling, introspection).
        module.__spec__ = self._own_spec


class ApexFinder:
    """Serves ``apex.*`` from ampshim where no real apex module exists."""

    def __init__(self) -> None:
        self._real_apex = None  # (spec or None, has_amp), probed at the first apex import

    def _probe_real_apex(self):
        if self._real_apex is None:
            spec = importlib.machinery.PathFinder.find_spec("apex")
            has_amp = False
            if spec is not None and spec.submodule_search_locations:
                has_amp = importlib.machinery.PathFinder.find_spec(
                    "apex.amp", spec.submodule_search_locations) is not None
            self._real_apex = (spec, has_amp)
        return self._real_apex

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "apex" and not fullname.startswith("apex."):
            return None
        real_spec, real_has_amp = self._probe_real_apex()
        if real_has_amp:
            return None  # a complete real apex: use it, all of it
        if real_spec is not None:
            if fullname == "apex":
                return None
            real_parent = sys.modules.get(fullname.rpartition(".")[0])
            search = getattr(real_parent, "__path__", None)
            if search and importlib.machinery.PathFinder.find_spec(fullname, search) is not None:
                return None  # the real apex has this module
        ampshim_name = target_of(fullname)
        own_spec = _find(ampshim_name) if ampshim_name else None
        if own_spec is None:
            return None
        # apex.amp is a package in apex (apex.amp.scaler, ...) but a module here.
        is_package = own_spec.submodule_search_locations is not None or any(
            name.startswith(fullname + ".") for name in _MODULES)
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(ampshim_name), is_package=is_package)


def _find(module_name: str):
    import importlib.util  # not needed at interpreter start, only once apex is imported

    try:
        return importlib.util.find_spec(module_name)
    except ModuleNotFoundError:  # a parent package is missing
        return None


_finder = ApexFinder()


def install() -> None:
    """Make ``import apex`` resolve to ampshim (idempotent). Torch is not imported here."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Remove the ``apex`` import name; already-imported apex modules stay in ``sys.modules``."""
    while _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
