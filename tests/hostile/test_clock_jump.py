"""Finding 8 of issue 10 through the broker: one wild clock tick cannot move event time for good."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.timefmt import format_instant
from tests.conftest import ATLAS_REQUEST, eventually, launch
from tests.events import tick

LIVE = dict(ATLAS_REQUEST, decision_time="now")


async def test_a_tick_far_in_the_future_is_dead_lettered_and_changes_nothing(worker):
    fresh = await worker.load("atlas.jsonl")
    live = await worker.select(LIVE, fresh)
    fresh = await worker.publish_events(tick("2206-08-30T00:00:00Z"))
    letters = await worker.records("dead-letters", lambda rs: len(rs) >= 2)   # one per clock partition
    assert [r["error_class"] for r in letters] == ["clock_jump", "clock_jump"]
    assert "2206" not in letters[0]["message"]
    same = await worker.select(LIVE, fresh)
    assert same["plan_id"] == live["plan_id"] and same["decision_time"] == "2026-08-30T09:00:00Z"
    assert (await worker.get("/healthz"))["now"] == "2026-08-30T09:00:00Z"

    fresh = await worker.publish_events(tick("2026-08-31T00:00:00Z"))           # later correct ticks still apply
    await worker.select(LIVE, fresh)
    health = await worker.get("/healthz")
    assert health["now"] == "2026-08-31T00:00:00Z"
    assert "dead_letters.clock_regression" not in health["counters"]
    assert health["counters"]["dead_letters.clock_jump"] == 2


async def test_steps_each_under_the_bound_cannot_move_the_clock_years_ahead(worker):
    wall = datetime.now(timezone.utc).replace(microsecond=0)
    await worker.publish_events(tick(format_instant(wall)))
    await eventually(lambda: _now_is(worker, format_instant(wall)), what="the wall tick applied")
    steps = [tick(format_instant(wall + timedelta(days=399 * n))) for n in range(1, 9)]
    await worker.publish_events(*steps)
    letters = await worker.records("dead-letters", lambda rs: len(rs) >= 14)   # 7 refused steps, 2 partitions
    assert {r["error_class"] for r in letters} == {"clock_jump"}
    assert any("ahead of the time it was published" in r["message"] for r in letters)
    assert (await worker.get("/healthz"))["now"] == format_instant(wall + timedelta(days=399))


async def _now_is(worker, instant: str) -> bool:
    return (await worker.get("/healthz"))["now"] == instant


async def test_wall_ticks_stop_while_event_time_is_ahead_of_the_wall(broker, tmp_path):
    async with launch(broker, tmp_path, FRESHPLAN_WALL_CLOCK="1", FRESHPLAN_WALL_CLOCK_INTERVAL="0.2") as worker:
        ahead = format_instant(datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=1))
        await worker.publish_events(tick(ahead))

        async def now_is_ahead() -> bool:
            return (await worker.get("/healthz"))["now"] == ahead
        await eventually(now_is_ahead, what="the tick ahead of the wall applied")
        seen_at = datetime.now(timezone.utc)

        async def runs() -> int:
            return (await worker.get("/healthz"))["background_jobs"]["runs"].get("wall_clock_tick", 0)
        start = await runs()
        await eventually(lambda: _at_least(runs, start + 5), what="five more wall clock runs")
        assert (await worker.get("/healthz"))["now"] == ahead
        # Ticks made while the far tick was in flight may still land behind it (and be refused as a
        # regression); the property is that none is made once event time is seen ahead of the wall.
        made = [datetime.fromisoformat(r["now"].replace("Z", "+00:00"))
                for r in await _all_records(worker, "clock") if r["event_id"].startswith("wall-")]
        assert made, "the wall clock ticked before the far tick applied"
        assert max(made) <= seen_at.replace(microsecond=0)


async def _all_records(worker, topic: str) -> list[dict]:
    """Every record on `topic` now: read up to the end offsets taken first."""
    consumer = AIOKafkaConsumer(bootstrap_servers=worker.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        name = worker.settings.topic(topic)
        parts = [TopicPartition(name, p) for p in sorted(consumer.partitions_for_topic(name) or ())]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        seen: list[dict] = []

        async def read() -> None:
            while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
                for messages in (await consumer.getmany(timeout_ms=200)).values():
                    seen.extend(orjson.loads(m.value) for m in messages)
        await asyncio.wait_for(read(), 30)
        return seen
    finally:
        await consumer.stop()


async def _at_least(runs, n: int) -> bool:
    return await runs() >= n
