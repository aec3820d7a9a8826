"""Adopt plans that other workers compiled, or announce them stale when local state has moved on."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, Awaitable, Callable

import orjson
from aiokafka import AIOKafkaConsumer

from agents.plan_writer import PlanWriter
from agents.replica import Replica
from agents.writer import inline
from schemas.codec import validate
from schemas.errors import InvalidEvent
from state.local_state import LocalState
from streams.admin import stop_within
from streams.partitions import discover

log = logging.getLogger(__name__)

# A plan naming offsets this worker never reaches (another incarnation, a poisoned record) is
# judged against the state there is after this long, rather than stalling the feed.
FRESHNESS_WAIT_SECONDS = 30.0


class PlanFeed:
    """Reads the `plans` topic so that every worker's index covers every live plan.

    A plan compiled elsewhere is only judged once local state is at least as fresh as the
    offsets it was compiled at. It is then recompiled here: the same outcome is adopted as
    the key's current plan (so this worker invalidates it when it owns the partition of a
    later event); a different outcome means an event this worker already applied made it
    stale before its index knew it, so the plan is announced invalidated here, with the local
    compilation as its successor.
    """

    def __init__(self, state: LocalState, writer: PlanWriter, replica: Replica, bootstrap_servers: str,
                 topic: str, after_apply: Callable[[], object] | None = None, kafka: dict | None = None,
                 run: Callable[..., Awaitable[Any]] = inline) -> None:
        self.state = state  # the read-write state: touched only through `run`
        self.writer = writer
        self.replica = replica
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic  # broker-side name of `plans`
        self.after_apply = after_apply
        self.counts: Counter[str] = Counter()
        self.kafka = kafka or {}  # KafkaSecurity.client_kwargs()
        self.run_writes = run  # runs reads and writes of the state on the writer thread

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
            positions = await self.run_writes(self._positions)
            for tp in tps:
                if tp.partition in positions:
                    consumer.seek(tp, positions[tp.partition])
                else:
                    await consumer.seek_to_beginning(tp)
            while True:
                batch = await consumer.getmany(timeout_ms=200, max_records=500)
                records = [(tp.partition, m.offset, m.value, m.key) for tp, ms in batch.items() for m in ms]
                if records:
                    await self._ingest_isolated(records)
                    if self.after_apply:
                        self.after_apply()
        finally:
            await stop_within(consumer)

    async def _ingest_isolated(self, records: list[tuple[int, int, bytes | None, bytes | None]]) -> None:
        """Ingest a batch; if it fails, one record at a time, skipping (and counting) any that fails."""
        try:
            await self._ingest(records)
            return
        except Exception:  # noqa: BLE001 - one policy for poison: isolate it, never stop the feed
            log.exception("plans batch of %d failed; ingesting one by one", len(records))
            await self.run_writes(self.state.catalog.forget_cached)
        for record in records:
            try:
                await self._ingest([record])
            except Exception as exc:  # noqa: BLE001
                partition, offset, *_ = record
                await self.run_writes(self._pass_over, partition, offset, f"{type(exc).__name__} while ingesting")

    def _positions(self) -> dict[int, int]:
        return dict(self.state.store.db.execute("SELECT partition, next_offset FROM plan_feed").fetchall())

    def _pass_over(self, partition: int, offset: int, why: str) -> None:
        with self.state.store.transaction():
            self._save_positions({partition: offset + 1})
        self._skip(partition, offset, why)

    def _save_positions(self, ends: dict[int, int]) -> None:
        self.state.store.db.executemany(
            "INSERT INTO plan_feed VALUES (?, ?) ON CONFLICT (partition) DO UPDATE SET next_offset = "
            "greatest(plan_feed.next_offset, excluded.next_offset)", list(ends.items()))

    async def _ingest(self, records: list[tuple[int, int, bytes | None, bytes | None]]) -> None:
        foreign, cluster_id = await self.run_writes(self._foreign, records)
        for _, _, plan in foreign:
            # Judge a plan only against state at least as fresh as the state it was compiled from;
            # offsets of another broker incarnation say nothing about this one.
            if plan.get("compiled_in") == cluster_id:
                try:
                    await asyncio.wait_for(self.replica.wait_covers(plan.get("compiled_as_of") or {}),
                                           FRESHNESS_WAIT_SECONDS)
                except asyncio.TimeoutError:
                    log.warning("plan %s names offsets not reached in %.0fs; judged against current state",
                                plan["plan_id"], FRESHNESS_WAIT_SECONDS, extra={"plan_id": plan["plan_id"]})
        ends: dict[int, int] = {}
        for partition, offset, *_ in records:
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        await self.run_writes(self._settle, foreign, ends)

    def _settle(self, foreign: list[tuple[int, int, dict[str, Any]]], ends: dict[int, int]) -> None:
        with self.state.store.transaction():
            self._judge(foreign)
            self._save_positions(ends)

    def _foreign(self, records: list[tuple[int, int, bytes | None, bytes | None]],
                 ) -> tuple[list[tuple[int, int, dict[str, Any]]], str | None]:
        """Valid plans of a batch this worker has not stored, after a peer's evictions; and the cluster id."""
        plans: list[tuple[int, int, dict[str, Any]]] = []
        # A tombstone is a peer's eviction of that plan id; a later record of the id brings it back.
        tombstones = {key.decode(errors="replace"): offset for _, offset, value, key in records
                      if value is None and key}
        for partition, offset, value, _ in records:
            if value is None:
                continue
            try:
                plan = orjson.loads(value)
                validate("plans", plan)
                if not isinstance(plan.get("request"), dict):
                    raise InvalidEvent("schema_violation", "plans record has no request object")
            except (orjson.JSONDecodeError, InvalidEvent) as exc:
                self._skip(partition, offset, getattr(exc, "message", "not JSON"))
                continue
            plans.append((partition, offset, plan))
        plans = [(partition, offset, p) for partition, offset, p in plans
                 if offset > tombstones.get(p["plan_id"], -1)]
        if tombstones:
            with self.state.store.transaction():
                self._drop_evicted(list(tombstones))
        known = self.state.plans.known([p["plan_id"] for _, _, p in plans])
        foreign = [(partition, offset, p) for partition, offset, p in plans if p["plan_id"] not in known]
        return foreign, self.state.store.incarnation()[0]

    def _drop_evicted(self, plan_ids: list[str]) -> None:
        """Stop serving and indexing plans a peer evicted: it no longer indexes them (see RetentionTimer)."""
        dropped = self.state.retention.drop_evicted_elsewhere(plan_ids, self.state.store.now())
        if dropped:
            self.state.store.bump_many({"plans_evicted_by_peers": len(dropped)})
            log.info("dropped %d plans a peer evicted", len(dropped), extra={"plans": len(dropped),
                                                                             "reason": "evicted"})

    def _skip(self, partition: int, offset: int, why: str, counts: Counter[str] | None = None) -> None:
        """Count and log a `plans` record this worker cannot use; the feed moves on."""
        if counts is None:
            self.state.store.bump_many({"bad_internal_records.plans": 1})
        else:
            counts["bad_internal_records.plans"] += 1
        log.warning("skipped plans record %d/%d: %s", partition, offset, why,
                    extra={"topic": self.topic, "partition": partition, "offset": offset,
                           "error_class": "bad_internal_record"})

    def _judge(self, foreign: list[tuple[int, int, dict[str, Any]]]) -> None:
        self.writer.judge_foreign(foreign, self.topic, self._skip)
