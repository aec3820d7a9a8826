"""Successors of announced plans wait, for a bounded time, for input fetched and not applied yet."""

from __future__ import annotations

import time
from typing import Callable

HOLD_AT_MOST = 0.1
"""Seconds successors may wait for fetched input in a row: a steady stream delays them this long at most."""


class SuccessorHold:
    """Whether the backlog leaves the writer to the input batch about to be applied.

    The writer picks a backlog job as soon as an apply batch ends, before the replica hands it the
    batch fetched meanwhile. A successor compiled then misses the edits in that batch: for the edit
    of the plan itself it is stale before it is stored, so it is stored, published and announced
    for nothing, and a subscriber hears of that edit only once the successor has committed. Waiting
    for the batch first compiles a successor that reflects it. A stream that never leaves the input
    empty holds successors for `HOLD_AT_MOST` at most; then one backlog job runs, and the next waits again.
    """

    def __init__(self, input_waiting: Callable[[], bool], at_most: float = HOLD_AT_MOST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.input_waiting = input_waiting
        self.at_most = at_most
        self.clock = clock
        self.since: float | None = None  # when the current hold began (None: not holding)
        self.holds = 0  # holds begun, for /healthz
        self.overdue = 0  # holds that ran out while input still waited (a backlog job then ran), for /healthz

    def holding(self) -> bool:
        """Whether the backlog should wait now (any thread: a race only moves a hold's start)."""
        if not self.input_waiting():
            self.since = None
            return False
        now = self.clock()
        if self.since is None:
            self.since = now
            self.holds += 1
        if now - self.since < self.at_most:
            return True
        self.since = None  # overdue: one job runs, and the hold starts again after it
        self.overdue += 1
        return False

    def as_dict(self) -> dict[str, int]:
        """Figures for /healthz."""
        return {"holds": self.holds, "overdue": self.overdue}
