"""Status reads (/healthz, /metrics, /v1/plans/{id}): the state file read on a thread of its own, never the loop."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import duckdb

from agents.web.metrics import file_figures
from agents.web.plan_facts import file_health

if TYPE_CHECKING:
    from agents.web.metrics import Metrics
    from agents.web.query import QueryService
    from state.local_state import LocalState

T = TypeVar("T")

THREAD_NAME = "freshplan-status"


def health_figures(state: "LocalState") -> dict[str, Any]:
    """What /healthz reads from the state file: one thread's cursor, so any thread but the loop's."""
    figures = file_health(state)
    figures["parked_plans"] = state.store.db.execute("SELECT count(*) FROM parked_plans").fetchone()[0]
    figures["standby_outbox"] = state.outbox.standby_size()
    figures["recompile_queue"] = state.queue.size()
    return figures


class Status:
    """Answers /healthz and /metrics (and reads plan statuses) from the file, by one thread with a cursor of its own.

    Counting millions of index edges, or any read while both cores are busy, can take tens of
    milliseconds, and a read on the HTTP loop holds every select and announcement that long
    (under load the bench caught /healthz reads holding the loop 30-150 ms). A liveness probe
    every few seconds, a scrape every 15 s, or subscribers asking after each announcement must
    not cost the service its tail latency.
    """

    def __init__(self, state: "LocalState", query: "QueryService", metrics: "Metrics",
                 details: Callable[[dict[str, Any]], dict[str, Any]],
                 shard: Callable[["LocalState"], dict[str, Any]] = lambda state: {}) -> None:
        self.state = state  # a reader of its own (`LocalState.reader()`): used on the status thread only
        self.shard = shard  # the worker's shard figures, read with the file's (`ShardState.figures`)
        self.query = query
        self.metrics = metrics
        self.details = details  # the worker's own health details, given the file's figures
        self.reads = 0  # reads run, for /healthz
        self.thread: str | None = None  # the thread that ran the last read (the status thread's)
        # CPU the reads took on their thread: what polling /healthz costs the worker (a bench that polls its
        # workers subtracts it from their CPU, which would otherwise charge them for being watched).
        self.cpu_seconds = 0.0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)

    async def read(self, fn: Callable[["LocalState"], T]) -> T:
        """`fn(state)` on the status thread; what it returns (or raises)."""
        self.reads += 1
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, fn)

    def _health_figures(self, state: "LocalState") -> dict[str, Any]:
        figures = health_figures(state)
        figures["shard"] = self.shard(state)
        return figures

    def _file_figures(self, state: "LocalState") -> dict[str, Any]:
        figures = file_figures(state)
        figures["shard"] = self.shard(state)
        return figures

    def _run(self, fn: Callable[["LocalState"], T]) -> T:
        self.thread = threading.current_thread().name
        started = time.thread_time()
        try:
            return fn(self.state)
        finally:
            self.cpu_seconds += time.thread_time() - started

    async def health(self) -> dict[str, Any]:
        """The /healthz document: the file's figures from the status thread, the rest from memory on the loop."""
        try:
            figures: dict[str, Any] | None = await self.read(self._health_figures)
        except duckdb.Error as exc:
            self.query.state_failed(exc, counted=False)
            figures = None
        doc = self.query.health(figures)
        if figures is not None:
            doc.update(self.details(figures))
            doc["status_reads"] = {"thread": self.thread, "reads": self.reads,
                                   "cpu_seconds": round(self.cpu_seconds, 4)}
        return doc

    async def metrics_text(self) -> bytes:
        """Prometheus exposition text, the file's figures read on the status thread.

        Raises `StateError` (a 503 for the scraper) when the file cannot be read, marking the worker
        unreadable as a failed health read does: selects are refused, liveness says so.
        """
        try:
            figures = await self.read(self._file_figures)
        except duckdb.Error as exc:
            raise self.query.state_failed(exc, counted=False) from None
        return self.metrics.render(figures)

    def close(self) -> None:
        """Wait for the running read (if any) and stop the thread; call before closing the file."""
        self._executor.shutdown(wait=True, cancel_futures=True)
