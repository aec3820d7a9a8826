"""Stopping within a deadline: a worker whose broker is gone must still exit promptly on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Awaitable, Callable

log = logging.getLogger(__name__)

STOP_SECONDS = 5.0
"""How long the services (Faust's consumer, producer, agents and tasks) get to stop."""
EXIT_SECONDS = 8.5
"""After this long from the signal the process exits whatever is still waiting."""


async def bounded_stop(stopping: Awaitable[object], cleanup: Callable[[], object]) -> None:
    """Await a service's stop for at most STOP_SECONDS; exit the process at EXIT_SECONDS regardless.

    Faust waits on the broker while it stops (commits, flushes, leaving the group); with the
    broker gone it would wait for ever. Nothing is lost by not waiting: state and outbox are
    committed in DuckDB transactions, and what was not acknowledged is published after a restart.
    """
    _watchdog(EXIT_SECONDS, cleanup)
    task = asyncio.ensure_future(stopping)
    done, _ = await asyncio.wait({task}, timeout=STOP_SECONDS)
    if not done:
        task.cancel()  # not awaited: a service that swallows cancellation must not hold the exit
        log.warning("services did not stop within %.0fs (is the broker reachable?); exiting without them",
                    STOP_SECONDS, extra={"reason": "stop_timeout"})


def _watchdog(seconds: float, cleanup: Callable[[], object]) -> None:
    def expire() -> None:
        log.error("shutdown did not finish within %.0fs; exiting now (committed state is kept)", seconds,
                  extra={"reason": "stop_timeout"})
        try:
            cleanup()
        finally:
            os._exit(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
