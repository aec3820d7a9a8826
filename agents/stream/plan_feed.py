"""Keep every plan's `plan-dependencies` record, and take over the owned ones compiled elsewhere."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, Awaitable, Callable

import duckdb
import orjson
from aiokafka import AIOKafkaConsumer

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


class PlanFeed:
    """Reads the internal `plan-dependencies` topic (every partition) into this worker's parked plans.

    Parked records are what a take-over restores from, without the network. A record of a plan
    this worker owns but has not stored (a peer compiled it before a hand-over, or a select on
    a peer that still thought it owned the entity) is judged without compiling: adopted when no
    key it depends on changed since its `compiled_as_of`, announced stale otherwise.
    """

    def __init__(self, state: LocalState, ownership: Ownership, parked: ParkedPlans, replica: Replica,
                 bootstrap_servers: str, topic: str, after_apply: Callable[[], object] | None = None,
                 kafka: dict | None = None,
                 run: Callable[..., Awaitable[Any]] = inline) -> None:
        self.state = state  # the read-write state: touched only through `run`
        self.ownership = ownership
        self.parked = parked
        self.replica = replica
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic  # broker-side name of `plan-dependencies`
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
            consumer.assign(tps)
            while True:
                try:
                    await self._follow(consumer, tps)
                except duckdb.Error as exc:
                    # The file itself fails (damaged, its disk gone): selects are refused already, and the
                    # worker stays up to say so. Nothing read since the saved positions counts as ingested.
                    self.state_failures += 1
                    log.error("the state file failed under the plan feed (%s); it reads plan-dependencies again "
                              "from its saved positions in %.0f s", type(exc).__name__, STATE_RETRY_SECONDS,
                              extra={"error_class": "state_unreadable"})
                    await asyncio.sleep(STATE_RETRY_SECONDS)
        finally:
            await stop_within(consumer)

    async def _follow(self, consumer: AIOKafkaConsumer, tps: list) -> None:
        """From the saved positions on, ingest until cancelled (or until the state file fails)."""
        positions = await self.run_writes(self._positions)
        for tp in tps:
            if tp.partition in positions:
                consumer.seek(tp, positions[tp.partition])
            else:
                await consumer.seek_to_beginning(tp)
        while True:
            batch = await consumer.getmany(timeout_ms=200, max_records=500)
            records = [(tp.partition, m.offset, m.value, m.key) for tp, ms in batch.items() for m in ms]
            # Only a batch that announced plans has records to flush: the rest would cost a writer read each.
            if records and await self._ingest_isolated(records) and self.after_apply:
                self.after_apply()

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
            current = self.parked.park(valid)
            crossed = self.parked.crossed - crossed
            if crossed:
                self.state.store.bump_many({"plan_lineages_crossed": crossed})
            known = self.state.plans.known([r["plan_id"] for r in valid])
            # Every record is judged (a stale one is announced); of a key's records, the one parked is made current.
            taken = self.ownership.adopt([r for r in valid if r["plan_id"] not in known],
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
               ) -> tuple[list[dict[str, Any]], list[str]]:
        """Valid records of a batch (after its tombstones), and the plan keys tombstoned."""
        plans: list[tuple[int, dict[str, Any]]] = []
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
            plans.append((offset, plan))
        valid = [p for offset, p in plans if offset > tombstones.get(p["plan_key"], -1)]
        return valid, list(tombstones)

    def _skip(self, partition: int, offset: int, why: str) -> None:
        """Count and log a `plan-dependencies` record this worker cannot use; the feed moves on."""
        self.state.store.bump_many({"bad_internal_records.plan-dependencies": 1})
        log.warning("skipped plan-dependencies record %d/%d: %s", partition, offset, why,
                    extra={"topic": self.topic, "partition": partition, "offset": offset,
                           "error_class": "bad_internal_record"})
