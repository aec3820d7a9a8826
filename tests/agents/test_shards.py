"""Resources partitioned by entity, through the broker: each worker holds its shard, a gained one is restored."""

from __future__ import annotations

import pytest

from schemas.plan_partition import plan_partition
from tests.conftest import ATLAS_REQUEST, eventually, freshest, launch, start_peer
from tests.events import resource

pytestmark = pytest.mark.timeout(150)

ATLAS, BOREAL = "ATLAS-IN-01", "BOREAL-UK-02"  # entity partitions 1 and 0 of 2
BOREAL_REQUEST = dict(ATLAS_REQUEST, entity="Boreal", query="Can the Boreal facility continue under the waiver?")


async def _shard(w) -> dict:
    return (await w.get("/healthz"))["shard"]


async def _split(a, b) -> tuple:
    """(worker holding Atlas's partition, the other) once the two hold one partition each, none restoring."""
    async def split():
        x, y = await _shard(a), await _shard(b)
        held = [sorted(s["partitions"]["plans"]) for s in (x, y)]
        plans = [sorted(s["owned_partitions"]) for s in (x, y)]
        return (len(held[0]) == len(held[1]) == 1 and sorted(held[0] + held[1]) == [0, 1] and held == plans
                and not x["restoring"] and not y["restoring"])
    await eventually(split, what="the two workers holding one entity partition each")
    if plan_partition(ATLAS, 2) in (await _shard(a))["partitions"]["plans"]:
        return a, b
    return b, a


async def test_each_worker_holds_only_its_shard_and_a_gained_shard_is_restored_whole(worker, tmp_path):
    first = freshest(await worker.load("atlas.jsonl"),
                     await worker.publish_events(resource("boreal-waiver-B1", entity=BOREAL)))
    await worker.select(ATLAS_REQUEST, first)
    alone = await _shard(worker)
    assert sorted(alone["partitions"]["plans"]) == [0, 1]
    total = alone["resources"]
    assert alone["by_partition"]["0"] >= 1 and alone["by_partition"]["1"] >= 1, alone
    async with worker.http.get(f"{worker.url}/metrics") as resp:
        text = await resp.text()
    for partition in ("0", "1"):
        line = f'freshplan_shard_resources{{partition="{partition}"}} {float(alone["by_partition"][partition])}'
        assert line in text, text

    peer = await start_peer(worker, tmp_path / "peer")
    try:
        atlas_owner, boreal_owner = await _split(worker, peer)
        # Six more resources on each side; one resource moves from Atlas to Boreal.
        more = [resource(f"shard-{e}-{i}", entity=e) for e in (ATLAS, BOREAL) for i in range(6)]
        token = freshest(first, await worker.publish_events(*more, resource("mover", entity=ATLAS)))
        await atlas_owner.select(ATLAS_REQUEST, token)
        token = freshest(token, await worker.publish_events(resource("mover", entity=BOREAL, version=2)))
        for w in (atlas_owner, boreal_owner):  # each answers both entities (the other's by forwarding)
            for request in (ATLAS_REQUEST, BOREAL_REQUEST):
                assert (await w.select(request, token))["admitted"]

        async def shards_settled():
            a, b = await _shard(atlas_owner), await _shard(boreal_owner)
            return (a, b) if a["resources"] + b["resources"] == total + 13 else None
        a, b = await eventually(shards_settled, what="every resource held by exactly one worker")
        assert set(a["by_partition"]) == {str(plan_partition(ATLAS, 2))}, a
        assert set(b["by_partition"]) == {str(plan_partition(BOREAL, 2))}, b
        assert a["resources"] == alone["by_partition"][str(plan_partition(ATLAS, 2))] + 6  # the mover left
        assert b["resources"] == alone["by_partition"][str(plan_partition(BOREAL, 2))] + 7
        health = await atlas_owner.get("/healthz")
        # Routed: the other shard's resources never reach this worker (before routing it decoded and dropped them).
        assert health["counters"].get("resources_of_other_shards", 0) == 0, health["counters"]
        assert health["routing"]["lanes"] == [plan_partition(ATLAS, 2)], health["routing"]

        # The Boreal owner stops: the survivor restores its partition from its lane, mover included.
        boreal_owner.stop()
        survivor = atlas_owner

        async def whole():
            s = await _shard(survivor)
            return s if sorted(s["partitions"]["plans"]) == [0, 1] and not s["restoring"] else None
        s = await eventually(whole, what="the survivor holding both partitions")
        assert s["resources"] == total + 13, s
        assert s["last_restore"]["partitions"] == [plan_partition(BOREAL, 2)], s
        assert (await survivor.select(BOREAL_REQUEST, token))["admitted"]
    finally:
        peer.stop()


