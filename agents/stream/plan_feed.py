"""Keep the `plan-dependencies` records of the held partitions' plans, and take over owned ones compiled elsewhere."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, Awaitable, Callable, Collection

import duckdb
import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from agents.plans.ownership import Ownership
from agents.stream.replica import Replica
from agents.stream.writer import inline
from compiler.errors import RequestError
from compiler.request import parse_request, plan_key
from schemas.codec import validate
from schemas.errors import InvalidEvent
from state.local_state import LocalState
from state.parked_plans import ParkedPlans
from streams.admin import stop_within
from streams.partitions import discover

log = logging.getLogger(__name__)

STATE_RETRY_SECONDS = 5.0  # between attempts to follow the topic again once the state file failed
BROKER_RETRY_SECONDS = 1.0  # between attempts to follow the topic again after the broker failed a request


class PlanFeed:
    """Reads the partitions of the internal `plan-dependencies` topic this worker holds into its parked plans.

    A record goes to the partition of its plan's entity, so the partitions a worker holds (owned,
    and standby copies) carry the records of all their plans. Parked records are what a take-over
    restores from, without the network; a partition gained is read from its start, and the take-over
    waits for that read (`caught_up`). A record of a plan this worker owns but has not stored (a peer
    compiled it before a hand-over, or a select on a peer that still thought it owned the entity) is
    judged without compiling: adopted when no key it depends on changed since its `compiled_as_of`,
    announced stale otherwise.
    """

    def __init__(self, state: LocalState, ownership: Ownership, parked: ParkedPlans, replica: Replica,
                 bootstrap_servers: str, topic: str, keeps: Callable[[], frozenset[int]],
                 after_apply: Callable[[], object] | None = None, kafka: dict | None = None,
                 run: Callable[..., Awaitable[Any]] = inline) -> None:
        self.state = state  # the read-write state: touched only through `run`
        self.ownership = ownership
        self.parked = parked
        self.replica = replica
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic  # broker-side name of `plan-dependencies`
        self.keeps = keeps  # the partitions whose plans this worker holds (and is gaining)
        self.following: frozenset[int] = frozenset()  # the partitions the feed reads now
        self.behind: dict[int, int] = {}  # partition -> the end offset a read from its start must reach
        self.wakers: list[asyncio.Event] = []  # set as a partition's read reaches its end (a follower waits on one)
        self.after_apply = after_apply  # after a batch that announced plans (the publisher's kick)
        self.counts: Counter[str] = Counter()
        self.kafka = kafka or {}  # KafkaSecurity.client_kwargs()
        self.run_writes = run  # runs reads and writes of the state on the writer thread
        self.state_failures = 0  # times the state file failed under the feed (it then waits and reads again)

    async def run(self) -> None:
        """Consume and adopt until cancelled."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False,
                                    auto_offset_reset="earliest", max_partition_fetch_bytes=4_000_000, **self.kafka)
        # Judging needs the replica's view: its offsets verified against this broker incarnation
        # (else every plan would look like another incarnation's and be judged against nothing).
        try:
            await self.replica.ready.wait()
            await consumer.start()
            tps = await discover(consumer, [self.topic], attempts=None)
            while True:
                try:
                    await self._follow(consumer, tps)
                except KafkaError as exc:
                    # A broker slow to say where a partition ends (a rebalance, a restart): follow again.
                    log.warning("the plan feed could not follow plan-dependencies (%r); following again in %.0f s",
                                exc, BROKER_RETRY_SECONDS, extra={"error_class": "plan_feed_broker"})
                    await asyncio.sleep(BROKER_RETRY_SECONDS)
                except duckdb.Error as exc:
                    # The file itself fails (damaged, its disk gone): selects are refused already, and the
                    # worker stays up to say so. Nothing read since the saved positions counts as ingested.
                    self.state_failures += 1
                    log.error("the state file failed under the plan feed (%s); it reads plan-dependencies again "
                              "from its saved positions in %.0f s", type(exc).__name__, STATE_RETRY_SECONDS,
                              extra={"error_class": "state_unreadable"})
                    await asyncio.sleep(STATE_RETRY_SECONDS)
                except Exception:  # noqa: BLE001 - a fault of the feed's own must not stop the worker: follow again
                    self.state_failures += 1
                    log.exception("the plan feed failed; it follows plan-dependencies again from its saved positions "
                                  "in %.0f s", STATE_RETRY_SECONDS, extra={"error_class": "plan_feed_failed"})
                    await asyncio.sleep(STATE_RETRY_SECONDS)
        finally:
            await stop_within(consumer)

    def caught_up(self, partitions: Collection[int]) -> bool:
        """Whether the feed has read each of these partitions it reads to where it stood when the read began.

        One it does not read yet is not waited for: held before (a restart), its records were parked
        up to the saved position; gained, the feed starts reading it within a fetch wait, long before
        its resources are restored. Either way a record read after the take-over is judged as it arrives.
        """
        return not set(partitions) & set(self.behind)

    async def _follow(self, consumer: AIOKafkaConsumer, tps: list) -> None:
        """From the saved positions on, ingest the held partitions until they change (or the state file fails)."""
        self.following = frozenset()
        try:
            await self._follow_held(consumer, {tp.partition: tp for tp in tps})
        finally:
            self.following = frozenset()

    async def _follow_held(self, consumer: AIOKafkaConsumer, by_partition: dict[int, Any]) -> None:
        keeps = frozenset(self.keeps())
        positions = await self.run_writes(self._positions)
        # A rebase onto another broker forgets every position; records were read from the topic before. (Not a
        # partition holding fewer records than were read: the embedded broker reports the end of a partition
        # written in batches of several records short of it.)
        reset = [] if positions else sorted(await self.run_writes(self.parked.sources))
        if reset:
            await self.run_writes(self._publish_again, reset)
            positions = {**positions, **dict.fromkeys(reset, 0)}  # read again from the start
        lost = set(positions) - keeps
        if lost:
            await self.run_writes(self._drop, lost)
        wanted = [by_partition[p] for p in sorted(keeps) if p in by_partition]
        consumer.assign(wanted)
        for tp in wanted:
            if tp.partition in positions:
                consumer.seek(tp, positions[tp.partition])
            else:
                await consumer.seek_to_beginning(tp)
        ends = await consumer.end_offsets(wanted) if wanted else {}
        self.behind = {tp.partition: end for tp, end in ends.items() if await consumer.position(tp) < end}
        self.following = keeps
        self._woken()
        while frozenset(self.keeps()) == keeps:
            if not wanted:  # nothing held (yet): nothing to read
                await asyncio.sleep(0.2)
                continue
            batch = await consumer.getmany(timeout_ms=200, max_records=500)
            records = [(tp.partition, m.offset, m.value, m.key) for tp, ms in batch.items() for m in ms]
            # Only a batch that announced plans has records to flush: the rest would cost a writer read each.
            if records and await self._ingest_isolated(records) and self.after_apply:
                self.after_apply()
            if self.behind:
                caught = [p for p, end in self.behind.items() if await consumer.position(by_partition[p]) >= end]
                if caught:
                    self.behind = {p: end for p, end in self.behind.items() if p not in caught}
                    self._woken()

    def _woken(self) -> None:
        for event in self.wakers:
            event.set()

    def _publish_again(self, partitions: list[int]) -> None:
        """The topic lost records this worker read from these partitions (a rebase onto another broker): put back
        what it parked of them, each on its entity's partition.

        After a reset the file is the only copy of a plan's record, and a partition that moves
        to a worker that never held it would leave the plan followed by nobody. Published as they
        were (compiled in the old incarnation, so a new owner judges them stale and announces them).
        """
        rows = self.parked.placed(partitions)
        with self.state.store.transaction():
            self.state.outbox.add_many([(self.topic, key.encode(), record.encode()) for key, _, record in rows],
                                       partitions=[partition for _, partition, _ in rows])
            self.parked.published(partitions)
            db = self.state.store.db
            db.execute("DELETE FROM plan_feed WHERE partition IN (SELECT unnest(?::INTEGER[]))", [partitions])
            self._save_positions(dict.fromkeys(partitions, 0))
        log.warning("plan-dependencies was reset (a rebase forgot its read positions) after this worker read "
                    "partitions %s; published the %d records parked of them again", partitions, len(rows),
                    extra={"partitions": partitions, "records": len(rows), "reason": "plan_feed_reset"})

    def _drop(self, partitions: Collection[int]) -> None:
        """Forget the parked plans and read positions of partitions no longer held."""
        with self.state.store.transaction():
            dropped = self.parked.drop(partitions)
            self.state.store.db.execute("DELETE FROM plan_feed WHERE partition IN (SELECT unnest(?::INTEGER[]))",
                                        [sorted(partitions)])
        log.info("forgot %d parked plans of partitions %s, no longer held", dropped, sorted(partitions),
                 extra={"partitions": sorted(partitions), "reason": "parked_plans_dropped"})

    async def _ingest_isolated(self, records: list[tuple[int, int, bytes | None, bytes | None]]) -> bool:
        """Ingest a batch; if it fails, one record at a time, skipping (and counting) any that fails. Whether
        any plan was announced."""
        try:
            return await self._ingest(records)
        except Exception:  # noqa: BLE001 - one policy for poison: isolate it, never stop the feed
            log.exception("plan-dependencies batch of %d failed; ingesting one by one", len(records))
            await self.run_writes(self.state.catalog.forget_cached)
        announced = False
        for record in records:
            try:
                announced = await self._ingest([record]) or announced
            except Exception as exc:  # noqa: BLE001
                partition, offset, *_ = record
                await self.run_writes(self._pass_over, partition, offset, f"{type(exc).__name__} while ingesting")
        return announced

    def _positions(self) -> dict[int, int]:
        return dict(self.state.store.db.execute("SELECT partition, next_offset FROM plan_feed").fetchall())

    def _pass_over(self, partition: int, offset: int, why: str) -> None:
        with self.state.store.transaction():
            self._save_positions({partition: offset + 1})
        self._skip(partition, offset, why)

    def _save_positions(self, ends: dict[int, int]) -> None:
        # One statement for every partition: executemany costs a statement per row.
        if not ends:
            return
        self.state.store.db.execute(
            f"INSERT INTO plan_feed VALUES {', '.join(['(?, ?)'] * len(ends))} ON CONFLICT (partition) DO UPDATE "
            "SET next_offset = greatest(plan_feed.next_offset, excluded.next_offset)",
            [v for item in ends.items() for v in item])

    async def _ingest(self, records: list[tuple[int, int, bytes | None, bytes | None]]) -> bool:
        # No wait for local state to catch up with a record's compiled_as_of: judging by key change
        # positions only asks whether something changed since, and later events find it indexed.
        return await self.run_writes(self._settle, records)

    def _settle(self, records: list[tuple[int, int, bytes | None, bytes | None]]) -> bool:
        """Park, judge and take over a batch of records in one transaction; whether any plan was announced."""
        ends: dict[int, int] = {}
        for partition, offset, *_ in records:
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        with self.state.store.transaction():
            valid, tombstones = self._valid(records)
            self.parked.forget(tombstones)
            crossed = self.parked.crossed
            # A record about another partition's entity (placed before records went by entity, or by a hostile
            # producer) is that partition's holders' to keep. What the loop follows, not what is held now: the
            # loop saves every record's position, and sees a change of what is held after the batch.
            valid = [(p, r) for p, r in valid if self.parked.partition_of(r["entity_id"]) in self.following]
            current = self.parked.park([r for _, r in valid], [p for p, _ in valid])
            valid = [r for _, r in valid]
            crossed = self.parked.crossed - crossed
            if crossed:
                self.state.store.bump_many({"plan_lineages_crossed": crossed})
            known = self.state.plans.known([r["plan_id"] for r in valid])
            headed = self.state.plans.headed([r["plan_key"] for r in valid])
            # Every record is judged (a stale one is announced); of a key's records, the one parked is made current.
            # Also one of a plan stored here once whose key has no current plan: its partition was handed back and
            # taken again, and the take-over did not wait for this record.
            taken = self.ownership.adopt([r for r in valid if r["plan_id"] not in known or r["plan_key"] not in headed],
                                         parked={r["plan_id"] for r in current.values()})
            self._save_positions(ends)
        if crossed:
            log.info("%d plan-dependencies records did not descend from the plan parked for their key (the topic "
                     "compacted the records between, or two workers owned the key at once); the one read further "
                     "is kept",
                     crossed, extra={"records": crossed, "reason": "plan_lineage_crossed"})
        if taken.plans:
            log.info("took over %d plans compiled elsewhere (%d stale)", taken.plans, len(taken.stale),
                     extra={"plans": taken.plans, "reason": "adopted"})
        return bool(taken.stale)

    def _valid(self, records: list[tuple[int, int, bytes | None, bytes | None]],
               ) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
        """Valid records of a batch (after its tombstones) with the partition each was read from, and the plan
        keys tombstoned."""
        plans: list[tuple[int, int, dict[str, Any]]] = []
        # A tombstone is the owner's eviction of that plan key; a later record of the key brings it back.
        tombstones = {key.decode(errors="replace"): offset for _, offset, value, key in records
                      if value is None and key}
        for partition, offset, value, _ in records:
            if value is None:
                continue
            try:
                plan = orjson.loads(value)
                validate("plan-dependencies", plan)
                if not isinstance(plan.get("request"), dict):
                    raise InvalidEvent("schema_violation", "plan-dependencies record has no request object")
                # A record is taken over as the answer to its plan key: the key must be its request's
                # (a float budget is published rounded: restore refuses those, it does not trust them).
                rounded = any(isinstance(v, float) for v in (plan["request"].get("budget") or {}).values())
                if plan_key(parse_request(plan["request"]), plan["entity_id"]) != plan["plan_key"] and not rounded:
                    raise InvalidEvent("schema_violation", "plan_key is not the key of the record's request")
            except (orjson.JSONDecodeError, InvalidEvent) as exc:
                self._skip(partition, offset, getattr(exc, "message", "not JSON"))
                continue
            except RequestError as exc:
                self._skip(partition, offset, f"its request does not parse ({exc.code})")
                continue
            plans.append((partition, offset, plan))
        valid = [(partition, p) for partition, offset, p in plans if offset > tombstones.get(p["plan_key"], -1)]
        return valid, list(tombstones)

    def _skip(self, partition: int, offset: int, why: str) -> None:
        """Count and log a `plan-dependencies` record this worker cannot use; the feed moves on."""
        self.state.store.bump_many({"bad_internal_records.plan-dependencies": 1})
        log.warning("skipped plan-dependencies record %d/%d: %s", partition, offset, why,
                    extra={"topic": self.topic, "partition": partition, "offset": offset,
                           "error_class": "bad_internal_record"})
