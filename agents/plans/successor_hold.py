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
    for nothing, and a subscriber hears of that edit only once the successor is stored. Waiting
    for the batch first compiles a successor that reflects it. A stream that never leaves the input
    empty holds successors for `HOLD_AT_MOST` at most; then one backlog job runs, and the next waits again.

    Asked twice per job: by the loop before it submits one, and by the job as it starts on the writer
    (input may have been fetched while it waited). A hold that runs out grants the job the loop submits.
    """

    def __init__(self, input_waiting: Callable[[], bool], at_most: float = HOLD_AT_MOST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.input_waiting = input_waiting
        self.at_most = at_most
        self.clock = clock
        self.since: float | None = None  # when the current hold began (None: not holding)
        self.granted = False  # a hold ran out on the loop: the job it submits runs whatever waits
        self.holds = 0  # holds begun, for /healthz
        self.overdue = 0  # holds that ran out while input still waited (a backlog job then ran), for /healthz

    def holding(self, job: bool = False) -> bool:
        """Whether the backlog should wait now (`job`: asked by the job itself, on the writer). Either thread may
        ask; a race only moves a hold's start or lets one job more through."""
        if self.granted:
            self.granted = not job
            return False
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
        self.granted = not job
        return False

    def left(self) -> float:
        """Seconds the current hold may still last (0 when none is under way)."""
        since = self.since
        return 0.0 if since is None else max(0.0, self.at_most - (self.clock() - since))

    def as_dict(self) -> dict[str, int]:
        """Figures for /healthz."""
        return {"holds": self.holds, "overdue": self.overdue}
