"""Running a script as ``__main__`` the way ``python script.py`` does, children included.

Used by ``python -m ampshim``. The script gets an absolute ``__file__`` and its ``sys.argv[0]``
as typed, and becomes ``sys.modules["__main__"]`` for good, so pickling its functions works.

Processes started by ``multiprocessing``'s spawn and forkserver methods (DataLoader workers,
``torch.multiprocessing.spawn``) are new interpreters that re-run the script before anything else:
without the start-up ``.pth`` hook, its ``import apex`` would fail there. The data multiprocessing
sends them first carries one extra value whose unpickling imports ampshim, and so serves ``apex``
before the script runs again (coverage.py carries its measurement into children the same way).
"""
from __future__ import annotations

import builtins
import io
import os
import runpy
import sys
import types
import zipfile

__all__ = ["run_script", "run_module"]


def run_script(path: str, args: list[str], *, serve_apex: bool = True) -> None:
    """Run the file ``path`` as ``__main__`` with ``sys.argv = [path, *args]``.

    A directory or zip archive with a ``__main__.py`` runs through :func:`runpy.run_path`.
    ``serve_apex=False`` leaves spawned children without the ``apex`` import name.
    """
    if serve_apex:
        _carry_apex_into_spawned_children()
    absolute = os.path.abspath(path)
    sys.argv = [path, *args]
    if os.path.isdir(absolute) or zipfile.is_zipfile(absolute):
        sys.path[0] = absolute
        runpy.run_path(absolute, run_name="__main__")
        return
    sys.path[0] = os.path.dirname(absolute)
    main = types.ModuleType("__main__")
    main.__file__ = absolute
    main.__builtins__ = builtins
    main.__spec__ = None  # as for any script: multiprocessing then re-runs it by its path
    sys.modules["__main__"] = main
    with io.open_code(absolute) as source:
        code = compile(source.read(), absolute, "exec")
    exec(code, main.__dict__)


def run_module(name: str, args: list[str], *, serve_apex: bool = True) -> None:
    """Run module ``name`` as ``__main__``, as ``python -m name args...`` does."""
    if serve_apex:
        _carry_apex_into_spawned_children()
    sys.argv = [name, *args]
    runpy.run_module(name, run_name="__main__", alter_sys=True)


def _import_ampshim_in_child():
    """Called when a spawned child unpickles the value below: importing this module did the work."""
    return None


class _ServeApexInChild:
    def __reduce__(self):
        return _import_ampshim_in_child, ()


def _carry_apex_into_spawned_children() -> None:
    from multiprocessing import spawn  # only for ``python -m ampshim``: not at interpreter start

    original = spawn.get_preparation_data
    if getattr(original, "_serves_apex", False):
        return

    def get_preparation_data(name):
        data = original(name)
        data["ampshim"] = _ServeApexInChild()  # ignored by the child, except for its import
        return data

    get_preparation_data._serves_apex = True
    spawn.get_preparation_data = get_preparation_data
