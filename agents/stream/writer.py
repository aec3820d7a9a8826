"""The writer: one thread that owns the read-write DuckDB connection and runs every state write."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import queue
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")

THREAD_NAME = "freshplan-writer"
SWITCH_INTERVAL_SECONDS = 0.001
"""How long the writer may hold the GIL while the loop waits for it (Python's default is 5 ms).

The loop releases the GIL on every socket and DuckDB call and waits up to this long to get
it back while the writer compiles in Python, so a select pays it once per such call."""

NOW, LATER = 0, 1  # job classes: a queued `NOW` job runs before any queued `LATER` one
_STOP = 2  # after everything queued


class Writer:
    """A single-thread executor: applying, compiling and storing never run on the event loop that serves HTTP.

    One thread means one writer of the DuckDB file, so writes never conflict with each other
    (an apply batch and a select's compiled plan both write plans); the loop reads committed
    state through its own cursor (`Store.view()`) meanwhile, and awaits what it asked for.

    Jobs run in submission order, except that work nobody waits on (`run_later`: successors of
    announced plans, retention, pruning) runs only when no other job is queued: a select that
    must compile waits for the job running, not for a backlog of recompiles queued before it.
    """

    def __init__(self) -> None:
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._work, name=f"{THREAD_NAME}_0", daemon=True)
        self._thread.start()
        self.jobs = 0  # jobs run, for /healthz
        self._closed = False

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` on the writer thread and return (or raise) what it did."""
        return await self._submit(NOW, fn, args, kwargs)

    async def run_later(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """As `run`, after every job submitted with `run` that is waiting when this one would start."""
        return await self._submit(LATER, fn, args, kwargs)

    async def _submit(self, kind: int, fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
        if self._closed:
            raise RuntimeError("the writer is closed")
        self.jobs += 1
        call = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
        job: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((kind, next(self._order), call, job))
        # A cancelled caller does not stop the job once it runs: it runs to its commit or rollback.
        return await asyncio.wrap_future(job)

    def _work(self) -> None:
        while True:
            kind, _, call, job = self._queue.get()
            if kind == _STOP:
                return
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
        self._closed = True
        while True:
            try:
                _, _, _, job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
        self._queue.put((_STOP, next(self._order), None, None))
        if threading.current_thread() is not self._thread:
            self._thread.join()


async def inline(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run `fn` on the caller's thread: a stand-in for `Writer.run` where no writer thread exists (unit tests)."""
    return fn(*args, **kwargs)
