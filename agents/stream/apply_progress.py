"""How far the replica has applied its input, and waiting for it (a part of `Replica`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

log = logging.getLogger("agents.stream.replica")

# Fetched input older than this not applied yet: the writer is behind, and early announcements stop (a plan
# announced early stays unanswerable until its event is applied: under a backlog that is the backlog's age).
# 2 s was tried: the start of a 1,000 events/s stream kept its early announcements (bench workload p99 342-576 ms
# against 591-767, alternated), but selects under that stream were refused (82 and 87 of 250 against none).
BEHIND_SECONDS = 0.5
# A batch of more than this many fetches' worth of records was taken while more waited: a stream of 1,000 events/s
# gave batches of 100-200 records (a fetch is 500), 20,000 events published while a worker was paused 2,000-3,700.
CATCH_UP_FACTOR = 2


class ApplyProgress:
    """What the replica has applied and what it has fetched and not applied yet; waits for either.

    The replica sets `positions` after each committed batch and notifies `_progress`; `_unapplied`
    holds the loop time each fetched batch not yet applied was fetched at, `_applying` how many of
    them the writer is applying.
    """

    positions: dict[str, dict[int, int]]
    _progress: asyncio.Condition
    _unapplied: deque[float]
    _applying: int
    batch_size: int
    last_batch_records: int = 0  # records in the batch the writer applied last (a gained shard's history included)

    def behind(self) -> bool:
        """Whether input fetched more than `BEHIND_SECONDS` ago is still waiting for the writer."""
        return bool(self._unapplied) and asyncio.get_running_loop().time() - self._unapplied[0] > BEHIND_SECONDS

    def catching_up(self) -> bool:
        """Whether input waits, in the broker or fetched: `behind`, or the last batch applied was a catch-up one
        (more than `CATCH_UP_FACTOR` fetches' worth, taken at once because that much was there). On the loop only."""
        return self.behind() or self.last_batch_records > CATCH_UP_FACTOR * self.batch_size

    def quiet(self) -> bool:
        """Whether no fetched input waits to be applied, the batch being applied included (any thread may ask)."""
        return not self._unapplied

    def input_waiting(self) -> bool:
        """Whether fetched input waits for the writer beyond the batch it applies (any thread may ask)."""
        return len(self._unapplied) > self._applying

    async def batch_applied(self, timeout: float) -> None:
        """Return once the next batch is applied, or after `timeout` seconds."""
        with contextlib.suppress(asyncio.TimeoutError):
            async with self._progress:
                await asyncio.wait_for(self._progress.wait(), timeout)

    def applied(self, topic: str, partition: int, offset: int) -> bool:
        """Whether the event at this position has been applied (or skipped) locally."""
        return self.positions.get(topic, {}).get(partition, 0) > offset

    async def wait_applied(self, topic: str, partition: int, offset: int) -> None:
        """Return once the replica has applied the event at this position."""
        waited = 0.0
        async with self._progress:
            while not self.applied(topic, partition, offset):
                try:
                    await asyncio.wait_for(self._progress.wait(), 1.0)
                except asyncio.TimeoutError:
                    waited += 1.0
                    if waited % 10 == 0:
                        log.warning("duty for %s/%d/%d is waiting for the replica (%.0fs)", topic, partition,
                                    offset, waited)

    async def wait_covers(self, offsets: dict[str, dict[str, int] | dict[int, int]]) -> None:
        """Return once local state is at least as fresh as these next-offsets."""
        for topic, parts in offsets.items():
            for partition, nxt in parts.items():
                if nxt > 0:
                    await self.wait_applied(topic, int(partition), nxt - 1)
