"""Input duty: take a partition on at the group's offset, commit the group's offset to what was published."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from faust.types import TP

from agents.stream.rebalances import woken
from state.local_state import LocalState
from streams.admin import GroupOffsets

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (logical input topic, partition)
RETRY_SECONDS = 0.2  # until the replica has verified its offsets, or a take-on failed: the next look
LAST_OFFSET = 2**62  # past any offset: a take-over promotes everything its replica applied from the floor on


def commit_targets(floors: dict[Key, int], applied: dict[str, dict[int, int]],
                   unpublished: dict[Key, int]) -> dict[Key, int]:
    """The offset the group may commit for each partition taken on, where it passed the floor.

    That is the first event this worker has not both applied and had every effect of
    acknowledged by the broker: a record still in the outbox (due or on standby) holds the
    commit at the event that caused it, so a kill -9 leaves the next owner that event to promote.
    """
    out = {}
    for key, floor in floors.items():
        topic, partition = key
        position = applied.get(topic, {}).get(partition, 0)
        target = min(position, unpublished.get(key, position))
        if target > floor:
            out[key] = target
    return out


class TakenOn(dict[Key, int]):
    """Input partitions taken on -> the group's committed offset then: `Duty` keeps it, `Publisher` reads it."""

    def by_topic(self) -> dict[str, dict[int, int]]:
        """Partitions taken on, by topic, with the offset from which their events are this worker's to publish."""
        out: dict[str, dict[int, int]] = {}
        for (topic, partition), floor in self.items():
            out.setdefault(topic, {})[partition] = floor
        return out


class Duty:
    """The input partitions the consumer group gave this worker, served from the replica's batches.

    Faust's consumer keeps the group membership (and so the assignment) but is kept from
    fetching the input partitions: the router reads the duty's `source-changes` and the replica
    the rest (delivered through Faust's streams, the router's records doubled a worker's CPU).
    A partition is taken on at the group's committed offset (what was published before it, by
    whoever owned it, is left alone; everything this replica applied from there on is promoted),
    and the group's offset is then committed here to what the broker acknowledged, never further:
    for `source-changes`, never past what the lanes brought back here.
    """

    def __init__(self, state: LocalState, app, run: Callable[..., Awaitable[Any]], topics: dict[str, str],
                 offsets: GroupOffsets, kick: Callable[[], None],
                 verified: Callable[[], bool] = lambda: True,
                 assignment: Callable[[], set[Key] | None] | None = None, floors: TakenOn | None = None) -> None:
        self.state = state  # the read-write state: touched only through `run`
        self.app = app
        self.run_writes = run
        self.topics = topics  # logical input topic -> broker-side name
        self.logical = {v: k for k, v in topics.items()}
        self.offsets = offsets
        self.kick = kick  # publish in the background
        # Whether the replica's offsets belong to this broker's topics: until it rebased them, or while
        # a reset topic is blocked, they name another incarnation's events and must never be committed.
        self.verified = verified
        # The group's assignment of the inputs: the last rebalance signal's (`Rebalances.keys`) in a worker.
        self.assignment = assignment or self._consumer_assignment
        self.floors = TakenOn() if floors is None else floors  # shared with the publisher, which reads it
        self.committed: dict[Key, int] = {}  # what this worker committed since taking each on
        self.delivered = 0  # input events Faust delivered anyway (fetched before a pause took effect)

    def owned(self) -> dict[str, dict[int, int]]:
        """Partitions taken on, by topic, with the offset from which their events are this worker's to publish."""
        return self.floors.by_topic()

    def committed_by_topic(self) -> dict[str, dict[int, int]]:
        """The group's offsets this worker committed for the partitions it holds, by topic (for /healthz)."""
        out: dict[str, dict[int, int]] = {}
        for (topic, partition), offset in sorted(self.committed.items()):
            out.setdefault(topic, {})[partition] = offset
        return out

    def assigned(self) -> set[Key] | None:
        """Input partitions the group gave this worker; None before the first assignment or while it rebalances."""
        return self.assignment()

    def _consumer_assignment(self) -> set[Key] | None:
        if self.app.rebalancing:
            return None
        try:
            assignment = self.app.consumer.assignment()
        except Exception:  # noqa: BLE001 - before the consumer exists there is no duty
            return None
        return {(self.logical[tp.topic], tp.partition) for tp in assignment if tp.topic in self.logical}

    def pause_inputs(self) -> None:
        """Keep Faust's consumer from fetching the input partitions (it resumes them after every rebalance)."""
        try:
            consumer = self.app.consumer
            tps = [tp for tp in consumer.assignment() if tp.topic in self.logical]
        except Exception:  # noqa: BLE001 - not started yet: the next call pauses them
            return
        if tps:
            consumer.pause_partitions(tps)

    async def follow(self) -> bool:
        """Take gained partitions on, forget lost ones, keep Faust's consumer off the inputs; whether the
        partitions taken on are now the assignment (False: to be tried again)."""
        self.pause_inputs()
        assigned = self.assigned()
        if assigned is None or not self.verified():
            return assigned is None  # a rebalance's end is signalled; the replica's verdict is not
        for key in set(self.floors) - assigned:
            del self.floors[key]
            self.committed.pop(key, None)
        gained = assigned - set(self.floors)
        if gained:
            await self.take_on(gained)
        return set(self.floors) == assigned

    async def take_on(self, gained: set[Key]) -> None:
        """Promote what the replica applied of these partitions from the group's committed offset on."""
        try:
            committed = await self.offsets.read(self.logical)
        except Exception as exc:  # noqa: BLE001 - the next round tries again; nothing is promoted meanwhile
            log.warning("could not read the group's committed offsets to take partitions on: %r", exc)
            return
        floors = {key: committed.get(key, 0) for key in gained}
        # Known before promoting: a replica batch applied meanwhile is promoted by `Publisher.publish_owned`.
        self.floors.update(floors)
        try:
            await self.run_writes(_promote_from, self.state, floors)
        except BaseException:
            # Not taken on: the next round finds them gained again and retries (see `Chores`).
            for key in floors:
                self.floors.pop(key, None)
            raise
        self.kick()

    async def commit(self) -> dict[Key, int]:
        """Commit the group's offsets of the partitions taken on up to what was published; what was committed."""
        floors = dict(self.floors)
        if not floors or not self.verified():
            return {}
        targets = await self.run_writes(_targets, self.state, floors)
        due = {key: offset for key, offset in targets.items()
               if key in self.floors and offset > self.committed.get(key, self.floors[key])}
        if not due:
            return {}
        offsets = {TP(self.topics[topic], partition): offset for (topic, partition), offset in due.items()}
        try:
            # Faust has no public call that commits given offsets (`Consumer.commit` commits what its
            # streams acknowledged, and they see nothing here); this one commits them as a member of
            # the group (a rebalanced generation is refused) and records them as Faust's own commits.
            done = await self.app.consumer._commit_offsets(offsets)
        except Exception as exc:  # noqa: BLE001 - committing later only means more to promote after a hand-over
            log.warning("could not commit the group's offsets: %r", exc)
            return {}
        if not done:
            return {}
        self.committed.update({key: offset for key, offset in due.items() if key in self.floors})
        return due


