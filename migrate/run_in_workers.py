"""Files worked on in worker processes, and Ctrl-C: the first asks the run to stop after the files
in progress, the second stops it at once; no file is ever left half-written."""
from __future__ import annotations

import os
import signal
import threading
from typing import Callable, Iterable

from migrate import files

__all__ = ["StopOnInterrupt", "WorkerPool", "cores"]


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


class WorkerPool:
    """Worker processes that leave Ctrl-C to this one, for the jobs of one run. On leaving it after
    a second Ctrl-C (KeyboardInterrupt) the workers are stopped at once (a replace is one rename)."""

    def __init__(self, workers: int, stop: StopOnInterrupt) -> None:
        from concurrent.futures import ProcessPoolExecutor  # here: one-file runs start faster

        self._workers = workers
        self._stop = stop
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=_fork_context(), initializer=_leave_interrupts)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, kind, *_exc) -> None:
        if kind is KeyboardInterrupt:
            _stop_workers()
            self._pool.shutdown(wait=False)
        else:
            self._pool.shutdown()

    def run(self, jobs: Iterable[tuple[object, Callable, tuple]], on_done: Callable[[object, object], None]) -> None:
        """Each job ``(key, function, arguments)`` runs in a worker; ``on_done(key, result)`` is called
        here as it ends. Jobs are drawn from ``jobs`` only as workers need them (two each ahead,
        so a worker never waits), so a generator of jobs may work between two; after a stop
        request none is drawn, and only the jobs in progress are finished."""
        from concurrent.futures import FIRST_COMPLETED, wait

        waiting = iter(jobs)
        running = {}

        def hand_out_one() -> None:
            job = next(waiting, None)
            if job is not None:
                key, function, arguments = job
                running[self._pool.submit(function, *arguments)] = key

        for _ in range(2 * self._workers):
            if not self._stop.requested:
                hand_out_one()
        while running:
            done, _ = wait(running, timeout=0.1, return_when=FIRST_COMPLETED)
            for future in done:
                on_done(running.pop(future), future.result())
                if not self._stop.requested:
                    hand_out_one()


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
