"""Reads of the state file on a thread and cursor of their own: beside the writer, and never on the event loop."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:
    from state.local_state import LocalState

T = TypeVar("T")


class ReadThread:
    """Runs reads of committed state on one thread, through a reader of its own (`LocalState.reader()`).

    A read queued on the writer waits for every job ahead of it (an input batch under a stream
    takes hundreds of ms); one on the loop holds up every request and fetch while DuckDB runs.
    """

    def __init__(self, state: "LocalState", thread_name: str) -> None:
        self.state = state  # used on this thread only
        self.reads = 0  # reads run, for /healthz
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)

    async def run(self, fn: Callable[["LocalState"], T]) -> T:
        """`fn(state)` on this thread; what it returns (or raises)."""
        self.reads += 1
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, self.state)

    def close(self) -> None:
        """Wait for the running read (if any), stop the thread and close its cursor; call before closing the file."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.state.store.close()
