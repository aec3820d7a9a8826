"""The writer: one thread that owns the read-write DuckDB connection and runs every state write."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
from collections import deque
from typing import Any, Callable, TypeVar

T = TypeVar("T")

THREAD_NAME = "freshplan-writer"
SWITCH_INTERVAL_SECONDS = 0.001
"""How long the writer may hold the GIL while the loop waits for it (Python's default is 5 ms).

The loop releases the GIL on every socket and DuckDB call and waits up to this long to get
it back while the writer compiles in Python, so a select pays it once per such call."""

FIRST_IN_A_ROW = 4
"""`run_first` jobs run ahead of `run` jobs, but no more than this many in a row while one of those waits: a
flood of selects that must compile slows the input down and never stops it (the revocation guard would then
refuse every select)."""

FIRST_AHEAD_AT_MOST = 0.1
"""Seconds an input batch lets younger `run_first` jobs go ahead of it (and `FIRST_IN_A_ROW` bounds all that do).
A job of selects compiled together can take hundreds of ms under a stream, so counting jobs alone let four such
jobs hold an input batch for 3.2 s (and every select of a plan announced meanwhile waited for it); a time bound
alone, with batches always waiting past it, held the selects for 3.6 s instead."""

LATER_WAITS_AT_MOST = 1.0
"""Seconds a `run_later` job waits while other jobs keep coming: then it runs next, so a writer kept busy by a
stream still compiles successors, enforces retention and prunes, one job at a time."""


class Writer:
    """A single-thread executor: applying, compiling and storing never run on the event loop that serves HTTP.

    One thread means one writer of the DuckDB file, so writes never conflict with each other
    (an apply batch and a select's compiled plan both write plans); the loop reads committed
    state through its own cursor (`Store.view()`) meanwhile, and awaits what it asked for.

    Jobs run in submission order, except that a caller waiting on the answer (`run_first`: a select
    that must compile) goes ahead of input batches (up to `FIRST_IN_A_ROW` in a row: those queued before
    the oldest batch, and younger ones only while it has waited less than `FIRST_AHEAD_AT_MOST`), and work
    nobody waits on (`run_later`: successors of announced plans, retention, pruning) runs when no
    other job is queued, or once it has waited `LATER_WAITS_AT_MOST`: a select that must compile
    waits for the job running, not for the input batches and recompiles queued before it.
    """

    def __init__(self, later_waits_at_most: float = LATER_WAITS_AT_MOST, first_in_a_row: int = FIRST_IN_A_ROW,
                 first_ahead_at_most: float = FIRST_AHEAD_AT_MOST) -> None:
        self.later_waits_at_most = later_waits_at_most
        self.first_in_a_row = first_in_a_row
        self.first_ahead_at_most = first_ahead_at_most
        self._ready = threading.Condition()
        self._first: deque[tuple[float, Callable[[], Any], concurrent.futures.Future]] = deque()
        self._now: deque[tuple[float, Callable[[], Any], concurrent.futures.Future]] = deque()
        self._later: deque[tuple[float, Callable[[], Any], concurrent.futures.Future]] = deque()
        self._firsts = 0  # `run_first` jobs taken in a row while a `run` job waited
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=f"{THREAD_NAME}_0", daemon=True)
        self._thread.start()
        self.jobs = 0  # jobs run, for /healthz

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` on the writer thread and return (or raise) what it did."""
        return await self._submit(self._now, fn, args, kwargs)

    async def run_first(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """As `run`, ahead of the `run` jobs waiting (see `FIRST_IN_A_ROW`)."""
        return await self._submit(self._first, fn, args, kwargs)

    async def run_later(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """As `run`, after the jobs submitted with `run` that are waiting when it would start (for a while at most)."""
        return await self._submit(self._later, fn, args, kwargs)

    async def _submit(self, jobs: deque, fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
        call = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
        job: concurrent.futures.Future = concurrent.futures.Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the writer is closed")
            jobs.append((time.monotonic(), call, job))
            self._ready.notify()
        self.jobs += 1
        # A cancelled caller does not stop the job once it runs: it runs to its commit or rollback.
        return await asyncio.wrap_future(job)

    def _next(self) -> tuple[Callable[[], Any], concurrent.futures.Future] | None:
        """The next job to run (None: closed and nothing left)."""
        with self._ready:
            while not self._first and not self._now and not self._later:
                if self._closed:
                    return None
                self._ready.wait()
            now = time.monotonic()
            if self._later and now - self._later[0][0] >= self.later_waits_at_most:
                jobs = self._later
            elif self._first and (not self._now or self._firsts < self.first_in_a_row and (
                    self._first[0][0] <= self._now[0][0] or now - self._now[0][0] < self.first_ahead_at_most)):
                jobs = self._first
                self._firsts += bool(self._now)
            else:
                jobs = self._now or self._later
                self._firsts = 0 if jobs is self._now else self._firsts
            _, call, job = jobs.popleft()
            return call, job

    def _work(self) -> None:
        while (taken := self._next()) is not None:
            call, job = taken
            if not job.set_running_or_notify_cancel():
                continue  # its caller was cancelled before it started
            try:
                result = call()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, as an executor does
                job.set_exception(exc)
            else:
                job.set_result(result)

    @staticmethod
    def on_writer_thread() -> bool:
        """Whether the calling code runs on the writer's thread."""
        return threading.current_thread().name.startswith(THREAD_NAME)

    def close(self) -> None:
        """Wait for the running job (if any), cancel the queued ones and stop the thread; call before closing the
        file."""
        with self._ready:
            self._closed = True
            for jobs in (self._first, self._now, self._later):
                while jobs:
                    jobs.popleft()[2].cancel()
            self._ready.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()


async def inline(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run `fn` on the caller's thread: a stand-in for `Writer.run` where no writer thread exists (unit tests)."""
    return fn(*args, **kwargs)