async def test_a_standby_copy_makes_a_gained_partition_ready_without_restoring(broker, tmp_path):
    """FRESHPLAN_STANDBY_REPLICAS=1 on 2 partitions: each worker keeps the other's partition warm."""
    async with launch(broker, tmp_path / "a", FRESHPLAN_STANDBY_REPLICAS="1") as first:
        token = freshest(await first.load("atlas.jsonl"),
                         await first.publish_events(resource("boreal-waiver-B1", entity=BOREAL)))
        await first.select(ATLAS_REQUEST, token)
        total = (await _shard(first))["resources"]
        peer = await start_peer(first, tmp_path / "b")
        try:
            await _split(first, peer)
            token = freshest(token, await first.publish_events(*[resource(f"warm-{e}", entity=e)
                                                                  for e in (ATLAS, BOREAL)]))
            for w in (first, peer):
                assert (await w.select(BOREAL_REQUEST, token))["admitted"]

            async def warm():
                a, b = await _shard(first), await _shard(peer)
                both = [(s["resources"], s["standby"]["resources"]) for s in (a, b)]
                return (a, b) if all(mine + copy == total + 2 for mine, copy in both) else None
            a, b = await eventually(warm, what="both workers holding their shard and a copy of the other's")
            for s in (a, b):
                assert s["standby"]["partitions"] != s["partitions"]["plans"], s
                assert sorted(s["standby"]["partitions"] + s["partitions"]["plans"]) == [0, 1], s
            restored_before = (await first.get("/healthz"))["counters"].get("shards_restored", 0)

            peer.stop()

            async def alone():
                s = await _shard(first)
                return s if sorted(s["partitions"]["plans"]) == [0, 1] else None
            s = await eventually(alone, what="the survivor serving both partitions")
            assert s["resources"] == total + 2 and s["standby"]["partitions"] == [], s
            assert (await first.get("/healthz"))["counters"].get("shards_restored", 0) == restored_before
            assert (await first.select(BOREAL_REQUEST, token))["admitted"]
        finally:
            peer.stop()


async def test_a_worker_merges_what_its_router_sent_without_reading_it_back_and_applies_it_once(worker):
    token = await worker.load("atlas.jsonl")
    await worker.select(ATLAS_REQUEST, token)
    edits = [resource(f"fed-{i}", entity=e) for i in range(10) for e in (ATLAS, BOREAL)]
    token = freshest(token, await worker.publish_events(*edits))
    await worker.select(ATLAS_REQUEST, token)
    health = await worker.get("/healthz")
    routing, counters = health["routing"], health["counters"]
    assert routing["batches_merged_as_sent"] > 0 and routing["failures"] == 0, routing
    # Every routed record applied once: the copy read back from the lane later was skipped, not applied again.
    assert counters["applied.source-changes"] == routing["routed"], counters
    assert not counters.get("redelivered_skipped") and not counters.get("duplicate_events"), counters

    async def passed_over() -> dict:  # the copies read back later are passed over unread, none refused
        routing = (await worker.get("/healthz"))["routing"]
        return routing if routing["merged_batches_passed_unread"] > 0 else {}
    routing = await eventually(passed_over, timeout=30, what="a merged batch read back and passed over")
    assert routing["lane_records_skipped"] == 0, routing
