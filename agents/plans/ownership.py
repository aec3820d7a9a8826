"""Plans owned by partition: take a gained partition's plans over without recompiling, hand a lost one back."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Collection, Protocol, Sequence

from schemas.outbound import Cause
from schemas.plan_partition import plan_partition
from state import orphan_announcements
from state.key_changes import KeyChanges, PlanPosition, Staleness
from state.local_state import LocalState
from state.parked_plans import ParkedPlans
from state.plan_restore import restore, restore_parked

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TakeOver:
    """What taking plans over did."""

    plans: int = 0
    """Records considered (the latest of each plan key)."""
    adopted: int = 0
    """Plans made current here as published, without recompiling."""
    stale: list[str] = field(default_factory=list)
    """Plan ids announced invalidated because an input changed after they were compiled."""
    seconds: float = 0.0
    """Time spent, for the log and the bench."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds by phase (judge, restore, announce), for the bench's profile of a take-over."""


class ShardMoves(Protocol):
    """How the resources held follow the plans owned (`agents.shards.shard_restore.Shards` in a worker)."""

    def move(self, assigned: Collection[int]) -> None:
        """Hold the assigned partitions' resources (inside the take-over's transaction)."""

    def reload(self) -> None:
        """After a rolled-back move: hold what the file says."""

    def settled(self) -> None:
        """The move's transaction ended."""


class WholeCatalog:
    """Resources that stay whole whatever is owned: a worker applying every entity's (a replay, a bench)."""

    def move(self, assigned: Collection[int]) -> None:
        """Nothing to move: every partition's resources are kept."""

    def reload(self) -> None:
        """Nothing was moved."""

    def settled(self) -> None:
        """Nothing is restored."""


