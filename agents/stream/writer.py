"""The writer: one thread that owns the read-write DuckDB connection and runs every state write."""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")

THREAD_NAME = "freshplan-writer"
SWITCH_INTERVAL_SECONDS = 0.001
"""How long the writer may hold the GIL while the loop waits for it (Python's default is 5 ms).

The loop releases the GIL on every socket and DuckDB call and waits up to this long to get
it back while the writer compiles in Python, so a select pays it once per such call."""


class Writer:
    """A single-thread executor: applying, compiling and storing never run on the event loop that serves HTTP.

    One thread means one writer of the DuckDB file, so writes never conflict with each other
    (an apply batch and a select's compiled plan both write plans); the loop reads committed
    state through its own cursor (`Store.view()`) meanwhile, and awaits what it asked for.
    """

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        self.jobs = 0  # jobs run, for /healthz

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` on the writer thread and return (or raise) what it did."""
        self.jobs += 1
        call = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
        # A cancelled caller does not stop the job: it runs to its commit or rollback.
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    @staticmethod
    def on_writer_thread() -> bool:
        """Whether the calling code runs on the writer's thread."""
        return threading.current_thread().name.startswith(THREAD_NAME)

    def close(self) -> None:
        """Wait for the running job (if any) and stop the thread; call before closing the file."""
        self._executor.shutdown(wait=True, cancel_futures=True)


async def inline(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run `fn` on the caller's thread: a stand-in for `Writer.run` where no writer thread exists (unit tests)."""
    return fn(*args, **kwargs)
