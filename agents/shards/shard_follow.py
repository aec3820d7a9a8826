"""Follow the group's assignment: read the wanted shards' lanes first, take their plans over once they caught up."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

from agents.plans.ownership import Ownership
from agents.shards.shard_restore import Shards
from agents.stream.plan_feed import PlanFeed
from agents.stream.rebalances import Rebalances, woken
from agents.stream.replica import Replica

log = logging.getLogger(__name__)

# Gained lanes wake the follower as they catch up; this only bounds the wait should a wake-up go astray.
CATCHING_UP = 1.0
READ_AHEAD_START = 2.0
"""Seconds a read ahead may take to start (its first offsets asked of the broker) before it is given up."""


class ShardFollower:
    """Moves a worker to each assignment Faust's rebalance signals carry, never to one a rebalance is changing.

    Lanes lost are dropped and lanes gained read from their start at once; the plans follow
    (`Ownership.follow`) only once every wanted lane has caught up, so a plan is never judged or
    served from a partial shard. A step that fails (the broker unreachable, a reset input blocked,
    DuckDB refusing a write) is retried after a backoff of 1 s doubling to 60 s.
    """

    def __init__(self, rebalances: Rebalances, replica: Replica, shards: Shards, ownership: Ownership,
                 run: Callable[..., Awaitable[Any]], published: Callable[[], Awaitable[Any]],
                 plan_feed: PlanFeed, stall_seconds: float = 15.0, read_ahead: bool = True) -> None:
        self.rebalances = rebalances
        self.replica = replica
        self.shards = shards
        self.ownership = ownership
        self.run_writes = run
        self.published = published  # publish what the take-over announced
        self.stall_seconds = stall_seconds  # a lane read that cannot start within this gives up and is retried
        self.read_ahead = read_ahead  # read the likely gains' lanes while the group rebalances (`ahead`)
        self.plan_feed = plan_feed  # the take-over waits for its read of gained partitions' parked plans
        self.feed_waited: tuple[frozenset[int], float] | None = None  # (assignment, when a step first found the feed
        # behind on it): the clock starts again for another assignment

    def settled(self, assigned: frozenset[int]) -> bool:
        """Whether plans and lanes are the assignment's."""
        wanted = self.shards.wanted(assigned)
        return (assigned == self.ownership.owned and wanted == self.replica.reading_lanes()
                and wanted <= self.shards.state.held)

    async def run(self) -> None:
        """Follow until cancelled."""
        await self.replica.ready.wait()  # judging a take-over needs offsets verified against this broker
        signal, backoff, retry_in = self.rebalances.waker(), 1.0, None
        self.replica.lanes.wakers.append(signal)  # a gained lane caught up: its plans can follow
        self.plan_feed.wakers.append(signal)  # so did a gained partition's parked plans
        while True:
            await woken(signal, retry_in)
            assigned = self.rebalances.assigned("source-changes")
            if assigned is None:
                await self.ahead()
            if assigned is None or self.settled(frozenset(assigned)):
                retry_in = None
                continue
            try:
                if not await self.step(frozenset(assigned)):
                    retry_in = CATCHING_UP
                    continue
            except Exception:  # noqa: BLE001 - what failed is rolled back (see `step`): try again
                self.ownership.failures += 1
                retry_in, backoff = backoff, min(2 * backoff, 60.0)
                log.exception("following the assignment %s failed (%d so far); retrying in %.0f s",
                              sorted(assigned), self.ownership.failures, retry_in,
                              extra={"reason": "take_over_failed", "partitions": sorted(assigned)})
                continue
            retry_in, backoff = None, 1.0
            await self.published()

    async def ahead(self) -> None:
        """While the group rebalances, start reading the lanes one standby copy would hold (`Shards.ahead`).

        A kill -9 is noticed a session timeout late, and the broker may hold the rebalance a while
        longer: a dead neighbour's shard is then restored before the assignment names it. The next
        step drops what the assignment does not give; a read that cannot start is only logged.
        """
        owned = self.ownership.owned
        if not self.rebalances.revoking or owned is None:
            return
        # What the group gave last is being taken back: until the next assignment, only what this worker owns
        # is its own (a step that failed may have named more), so what it reads meanwhile is a copy.
        self.shards.assigned = owned
        if not self.read_ahead or not owned or not self.replica.routed or self.blocked():
            return
        lanes = self.shards.ahead(owned) - self.replica.reading_lanes() - self.shards.state.held
        if not lanes:
            return
        try:
            # Briefly: the assignment may arrive meanwhile, and this loop follows it.
            await self._gain(lanes, min(self.stall_seconds, READ_AHEAD_START))
        except Exception:  # noqa: BLE001 - an optimisation: the assignment restores what it gives either way
            self.shards.read_ahead["failures"] += 1
            log.warning("reading entity partitions %s ahead of the rebalance failed; they are restored if the "
                        "assignment gives them", sorted(lanes), exc_info=True,
                        extra={"reason": "read_ahead_failed", "partitions": sorted(lanes)})
            return
        self.shards.read_ahead.update(times=self.shards.read_ahead["times"] + 1, partitions=sorted(lanes))
        log.info("the group is rebalancing: reading entity partitions %s ahead, as a standby copy would hold them",
                 sorted(lanes), extra={"reason": "read_ahead", "partitions": sorted(lanes)})

    async def _gain(self, lanes: frozenset[int], timeout: float) -> None:
        """Read lanes from their start, marked `starting` first: the writer may see them caught up before this
        returns; a read that cannot start changes nothing."""
        self.shards.starting = self.shards.starting | lanes
        try:
            await asyncio.wait_for(self.replica.gain_lanes(lanes), timeout)
        except BaseException:
            self.shards.starting = self.shards.starting - lanes
            raise

    def blocked(self) -> set[str]:
        """The inputs a shard is restored from that a reset blocks."""
        return {"source-changes", "entity-changes", "shared-changes"} & set(self.replica.blocked)

    async def step(self, assigned: frozenset[int]) -> bool:
        """One move towards the assignment; whether the plans were taken over (False: lanes still catching up)."""
        blocked = self.blocked()
        if blocked:
            raise RuntimeError(f"{', '.join(sorted(blocked))} was reset and is not applied until an operator "
                               "rebases or replays: a shard cannot be restored from it")
        self.shards.assigned = assigned
        wanted, reading = self.shards.wanted(assigned), self.replica.reading_lanes()
        if reading - wanted:
            await self.replica.lose_lanes(reading - wanted)
            await self.run_writes(self.shards.lose, reading - wanted)
        if wanted - reading:
            # Nothing changes if the read cannot start (its first offsets unknown): the next try asks again.
            await self._gain(wanted - reading, self.stall_seconds)
        # A lane still held in the file may be read again from its start (a copy let go and gained again):
        # held is not whole until the writer saw it caught up.
        if not wanted <= self.shards.state.held - self.shards.state.restoring - self.shards.starting:
            return False
        if not self._plans_read(assigned):
            return False
        await self.run_writes(self.ownership.follow, assigned)
        self.feed_waited = None
        return True

    def _plans_read(self, assigned: frozenset[int]) -> bool:
        """Whether the feed has parked the plans of the assigned partitions (or was waited for long enough).

        Not waited for without end: a record read after the take-over is judged as it arrives
        (`Ownership.adopt`), only one by one instead of together.
        """
        if self.plan_feed.caught_up(assigned):
            return True
        now = time.monotonic()
        if self.feed_waited is None or self.feed_waited[0] != assigned:
            self.feed_waited = (assigned, now)
        if now - self.feed_waited[1] < self.stall_seconds:
            return False
        log.warning("the plan feed has not read the parked plans of partitions %s within %.0f s; taking them over "
                    "with what it read, and judging the rest as they arrive", sorted(assigned), self.stall_seconds,
                    extra={"reason": "plan_feed_behind", "partitions": sorted(assigned)})
        return True
