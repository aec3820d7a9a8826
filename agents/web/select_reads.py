"""The select path's reads of the state file, on a thread and cursor of their own: never on the HTTP loop."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:
    from state.local_state import LocalState

T = TypeVar("T")

THREAD_NAME = "freshplan-select"


class SelectReads:
    """Runs a select's cache-miss lookup (entity names, the key's fresh plan, the token's position) on one thread.

    The loop also carries the replica's fetches, the publisher's sends and every other request.
    A DuckDB read there takes what the writer leaves it: under 1,000 events/s such reads held the
    loop up to 5 s (cached select p99 1.3 s, and the announcements of the events behind them
    waited as long). Memory hits stay on the loop.
    """

    def __init__(self, state: "LocalState") -> None:
        self.state = state  # a reader of its own (`LocalState.reader()`): used on this thread only
        self.reads = 0  # reads run, for /healthz
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)

    async def run(self, fn: Callable[["LocalState"], T]) -> T:
        """`fn(state)` on the select thread; what it returns (or raises)."""
        self.reads += 1
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, self.state)

    def close(self) -> None:
        """Wait for the running read (if any), stop the thread and close its cursor; call before closing the file."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.state.store.close()
