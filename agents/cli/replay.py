"""Rebuild a worker's local state from the topics: catalog and clock from the inputs, plans from `plans`."""

from __future__ import annotations

import logging
import shutil
import time
from collections import Counter
from datetime import datetime, timezone

import orjson

from agents.stream.event_apply import EventApplier
from agents.stream.raw_message import RawMessage
from agents.plans.plan_writer import PlanWriter
from schemas.cdc_mapping import CdcMapping
from schemas.codec import validate
from schemas.errors import InvalidEvent
from state.local_state import LocalState
from streams.incarnation import read_cluster_id
from streams.partitions import read_all
from streams.settings import INPUT_TOPICS, Settings

log = logging.getLogger(__name__)


async def replay(settings: Settings, bootstrap: str, progress=None, cdc: CdcMapping | None = None) -> dict:
    """Move the DuckDB file aside, re-apply every input event, and restore the current plans."""
    db = settings.db_path
    backup = None
    if db.exists():
        backup = db.with_name(f"{db.name}.before-replay-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}")
        shutil.move(db, backup)
        wal = db.with_name(db.name + ".wal")
        if wal.exists():  # committed transactions may still be only there: the kept copy needs them
            shutil.move(wal, backup.with_name(backup.name + ".wal"))
    state = LocalState.open(db)
    kafka = settings.kafka.client_kwargs()
    try:
        with state.store.transaction():
            state.store.record_cluster(await read_cluster_id(bootstrap, **kafka))
        writer = PlanWriter(state, settings.topic, partitions=settings.partitions)
        applier = EventApplier(state, writer, settings.max_event_bytes, max_clock_jump=settings.max_clock_jump,
                               cdc=cdc, max_event_skew=settings.max_event_skew)
        started = time.perf_counter()
        applied = {}
        for name in INPUT_TOPICS:
            def apply(records, name=name):
                applier.apply([RawMessage(name, m.partition, m.offset, m.key, m.value, m.timestamp / 1000)
                                   for m in records])
            applied[name] = await read_all(bootstrap, settings.topic(name), apply, progress, kafka)
        plans: dict[str, dict] = {}
        # When each plan id was last published on `plans` and last announced invalidated (broker timestamps, ms):
        # a plan announced before its successor was compiled comes back as current when the successor is the
        # same plan id, published after the announcement. The topics share no offsets, so time orders them;
        # a tie keeps the plan, which `restore` recompiles and announces if the state says otherwise.
        published: dict[str, int] = {}
        invalidated: dict[str, int] = {}

        bad: Counter[str] = Counter()

        def keep_plans(records):
            for m in records:
                if m.value is None:  # a tombstone: the plan was evicted (a later record brings it back)
                    plans.pop((m.key or b"").decode(errors="replace"), None)
                    continue
                plan = _internal("plans", m, bad)
                if plan is not None:
                    plans[plan["plan_id"]] = plan
                    published[plan["plan_id"]] = max(published.get(plan["plan_id"], -1), m.timestamp or 0)

        def keep_invalidated(records):
            # Evictions are settled by the tombstones on `plans`, which keep their order there.
            for m in records:
                record = _internal("plan-invalidations", m, bad)
                if record is not None and record.get("reason") != "evicted":
                    invalidated[record["plan_id"]] = max(invalidated.get(record["plan_id"], -1), m.timestamp or 0)

        await read_all(bootstrap, settings.topic("plans"), keep_plans, progress, kafka)
        await read_all(bootstrap, settings.topic("plan-invalidations"), keep_invalidated, progress, kafka)
        gone = {pid for pid, at in invalidated.items() if at > published.get(pid, -1)}
        restored, changed = writer.restore([p for pid, p in plans.items() if pid not in gone])
        if bad:
            with state.store.transaction():
                state.store.bump_many(bad)
        return {"backup": str(backup) if backup else None, "events": applied, "plans_restored": restored,
                "plans_changed": changed, "bad_internal_records": {k.split(".", 1)[1]: v for k, v in bad.items()},
                "seconds": round(time.perf_counter() - started, 2)}
    finally:
        state.close()


def _internal(topic: str, m, bad: Counter[str]) -> dict | None:
    """An internal record as its schema allows it, or None: skipped, logged and counted, never a traceback."""
    try:
        record = orjson.loads(m.value)
        validate(topic, record)
        if topic == "plans" and not isinstance(record.get("request"), dict):
            raise InvalidEvent("schema_violation", "plans record has no request object")
        return record
    except orjson.JSONDecodeError:
        why = "not JSON"
    except InvalidEvent as exc:
        why = exc.message
    bad[f"bad_internal_records.{topic}"] += 1
    log.warning("replay skipped %s record %d/%d: %s", topic, m.partition, m.offset, why,
                extra={"topic": topic, "partition": m.partition, "offset": m.offset,
                       "error_class": "bad_internal_record"})
    return None
