"""Move a worker's entity shard to the group's assignment: drop what it lost, restore what it gained."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Collection

from agents.stream.event_apply import EventApplier
from agents.stream.raw_message import RawMessage
from state.catalog_resources import drop_resources, held_entities
from state.shard_state import ShardState
from streams.partitions import read_until

log = logging.getLogger(__name__)

PROGRESS_EVERY = 50_000  # records read between progress lines of a long restore


class Shards:
    """The resources a worker holds follow the plan partitions it owns (see `ShardState`).

    A gained partition is restored by reading `source-changes` from its beginning up to what
    this file applied, keeping the resources about the gained partitions' entities; it runs
    on the writer inside the take-over's transaction, so no live batch interleaves, and only
    then are the partition's plans taken over and served.
    """

    def __init__(self, state: ShardState, applier: EventApplier, bootstrap_servers: str, topic: str,
                 kafka: dict | None = None, fetch_bytes: int = 2_000_000, standby_replicas: int = 0,
                 blocked: Callable[[], bool] = lambda: False, stall_seconds: float = 15.0) -> None:
        self.state = state
        self.stall_seconds = stall_seconds  # a restore read without progress this long gives up (ReadStalled)
        # Whether `source-changes` was reset under this file and not rebased: its offsets then name
        # another incarnation's records, and reading the new topic up to them would be wrong.
        self.blocked = blocked
        self.incomplete: frozenset[int] = frozenset()  # restored partitions whose history the topic no longer had
        self.standby_replicas = standby_replicas  # warm copies: the next partitions after each owned one
        self.applier = applier
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic  # broker-side `source-changes`
        self.kafka = kafka or {}
        self.fetch_bytes = fetch_bytes
        self.last_restore: dict | None = None  # partitions, records read, rows restored, seconds: for /healthz

    @property
    def standby(self) -> frozenset[int]:
        """Held partitions that are not owned: warm copies restored ahead of a take-over."""
        return self.state.copies

    @standby.setter
    def standby(self, partitions: frozenset[int]) -> None:
        self.state.copies = frozenset(partitions)

    def standby_for(self, owned: frozenset[int]) -> frozenset[int]:
        """The partitions to keep warm copies of: the `standby_replicas` next ones after each owned partition.

        With partitions spread evenly over the group, the next partitions are mostly another
        worker's: when that worker dies, its partitions are already here and need no restore.
        """
        total = self.state.partitions
        copies = range(1, min(self.standby_replicas, total - 1) + 1)
        return frozenset((p + k) % total for p in owned for k in copies) - owned

    def settled(self) -> None:
        """The move's transaction has ended: no partition is being restored any more."""
        self.state.moves += 1  # first: a reader that then sees `restoring` cleared sees the move ended too
        self.state.restoring = frozenset()

    def reload(self) -> None:
        """After a rolled-back move: the held partitions as the file has them."""
        self.state.reload()
        self.standby = self.standby & self.state.held

    def move(self, assigned: Collection[int]) -> None:
        """Hold the assigned partitions and their standby copies (on the writer, inside the caller's transaction)."""
        owned = frozenset(assigned)
        standby = self.standby_for(owned)
        after = owned | standby
        lost, gained = self.state.held - after, after - self.state.held
        self.standby = standby
        if lost:
            dropped = self.state.drop(lost)
            log.info("handed entity partitions %s to their new owner: %d resources removed", sorted(lost), dropped,
                     extra={"partitions": sorted(lost), "reason": "shard_dropped"})
        if gained:
            self.restore(gained)

    def restore(self, gained: frozenset[int]) -> None:
        """Apply the gained partitions' resource history, then hold them."""
        if self.blocked():
            raise RuntimeError("source-changes was reset and is not applied until an operator rebases or replays: "
                               "a shard cannot be restored from it")
        started = time.perf_counter()
        store = self.applier.state.store
        until = store.next_offsets().get("source-changes", {})
        partition_of = self.state.partition_of
        # A clean slate: rows left about these entities are tombstones of resources that moved here
        # while another worker held the partition; its history decides them again.
        drop_resources(store, [e for e in held_entities(store) if partition_of(e) in gained])

        def mine(entity: str | None) -> bool:
            return entity is not None and partition_of(entity) in gained

        seen, restored = 0, 0
        seen_ids: set[str] = set()  # resources of the gained partitions met so far in the history

        def on_batch(records: list) -> None:
            nonlocal seen, restored
            messages = [RawMessage("source-changes", r.partition, r.offset, r.key, r.value,
                                   r.timestamp / 1000 if r.timestamp else None) for r in records]
            restored += self.applier.restore_resources(messages, mine, seen_ids)
            before, seen = seen, seen + len(records)
            if seen // PROGRESS_EVERY > before // PROGRESS_EVERY:
                log.info("restoring entity partitions %s: %d of %d records read", sorted(gained), seen,
                         sum(until.values()), extra={"partitions": sorted(gained), "reason": "shard_restoring"})

        # Cleared by `settled` once the caller's transaction ends: until it commits, a reader of the
        # file would see the partition held but its resources not yet there.
        self.state.restoring = self.state.restoring | gained
        # The writer thread has no loop of its own: this read blocks it, which keeps every live
        # batch out until the shard is whole.
        starts = asyncio.run(read_until(self.bootstrap_servers, self.topic, until, on_batch, self.kafka,
                                        self.fetch_bytes, self.stall_seconds))
        trimmed = {p: s for p, s in starts.items() if s > 0}
        rebased = store.incarnation()[1] > 0
        if trimmed or rebased:
            # As a fresh worker reading the topic would: what retention deleted, or what a broker reset took
            # with the old topics, survives only at the old holder (if at all).
            self.incomplete = self.incomplete | gained
            store.bump_many({"shard_restores_incomplete": 1})
            why = (f"source-changes no longer holds its oldest records (first offsets {trimmed})" if trimmed else
                   "the input topics were reset and rebased, and the old topics' records are gone")
            log.warning("restoring entity partitions %s: %s; resources changed only there are missing from this "
                        "shard until their sources publish them again (a CDC re-snapshot)", sorted(gained), why,
                        extra={"partitions": sorted(gained), "reason": "shard_incomplete"})
        self.state.add(gained)
        seconds = time.perf_counter() - started
        store.bump_many({"shards_restored": len(gained), "shard_resources_restored": restored})
        self.last_restore = {"partitions": sorted(gained), "records_read": seen, "resources_restored": restored,
                             "seconds": round(seconds, 3)}
        log.info("restored entity partitions %s from %s: %d records read, %d resource changes applied, %.2fs",
                 sorted(gained), self.topic, seen, restored, seconds,
                 extra={"partitions": sorted(gained), "reason": "shard_restored"})