def _promote_from(state: LocalState, floors: dict[Key, int]) -> None:
    with state.store.transaction():
        for (topic, partition), floor in floors.items():
            # Standby records of earlier events were published by the partition's previous owner.
            state.outbox.promote(topic, partition, floor, LAST_OFFSET, drop_earlier=True)


def _targets(state: LocalState, floors: dict[Key, int]) -> dict[Key, int]:
    # Offsets first: a record they cover is in the outbox until acknowledged, so reading the outbox
    # afterwards can only miss records already acknowledged.
    applied = state.store.next_offsets()
    values = ", ".join("(?, ?, ?)" for _ in floors)
    params = [x for (topic, partition), floor in floors.items() for x in (topic, partition, floor)]
    # Acknowledged rows not deleted yet hold nothing back: they were published.
    unacked, unacked_params = state.outbox.unacked()
    rows = state.store.db.execute(
        f"SELECT o.src_topic, o.src_partition, min(o.src_offset) FROM outbox o JOIN (VALUES {values}) "
        f"f(t, p, lo) ON o.src_topic = f.t AND o.src_partition = f.p AND o.src_offset >= f.lo AND o.lane IS NULL"
        f"{unacked} GROUP BY ALL",
        params + unacked_params).fetchall()
    return commit_targets(floors, applied, {(topic, partition): first for topic, partition, first in rows})


def register_duty(app, duty: Duty, chores, signal: asyncio.Event) -> None:
    """Run a worker's duty on its app: follow the assignment, commit what was published, pause Faust's delivery.

    `signal` is set by every rebalance signal (`Rebalances.waker`).
    """
    async def follow_duty() -> float:
        settled = await duty.follow()
        await woken(signal, None if settled else RETRY_SECONDS)
        return 0

    app.task(chores.loop("follow_duty", follow_duty))

    @app.timer(interval=1.0)
    @chores.timer("commit_duty")
    async def commit_duty() -> None:
        await duty.commit()

    @app.on_rebalance_complete.connect
    async def pause_inputs(sender, **kwargs) -> None:
        # Sent just before Faust resumes every assigned partition: pause the inputs again at the
        # loop's next turn, before Faust resumes its flow of records.
        asyncio.get_running_loop().call_soon(duty.pause_inputs)
