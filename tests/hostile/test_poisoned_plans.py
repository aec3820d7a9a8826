"""Finding 5: a bad record on the internal, compacted `plan-dependencies` topic is skipped and counted, always."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from streams.admin import producer
from tests.conftest import ATLAS_REQUEST

pytestmark = pytest.mark.timeout(180)


def _poison(plan: dict) -> list[tuple[str, bytes | None, bytes]]:
    overflow = dict(plan, plan_id="pl-poison-overflow", request=dict(plan["request"],
                                                                     decision_time="0001-01-01T00:00:00+14:00"))
    wrong_type = dict(plan, plan_id="pl-poison-type", request=dict(plan["request"], budget={"tokens": "all"}))
    # Each would otherwise be taken over as the answer to the real plan's key.
    other_key = dict(plan, plan_id="pl-poison-key", request=dict(plan["request"], purpose="something_else"))
    topic = "plan-dependencies"
    return [(topic, b"pl-poison-json", b"{not json"),
            (topic, b"pl-poison-schema", orjson.dumps({"plan_id": 7})),
            (topic, b"pl-poison-overflow", orjson.dumps(overflow)),
            (topic, b"pl-poison-type", orjson.dumps(wrong_type)),
            (topic, b"pl-poison-asof", orjson.dumps(dict(plan, plan_id="pl-poison-asof",
                                                          compiled_as_of={"clock": {"0": -1}}))),
            (topic, b"pl-poison-key", orjson.dumps(other_key))]


async def _bad_records(worker) -> int:
    return (await worker.get("/healthz"))["counters"].get("bad_internal_records.plan-dependencies", 0)


async def test_poisoned_plans_records_never_stop_a_worker(worker):
    loaded = await worker.load("atlas.jsonl")
    plan = await worker.select(ATLAS_REQUEST, loaded)
    [published] = await worker.records("plan-dependencies",
                                       lambda rs: any(r["plan_id"] == plan["plan_id"] for r in rs))
    published = {k: v for k, v in published.items() if k != "_key"}

    prod = producer(worker.bootstrap)
    await prod.start()
    try:
        await asyncio.gather(*[await prod.send(worker.settings.topic(t), v, key=k) for t, k, v in _poison(published)])
    finally:
        await prod.stop()
    for _ in range(100):
        if await _bad_records(worker) >= 6:
            break
        await asyncio.sleep(0.1)
    assert await _bad_records(worker) == 6
    assert (await worker.select(ATLAS_REQUEST))["plan_id"] == plan["plan_id"]

    worker.stop()
    await worker.restart()  # the records are still on the topic; the feed resumes past them
    assert worker.proc.poll() is None
    assert (await worker.select(ATLAS_REQUEST))["plan_id"] == plan["plan_id"]
    await asyncio.sleep(1)
    assert worker.proc.poll() is None and await _bad_records(worker) == 6
