"""Rebuild a worker's local state from the topics: catalog and clock from the inputs, plans from `plans`."""

from __future__ import annotations

import logging
import shutil
import time
from datetime import datetime, timezone

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.event_apply import EventApplier, RawMessage
from agents.plan_writer import PlanWriter
from schemas.cdc_mapping import CdcMapping
from state.local_state import LocalState
from streams.incarnation import read_cluster_id
from streams.settings import INPUT_TOPICS, Settings

log = logging.getLogger(__name__)


async def read_all(bootstrap: str, topic: str, on_batch, progress=None, kafka: dict | None = None) -> int:
    """Feed every record of a topic, from the beginning to its current end, to `on_batch`."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **(kafka or {}))
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            await consumer.topics()
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return 0
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
        reached = dict(starts)  # next offset to see, per partition (positions can run ahead of delivery)
        total, seen = sum(ends[tp] - starts[tp] for tp in tps), 0
        # ListOffsets may under-report the end (Tansu counts batches), so read until the fetch
        # high watermark is reached as well.
        while True:
            batch = await consumer.getmany(timeout_ms=500, max_records=2000)
            records = []
            for tp, messages in batch.items():
                for m in messages:
                    reached[tp] = max(reached[tp], m.offset + 1)
                    records.append(m)
            for tp in tps:
                ends[tp] = max(ends[tp], consumer.highwater(tp) or 0)
            known = all(consumer.highwater(tp) is not None for tp in tps)
            if not records and known and all(reached[tp] >= ends[tp] for tp in tps):
                break
            if records:
                on_batch(records)
                seen += len(records)
                if progress:
                    progress(topic, seen, total)
        return seen
    finally:
        await consumer.stop()


async def replay(settings: Settings, bootstrap: str, progress=None, cdc: CdcMapping | None = None) -> dict:
    """Move the DuckDB file aside, re-apply every input event, and restore the current plans."""
    db = settings.db_path
    backup = None
    if db.exists():
        backup = db.with_name(f"{db.name}.before-replay-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}")
        shutil.move(db, backup)
    state = LocalState.open(db)
    kafka = settings.kafka.client_kwargs()
    try:
        with state.store.transaction():
            state.store.record_cluster(await read_cluster_id(bootstrap, **kafka))
        writer = PlanWriter(state, settings.topic)
        applier = EventApplier(state, writer, settings.max_event_bytes, max_clock_jump=settings.max_clock_jump,
                               cdc=cdc)
        started = time.perf_counter()
        applied = {}
        for name in INPUT_TOPICS:
            def apply(records, name=name):
                applier.apply([RawMessage(name, m.partition, m.offset, m.key, m.value, m.timestamp / 1000)
                                   for m in records])
            applied[name] = await read_all(bootstrap, settings.topic(name), apply, progress, kafka)
        plans: dict[str, dict] = {}
        gone: set[str] = set()

        def keep_plans(records):
            for m in records:
                if m.value is None:  # a tombstone: the plan was evicted (a later record brings it back)
                    plans.pop((m.key or b"").decode(errors="replace"), None)
                    continue
                plan = orjson.loads(m.value)
                plans[plan["plan_id"]] = plan

        def keep_invalidated(records):
            # Evictions are settled by the tombstones on `plans`, which keep their order there.
            gone.update(r["plan_id"] for r in map(orjson.loads, (m.value for m in records))
                        if r.get("reason") != "evicted")

        await read_all(bootstrap, settings.topic("plans"), keep_plans, progress, kafka)
        await read_all(bootstrap, settings.topic("plan-invalidations"), keep_invalidated, progress, kafka)
        restored, changed = writer.restore([p for pid, p in plans.items() if pid not in gone])
        return {"backup": str(backup) if backup else None, "events": applied, "plans_restored": restored,
                "plans_changed": changed, "seconds": round(time.perf_counter() - started, 2)}
    finally:
        state.close()
