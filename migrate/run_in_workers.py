"""Files worked on in worker processes, and Ctrl-C: the first asks the run to stop after the files
in progress, the second stops it at once; no file is ever left half-written."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Callable

from migrate import files

__all__ = ["StopOnInterrupt", "cores", "run_parallel"]


class StopOnInterrupt:
    """While active (in the main thread), the first SIGINT asks the run to stop after the files in
    progress, so that none is left half-done and the summary says what was written; the second
    raises KeyboardInterrupt at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self) -> "StopOnInterrupt":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_interrupt)
        return self

    def __exit__(self, *_exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _on_interrupt(self, _signal, _frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


def run_parallel(todo: list[Path], workers: int, results: dict, stop: StopOnInterrupt, task: Callable, *run) -> None:
    """One task a file, in worker processes that leave Ctrl-C to this one. Only a few files are
    handed out ahead, so that on a stop request only the files in progress are finished."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait  # here: one-file runs start faster

    waiting = iter(todo)
    running = {}

    def hand_out_one() -> None:
        path = next(waiting, None)
        if path is not None:
            running[pool.submit(task, path, *run)] = path

    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_fork_context(), initializer=_leave_interrupts)
    try:
        for _ in range(2 * workers):  # two each: a worker never waits for its next file
            hand_out_one()
        while running:
            done, _ = wait(running, timeout=0.1, return_when=FIRST_COMPLETED)
            for future in done:
                results[running.pop(future)] = future.result()
                if not stop.requested:
                    hand_out_one()
    except KeyboardInterrupt:  # asked twice: the workers stop now (a replace is one rename)
        _stop_workers()
        pool.shutdown(wait=False)
        raise
    pool.shutdown()


def _leave_interrupts() -> None:
    """In a worker: Ctrl-C is for the main process to handle; SIGTERM ends it at once, cleanly."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, files.exit_now)


def _stop_workers() -> None:
    import multiprocessing

    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout=2)
        if child.is_alive():
            child.kill()


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _fork_context():
    """Fork where it exists: workers inherit the imported rules instead of importing them again."""
    import multiprocessing

    return multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
