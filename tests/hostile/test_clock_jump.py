"""Finding 8 of issue 10 through the broker: one wild clock tick cannot move event time for good."""

from __future__ import annotations

from tests.conftest import ATLAS_REQUEST
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
