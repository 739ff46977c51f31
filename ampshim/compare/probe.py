"""The process of one side of ``python -m ampshim compare``: set up, record, run the script.

``python -m ampshim.compare.probe SCRIPT.py ARGS...`` or ``... -m MODULE ARGS...``, with its
settings in the ``AMPSHIM_COMPARE`` environment variable (JSON, so ``torchrun``'s workers get
them too): ``record`` (a folder: each rank writes ``rank<N>.jsonl``), ``steps``, ``seed`` and
``apex``: ``"serve"`` (the original, or a partial migration under ``--allow-apex``) or
``"block"`` (the migration: importing apex is an error that says it is incomplete).
"""
from __future__ import annotations

import json
import os
import random
import sys
import traceback
import warnings

import ampshim
from ampshim._launch import run_module, run_script
from ampshim.compare.runner import SETTINGS_ENV_VAR

_INCOMPLETE = (
    "ampshim compare: the migrated script imports {name!r}, but apex is not available to it: "
    "the migration is incomplete. Finish migrating it (ampmigrate, then the manual steps it "
    "lists), or pass --allow-apex to compare a partial migration that still runs on ampshim.")


class _BlockApex:
    """A meta-path finder that refuses ``apex`` and says why."""

    def __init__(self, recorder) -> None:
        self._recorder = recorder

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "apex" and not fullname.startswith("apex."):
            return None
        self._recorder.emit("apex_import", name=fullname)
        raise ModuleNotFoundError(_INCOMPLETE.format(name=fullname), name=fullname)


def _seed(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)  # every device, CUDA included
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(seed)
    # torch.use_deterministic_algorithms(True, warn_only=True) without its import of the
    # compiler's config (half a second): a script that compiles sets that itself.
    set_deterministic = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_deterministic is not None:
        set_deterministic(True, warn_only=True)
    else:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation.*")


def main(argv: list[str]) -> int:
    settings = json.loads(os.environ[SETTINGS_ENV_VAR])
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: determinism
    serve_apex = settings["apex"] == "serve"
    if not serve_apex:
        ampshim.uninstall()

    from ampshim.compare.recorder import Recorder, StopTraining, install

    rank = os.environ.get("RANK", "0")
    recorder = Recorder(os.path.join(settings["record"], f"rank{rank}.jsonl"), settings["steps"])
    recorder.emit("start", rank=int(rank), pid=os.getpid())
    if not serve_apex:
        sys.meta_path.insert(0, _BlockApex(recorder))
    install(recorder, apex=serve_apex)
    _seed(settings["seed"])
    try:
        if argv[0] == "-m":
            run_module(argv[1], argv[2:], serve_apex=serve_apex)
        else:
            run_script(argv[0], argv[1:], serve_apex=serve_apex)
    except StopTraining:
        return 0
    except SystemExit as exit_:
        code = exit_.code
        failed = code not in (None, 0)
        recorder.end("error" if failed else "exit",
                     error=f"exited with {code!r}" if failed else None)
        raise
    except KeyboardInterrupt:
        recorder.end("error", error="KeyboardInterrupt")
        raise
    except BaseException as error:
        recorder.end("error", error="".join(traceback.format_exception_only(error)).strip())
        sys.stderr.write(_script_traceback(error))
        return 1
    recorder.end("exit")
    return 0


def _script_traceback(error: BaseException) -> str:
    """The traceback as ``python script.py`` prints it: without this probe's frames above it."""
    import ampshim._launch

    report = traceback.TracebackException.from_exception(error)
    ours = {os.path.abspath(__file__), os.path.abspath(ampshim._launch.__file__)}
    frames = list(report.stack)
    while frames and os.path.abspath(frames[0].filename) in ours:
        frames.pop(0)
    report.stack = traceback.StackSummary.from_list(frames)
    return "".join(report.format())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
