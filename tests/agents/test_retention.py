"""Finding 11 through the broker: a plan not selected for the retention span is evicted and announced."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from schemas.plan_partition import plan_partition
from tests.conftest import ATLAS_REQUEST, start_peer
from tests.events import resource, tick

pytestmark = pytest.mark.timeout(180)

OTHER = dict(ATLAS_REQUEST, budget={"tokens": 1500})


async def _until(worker, check, timeout: float = 30.0) -> dict:
    async def poll() -> dict:
        while True:
            health = await worker.get("/healthz")
            if check(health):
                return health
            await asyncio.sleep(0.1)
    return await asyncio.wait_for(poll(), timeout)


async def test_an_unselected_plan_is_evicted_announced_and_compiled_again(worker):
    worker.stop()
    worker.env.update(FRESHPLAN_RETENTION_INTERVAL="0.2", FRESHPLAN_PLAN_RETENTION="P30D")
    await worker.restart()
    loaded = await worker.load("atlas.jsonl")                  # event time 2026-08-30T09:00:00Z
    idle = await worker.select(ATLAS_REQUEST, loaded)
    used = await worker.select(OTHER, loaded)
    assert idle["plan_key"] != used["plan_key"]
    both = await _until(worker, lambda h: h["retention"]["stamped_keys"] == 2)  # stamped at the start
    assert both["plans"] == {"fresh": 2}

    later = await worker.publish_events(tick("2026-09-19T09:00:00Z"))
    assert (await worker.select(OTHER, later))["served_from"] == "cache"   # used keeps being selected
    await worker.publish_events(tick("2026-10-09T09:00:00Z"))          # 40 days after the first select

    [evicted] = await worker.records("plan-invalidations", lambda rs: any(r["reason"] == "evicted" for r in rs))
    assert evicted["plan_id"] == idle["plan_id"] and evicted["successor_plan_id"] is None
    assert evicted["cause"]["dependency_key"] == "retention:plan"
    health = await _until(worker, lambda h: h["counters"].get("plans_evicted") == 1)
    assert health["plans"] == {"fresh": 1} and health["index_edges"] == both["index_edges"] // 2
    assert (health["retention"]["stamped_keys"], health["retention"]["evicted_markers"]) == (1, 1)
    status = await worker.get(f"/v1/plans/{idle['plan_id']}")
    assert status["status"] == "invalidated" and status["reason"] == "evicted"
    async with worker.http.get(f"{worker.url}/metrics") as resp:
        assert "freshplan_plans_evicted_total 1.0" in await resp.text()

    kept = await worker.select(OTHER)
    assert kept["served_from"] == "cache" and kept["plan_id"] == used["plan_id"]
    again = await worker.select(ATLAS_REQUEST)
    assert again["served_from"] == "compiled" and again["plan_id"] == idle["plan_id"]
    assert (await worker.get(f"/v1/plans/{idle['plan_id']}"))["status"] == "fresh"
    await asyncio.sleep(1)                                        # several passes: nothing else goes
    everything = await worker.everything("plan-invalidations")
    assert [r["plan_id"] for r in everything if r["reason"] == "evicted"] == [idle["plan_id"]]
    assert worker.proc.poll() is None
    _placed_by_entity(await worker.everything("plan-dependencies"), idle["plan_key"], worker.settings.partitions)


def _placed_by_entity(records: list[dict], evicted_key: str, partitions: int) -> None:
    """Every `plan-dependencies` record, and the evicted key's tombstone, sits on its entity's partition."""
    [entity] = {r["entity_id"] for r in records if not r.get("_tombstone")}
    on = plan_partition(entity, partitions)
    assert {r["_partition"] for r in records if not r.get("_tombstone")} == {on}
    assert plan_partition(evicted_key, partitions) != on   # else the key's own placement would prove nothing here
    assert [(r["_key"], r["_partition"]) for r in records if r.get("_tombstone")] == [(evicted_key.encode(), on)]


async def test_a_duplicate_within_the_event_id_retention_is_skipped_after_a_rotation_and_applied_after_it(worker):
    worker.stop()
    worker.env.update(FRESHPLAN_RETENTION_INTERVAL="0.2", FRESHPLAN_EVENT_ID_RETENTION="P7D")
    await worker.restart()
    loaded = await worker.load("atlas.jsonl")                      # event time 2026-08-30T09:00:00Z
    before = await worker.select(ATLAS_REQUEST, loaded)
    topic, waiver = resource("approved-waiver-W2", version=2, content="Waiver W2, amended.")
    await worker.publish_events((topic, waiver))
    first = await _until(worker, lambda h: h["counters"].get("invalidations", 0) >= 1)
    amended = await worker.select(ATLAS_REQUEST)
    assert amended["plan_id"] != before["plan_id"]
    await _until(worker, lambda h: h["retention"]["event_id_generations"] == 1 and h["now"] is not None)
    await worker.publish_events(tick("2026-09-07T09:00:00Z"))     # 8 days on: the generation rotates
    await _until(worker, lambda h: h["retention"]["event_id_generations"] == 2)

    await worker.publish_events((topic, waiver))                   # a producer's retry, days later
    again = await _until(worker, lambda h: h["counters"].get("duplicate_events", 0)
                         > first["counters"].get("duplicate_events", 0))
    assert again["counters"].get("ignored_old_versions", 0) == first["counters"].get("ignored_old_versions", 0)
    assert again["counters"]["invalidations"] == first["counters"]["invalidations"]
    assert "event_ids_expired" not in again["counters"]

    await worker.publish_events(tick("2026-09-15T09:00:00Z"))     # two spans on: the old generation is dropped
    dropped = await _until(worker, lambda h: h["counters"].get("event_id_generations_dropped") == 1)
    assert dropped["counters"]["event_ids_expired"] >= 2          # Atlas's events and the waiver's
    await worker.publish_events((topic, waiver))                   # forgotten: applied again, its version ignored
    late = await _until(worker, lambda h: h["counters"].get("ignored_old_versions", 0)
                        > first["counters"].get("ignored_old_versions", 0))
    assert late["counters"]["duplicate_events"] == again["counters"]["duplicate_events"]
    assert late["counters"]["invalidations"] == first["counters"]["invalidations"]
    assert (await worker.select(ATLAS_REQUEST))["plan_id"] == amended["plan_id"]  # nothing changed
    assert worker.proc.poll() is None


async def test_unknown_retention_span_refuses_to_start(worker):
    worker.stop()
    worker.env["FRESHPLAN_PLAN_RETENTION"] = "30 days"
    with pytest.raises(AssertionError, match="ISO 8601 duration"):
        await worker.restart()
    worker.env["FRESHPLAN_PLAN_RETENTION"] = "P30D"
    await worker.restart()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{worker.url}/healthz") as resp:
            assert resp.status == 200


async def test_the_owner_evicts_and_a_select_through_the_other_worker_compiles_it_again(worker, tmp_path):
    worker.stop()
    worker.env.update(FRESHPLAN_RETENTION_INTERVAL="0.2", FRESHPLAN_PLAN_RETENTION="P30D")
    await worker.restart()
    peer = await start_peer(worker, tmp_path / "peer")
    try:
        async def split():
            a, b = [(await w.get("/healthz"))["owned_partitions"] for w in (worker, peer)]
            return a and b and sorted(a + b) == list(range(worker.settings.partitions))
        for _ in range(300):
            if await split():
                break
            await asyncio.sleep(0.2)
        loaded = await worker.load("atlas.jsonl")
        plan = await peer.select(ATLAS_REQUEST, loaded)      # answered by the owner, wherever it was asked
        owner_url = plan["served_by"]
        owner, other = (worker, peer) if owner_url.endswith(worker.url[-5:]) else (peer, worker)
        await _until(owner, lambda h: h["retention"]["stamped_keys"] == 1)
        later = await worker.publish_events(tick("2026-10-09T09:00:00Z"))

        [evicted] = await worker.records("plan-invalidations", lambda rs: any(r["reason"] == "evicted" for r in rs))
        assert evicted["plan_id"] == plan["plan_id"]
        health = await _until(owner, lambda h: h["counters"].get("plans_evicted") == 1)
        assert health["plans"].get("fresh", 0) == 0 and health["index_edges"] == 0   # the owner indexes it no more
        assert (await other.get("/healthz"))["index_edges"] == 0                      # and nobody else ever did
        again = await other.select(ATLAS_REQUEST, later)     # referred to the owner, which compiles it again
        assert again["served_from"] == "compiled" and again["plan_id"] == plan["plan_id"]
        assert again["served_by"] == owner_url
    finally:
        peer.stop()