class Ownership:
    """Which plan partitions this worker owns (the consumer group's input partitions) and their hand-overs.

    A plan belongs to the partition of its canonical entity id (`plan_partition`). Only the
    owner indexes, recompiles and announces it. Every method here runs on the writer thread
    inside the caller's transaction; `owned` is None until the group has assigned partitions.
    """

    def __init__(self, state: LocalState, plans, key_changes: KeyChanges, parked: ParkedPlans, partitions: int,
                 feed_topic: str, shards: ShardMoves) -> None:
        self.state = state
        self.shards = shards  # the resources held follow the plans owned
        self.plans = plans  # the PlanWriter: announcements go through its one builder
        self.key_changes = key_changes
        self.parked = parked
        self.partitions = partitions
        self.feed_topic = feed_topic  # broker-side `plan-dependencies`, named in causes it alone explains
        self.owned: frozenset[int] | None = None
        self.failures = 0  # assignments this worker failed to follow (each rolled back and retried), for /healthz
        db = state.store.db
        if not db.execute("SELECT 1 FROM duckdb_tables() WHERE table_name = 'owned_partitions'").fetchone():
            db.execute("CREATE TABLE owned_partitions (partition INTEGER PRIMARY KEY)")
            db.execute("CHECKPOINT")  # as the store does: DDL must not wait in the WAL
        # What this file indexed when the worker stopped: a restart hands back what it no longer owns.
        self._held = frozenset(r[0] for r in db.execute("SELECT partition FROM owned_partitions").fetchall())

    @property
    def assigned(self) -> bool:
        """Whether the group has assigned this worker its partitions since it started (until then it owns none)."""
        return self.owned is not None

    def partition_of(self, entity_id: str) -> int:
        """The partition that owns an entity's plans."""
        return plan_partition(entity_id, self.partitions)

    def foreign_partition(self, entity_id: str) -> int | None:
        """The entity's partition when this worker does not own it (or owns nothing yet), else None."""
        partition = self.partition_of(entity_id)
        return None if self.owned is not None and partition in self.owned else partition

    def owns(self, entity_id: str) -> bool:
        """Whether this worker owns the entity's plans now."""
        return self.owned is not None and self.partition_of(entity_id) in self.owned

    def follow(self, assigned: Collection[int]) -> tuple[TakeOver, int]:
        """Move to the group's assignment in a transaction of its own: all of it, or nothing (`owned` included).

        `owned` changes before the take-over (which reads it), so a take-over that fails must put
        it back: the assignment then still differs from `owned` and the next round tries again,
        where a kept `owned` would leave the gained partitions' parked plans unjudged for good.
        """
        previous = self.owned
        try:
            with self.state.store.transaction():
                if previous is None:
                    # The first assignment since start: the file may hold heads and index edges of partitions
                    # owned before a restart; a peer owns those now and announces their changes alone.
                    foreign = frozenset(range(self.partitions)) - frozenset(assigned)
                    if foreign:
                        self.hand_back(foreign)
                return self.change(assigned)
        except BaseException:
            self.owned = previous
            self.shards.reload()
            raise
        finally:
            self.shards.settled()  # committed or rolled back: nothing is being restored now

    def change(self, assigned: Collection[int]) -> tuple[TakeOver, int]:
        """Move to a new assignment: hand back lost partitions, take over gained ones."""
        first = not self.assigned
        before = self._held if first else self.owned
        after = frozenset(assigned)
        lost, gained = before - after, after - before
        # Resources first: a gained partition's plans are judged and served from a whole shard.
        self.shards.move(after)
        dropped = self.hand_back(lost) if lost else 0
        self.owned = after
        taken = self.take_over(gained) if gained else TakeOver()
        if first and after & before:
            caught = self._caught_up(after & before)
            taken = replace(taken, plans=taken.plans + caught.plans, adopted=taken.adopted + caught.adopted,
                            stale=taken.stale + caught.stale)
        self._place_again(after)
        db = self.state.store.db
        db.execute("DELETE FROM owned_partitions")
        if after:
            db.execute("INSERT INTO owned_partitions SELECT unnest(?::INTEGER[])", [sorted(after)])
        if lost or gained:
            log.info("owning plan partitions %s (took over %s: %d plans, %d stale, %.2fs; handed back %s: %d plans)",
                     sorted(after), sorted(gained), taken.adopted, len(taken.stale), taken.seconds, sorted(lost),
                     dropped, extra={"partitions": sorted(after), "reason": "ownership"})
        return taken, dropped

    def _place_again(self, owned: Collection[int]) -> None:
        """Publish again, on their entity's partition, the records of owned plans not read from there.

        Records published before records were placed by entity lie where their keys hashed, on a
        broker that kept its topics through that upgrade, where a worker holding their partition
        does not read; each owner places them once (read back, they are parked as placed).
        """
        legacy = self.parked.unplaced(owned)
        if legacy:
            self.state.outbox.add_many([(self.feed_topic, key.encode(), record.encode()) for key, _, record in legacy],
                                       partitions=[partition for _, partition, _ in legacy])
            log.info("published %d plan-dependencies records parked before records were placed by entity again, on "
                     "their entity's partition", len(legacy), extra={"records": len(legacy), "reason": "placed"})

    def _caught_up(self, kept: Collection[int]) -> TakeOver:
        """Partitions kept across a restart: judge the plans peers compiled for them meanwhile.

        The feed parked those before anything was owned. A parked plan this file never stored was
        compiled elsewhere, most likely after this worker stopped: it becomes its key's plan and is
        judged, and the head this file kept for that key is announced (at worst once too often),
        since nothing here says whether its successor's worker announced it.
        """
        unknown = self.parked.unknown(kept)  # ids: restored where they lie, as `take_over` does
        evicted = self._evicted([plan_id for plan_id, _, _ in unknown])
        unknown = [u for u in unknown if u[0] not in evicted]
        if not unknown:
            return TakeOver()
        now = self.state.store.now()
        # Ids and status only: the heads' requests (read here before) are not needed to announce them.
        fresh = self.state.store.db.execute(
            "SELECT h.plan_key, h.plan_id FROM plan_heads h JOIN plans p USING (plan_id) WHERE p.status = 'fresh' "
            "AND h.plan_key IN (SELECT unnest(?::VARCHAR[]))", [sorted({key for _, key, _ in unknown})]).fetchall()
        announced = self._announce_orphans(fresh, now)
        caught = self.take_over(kept, [plan_id for plan_id, _, _ in unknown])
        judged = set(caught.stale)  # one that cannot stand in for a compilation is followed by nobody here
        passed = self._announce_orphans([(k, i) for i, k, ok in unknown if not ok and i not in judged], now)
        return replace(caught, stale=announced + caught.stale + passed)

    def hand_back(self, partitions: Collection[int]) -> int:
        """Stop serving and indexing plans of these partitions: their new owner announces what goes stale."""
        rows = self.state.store.db.execute(
            "SELECT h.plan_key, json_extract_string(p.plan, '$.entity_id') FROM plan_heads h "
            "JOIN plans p USING (plan_id)").fetchall()
        keys = [k for k, entity in rows if entity is not None and self.partition_of(entity) in partitions]
        self.state.plans.drop_heads(keys)
        self.state.index.drop_many(keys)
        self.state.queue.remove(keys)
        self.state.store.bump_many({"plans_handed_back": len(keys)})
        return len(keys)

    def take_over(self, partitions: Collection[int], plan_ids: Sequence[str] | None = None) -> TakeOver:
        """Make the parked plans of gained partitions (only those with `plan_ids`, if given) current; announce
        those an applied event made stale.

        `adopt` over the parked records, done where they lie: staleness and the restore are SQL
        over `parked_plans`, and only the stale records are read back, to be announced.
        """
        started = time.perf_counter()
        store = self.state.store
        now = store.now()
        stale = self.key_changes.stale_parked(sorted(partitions), now, store.incarnation()[0], plan_ids)
        judged_at = time.perf_counter()
        result = restore_parked(store, partitions, compiled_at=now, topic_of=self.plans.topic_of, plan_ids=plan_ids)
        restored_at = time.perf_counter()
        judged = self.parked.records_of(list(stale))
        restored = {r["plan_id"] for r, restorable in judged if restorable} - set(result.known_invalidated)
        taken = self._settle([r for r, _ in judged], stale, restored, result.known_invalidated, result.considered,
                             result.restored, started, now)
        if result.known_invalidated:
            keys = dict(store.db.execute("SELECT plan_id, plan_key FROM parked_plans WHERE plan_id IN "
                                         "(SELECT unnest(?::VARCHAR[]))", [result.known_invalidated]).fetchall())
            again = self._requeue([(keys[i], i) for i in result.known_invalidated if i in keys], now)
            taken = replace(taken, stale=taken.stale + again)
        phases = {"judge": judged_at - started, "restore": restored_at - judged_at,
                  "announce": started + taken.seconds - restored_at}
        return replace(taken, phases={k: round(v, 3) for k, v in phases.items()})

    def adopt(self, records: Sequence[dict[str, Any]], partitions: Collection[int] | None = None,
              parked: Collection[str] = ()) -> TakeOver:
        """Judge records of owned plans without compiling: adopt the fresh, announce and requeue the stale.

        Staleness is decided from each dependency key's last change offset against the plan's
        `compiled_as_of` (`KeyChanges.stale_plans`), so no invalidation is lost whoever was the
        owner when the event was applied, and no plan is recompiled unless it changed. Of a key's
        records, the one whose plan id is in `parked` (the key's parked record) is made current.
        """
        started = time.perf_counter()
        owned = set(self.owned or ()) if partitions is None else set(partitions)
        mine = [r for r in records if self.partition_of(r["entity_id"]) in owned]
        evicted = self._evicted([r["plan_id"] for r in mine])
        mine = [r for r in mine if r["plan_id"] not in evicted]
        if not mine:
            return TakeOver()
        store = self.state.store
        now = store.now()
        stale = self.key_changes.stale_plans([PlanPosition.of(r) for r in mine], now, store.incarnation()[0])
        # A stale record is announced and requeued by `_settle`: it never pushes a fresh head out.
        result = restore(store, mine, owned, partitions=self.partitions, compiled_at=now,
                         parked=set(parked) - set(stale), topic_of=self.plans.topic_of)
        taken = self._settle(mine, stale, set(result.restored), result.known_invalidated, len(mine),
                             len(result.restored), started, now)
        # Every plan of an owned key ends up current here or announced: a displaced head, and a fresh record
        # not made current (it lost to another of its key), may be live in caches with nobody to announce them.
        current = set(result.restored)
        passed = {r["plan_id"]: r["plan_key"] for r in mine if r["plan_id"] not in current
                  and r["plan_id"] not in stale and r["plan_id"] not in set(result.known_invalidated)}
        orphans = list(result.displaced) + [(key, plan_id) for plan_id, key in passed.items()]
        announced = self._announce_orphans(orphans, now)
        known = set(result.known_invalidated)
        again = self._requeue([(r["plan_key"], r["plan_id"]) for r in mine if r["plan_id"] in known], now)
        return replace(taken, stale=taken.stale + announced + again)

    def _requeue(self, plans: Sequence[tuple[str, str]], now) -> list[str]:
        """Plans invalidated here once and now their keys' heads again: announced again, their keys recompiled.

        A peer may have served such a plan again since (compiled anew, or adopted): nobody else
        would announce it, and without a successor its key would be left uncompiled.
        """
        pairs = list(dict.fromkeys(plans))
        again = self._announce_orphans(pairs, now)
        self.state.queue.add_many([key for key, _ in pairs])
        self.plans.queue_pending = self.plans.queue_pending or bool(pairs)
        return again

    def _announce_orphans(self, plans: Sequence[tuple[str, str]], now) -> list[str]:
        """Announce (plan key, plan id) pairs that no index here follows; their ids.

        Each is its own record's cause, so they differ only in id and key: one sample announcement,
        the ids filled in by SQL (a restart may announce 20,000 heads it no longer follows).
        """
        pairs = list(dict.fromkeys(plans))
        if not pairs:
            return []
        plan_hole, key_hole = orphan_announcements.holes()
        memo: dict = {}
        sample = self.plans.caused(plan_hole, key_hole, "plan-dependencies", _record_cause(plan_hole), None, now,
                                   memo, reason="stale_on_arrival", quiet=True)
        orphan_announcements.announce(self.state.store, self.state.outbox, pairs, sample,
                                      self.plans.topic_of("plan-invalidations"), now)
        self.state.store.bump_many({"invalidations": len(pairs), "plans_displaced": len(pairs)})
        return [plan_id for _, plan_id in pairs]

    def _settle(self, records: Sequence[dict[str, Any]], stale: dict[str, Staleness], restored: set[str],
                known_invalidated: Collection[str], considered: int, restored_count: int, started: float,
                now) -> TakeOver:
        """Announce the stale among `records`, queue the restored stale ones for recompiling, count."""
        store = self.state.store
        known = set(known_invalidated)
        announced, queued, memo = [], [], {}
        for record in records:
            why = stale.get(record["plan_id"])
            if why is None or record["plan_id"] in known:
                continue
            announced.append(self._invalidation(record, why, now, memo))
            if record["plan_id"] in restored:
                queued.append(record["plan_key"])
        self.plans.announce(announced)
        self.state.plans.invalidate_many([e.history_entry() for e in announced], now)
        self.state.queue.add_many(queued)
        self.plans.queue_pending = self.plans.queue_pending or bool(queued)
        counts: Counter[str] = Counter(plans_taken_over=restored_count - len(queued),
                                       plans_stale_on_take_over=len(announced), invalidations=len(announced),
                                       deferred_recompilations=len(queued))
        store.bump_many(counts)
        return TakeOver(considered, restored_count - len(queued), [e.plan_id for e in announced],
                        time.perf_counter() - started)

    def _evicted(self, plan_ids: list[str]) -> set[str]:
        """Plan ids evicted here and not compiled again since: their records predate the eviction."""
        if not plan_ids:
            return set()
        return {r[0] for r in self.state.store.db.execute(
            "SELECT e.plan_id FROM evicted_plans e ANTI JOIN plans p USING (plan_id) "
            "WHERE e.plan_id IN (SELECT unnest(?::VARCHAR[]))", [plan_ids]).fetchall()}

    def _invalidation(self, record: dict[str, Any], why: Staleness, now, memo: dict):
        """The announcement of a plan found stale on take-over; its cause is the change's position."""
        if why.topic is None:  # nothing applied explains it (another incarnation, no keys): the record is the cause
            return self.plans.caused(record["plan_id"], record["plan_key"], why.dependency_key,
                                     _record_cause(record["plan_id"]), None, now, memo, reason="stale_on_arrival",
                                     quiet=True)
        cause = Cause(why.topic, why.event_id or f"offset:{why.partition}:{why.offset}", why.partition, why.offset)
        visible = {item["resource_id"] for part in ("admitted", "rejected") for item in record.get(part) or ()}
        return self.plans.caused(record["plan_id"], record["plan_key"], why.dependency_key, cause, None, now, memo,
                                 visible=visible, quiet=True)


def _record_cause(plan_id: str) -> Cause:
    """The cause of a plan no applied event explains (another incarnation's, or unjudgeable): its own record."""
    return Cause("plan-dependencies", f"plan:{plan_id}")
