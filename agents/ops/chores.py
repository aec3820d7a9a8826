"""Background jobs' one error policy: a failure is logged, counted and retried after a backoff, never fatal."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from typing import Any, Awaitable, Callable

log = logging.getLogger(__name__)

MAX_BACKOFF = 60.0  # seconds: a lasting fault is retried once a minute


class Chores:
    """Runs a worker's timers and background loops so that one failing job never stops the worker.

    Faust stops the whole app when a task or timer raises: a disk error in retention, or a
    broker error while committing, would take the apply path and the HTTP API down with it.
    Every job goes through here instead: the failure is logged with its traceback, counted in
    /healthz and /metrics, and the job is skipped for a backoff that doubles while it keeps
    failing (1 s to a minute), so a lasting fault does not starve the writer thread.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_backoff: float = MAX_BACKOFF) -> None:
        self.clock = clock
        self.max_backoff = max_backoff
        self.failures: Counter[str] = Counter()  # job -> failures since start
        self.last_error: dict[str, str] = {}  # job -> exception type of its last failure (no message: it may hold data)
        self.streak: Counter[str] = Counter()  # job -> failures in a row
        self.resume_at: dict[str, float] = {}  # job -> clock reading before which a timer's runs are skipped
        self.runs: Counter[str] = Counter()  # job -> completed runs since start (operators see a timer is alive)

    def failed(self, name: str, exc: BaseException) -> float:
        """Record one failure of `name`; the seconds to wait before running it again."""
        self.failures[name] += 1
        self.streak[name] += 1
        self.last_error[name] = type(exc).__name__
        backoff = min(self.max_backoff, 2.0 ** (self.streak[name] - 1))
        self.resume_at[name] = self.clock() + backoff
        log.error("background job %s failed (%d in a row); it runs again in %.0f s", name, self.streak[name], backoff,
                  exc_info=exc, extra={"reason": "background_job_failed", "job": name})
        return backoff

    def succeeded(self, name: str) -> None:
        """A run of `name` completed: the next failure starts from the shortest backoff again."""
        self.streak.pop(name, None)

    def timer(self, name: str) -> Callable[[Callable[[], Awaitable[Any]]], Callable[[], Awaitable[Any]]]:
        """Decorate a timer's body: a failure is recorded and runs are skipped until the backoff passed."""
        def wrap(body: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
            @functools.wraps(body)
            async def run() -> Any:
                if self.clock() < self.resume_at.get(name, float("-inf")):
                    return None
                try:
                    result = await body()
                except Exception as exc:  # noqa: BLE001 - the policy itself: recorded, retried, never fatal
                    self.failed(name, exc)
                    return None
                self.succeeded(name)
                self.runs[name] += 1
                return result
            run.background_job = name  # type: ignore[attr-defined]  # tests check every job is guarded
            return run
        return wrap

    def loop(self, name: str, step: Callable[[], Awaitable[float]]) -> Callable[[], Awaitable[None]]:
        """A task running `step` until cancelled, pausing as long as each run returns; a failure waits the backoff."""
        async def run() -> None:
            while True:
                try:
                    pause = await step()
                except Exception as exc:  # noqa: BLE001 - the policy itself: recorded, retried, never fatal
                    await asyncio.sleep(self.failed(name, exc))
                    continue
                self.succeeded(name)
                await asyncio.sleep(pause)
        run.__name__ = run.__qualname__ = name
        run.background_job = name  # type: ignore[attr-defined]
        return run

    def as_dict(self) -> dict:
        """Shape shown in /healthz: failures per job since start, and the type of each job's last failure."""
        return {"failures": dict(self.failures), "last_error": dict(self.last_error), "runs": dict(self.runs),
                "failing_now": sorted(name for name, n in self.streak.items() if n)}
