"""Refusals in an entity lane are dead-lettered even when the lane's owner dies first, and not twice once reported."""

from __future__ import annotations

import signal

import orjson
import pytest

from schemas.plan_partition import plan_partition
from tests.agents.test_shards import ATLAS, _shard, _split
from tests.conftest import ATLAS_REQUEST, eventually, launch, start_peer
from tests.events import resource

pytestmark = pytest.mark.timeout(150)


def _keyed_to(partition: int, stem: str) -> bytes:
    """A record key the producer's partitioner puts on this `source-changes` partition (of 2)."""
    return next(k for i in range(1000) if plan_partition(k := f"{stem}-{i}", 2) == partition).encode()


def _refused(rid: str, entity: str, key: bytes) -> tuple[str, bytes, bytes]:
    """A resource change its source may not assert under the Atlas bundle (class_not_allowed_for_source)."""
    topic, doc = resource(rid, entity=entity, cls="facility_record")
    return topic, key, orjson.dumps(doc)


def _malformed(rid: str, entity: str, key: bytes) -> tuple[str, bytes, bytes]:
    """A resource change a glance routes to its entity's lane that the full decode refuses (schema_violation):
    refused whoever judges it, whatever the policy."""
    topic, doc = resource(rid, entity=entity)
    doc["resource"]["tokens"] = "many"
    return topic, key, orjson.dumps(doc)


def _letters_of(records: list[dict], offsets: set[tuple[int, int]]) -> list[dict]:
    return [r for r in records if (r["partition"], r["offset"]) in offsets]


async def test_a_refusal_its_lane_owner_died_before_applying_is_dead_lettered_by_the_next_owner(worker, tmp_path):
    await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
    peer = await start_peer(worker, tmp_path / "peer")
    try:
        atlas_owner, other = await _split(worker, peer)
        routed_by_other = 1 - plan_partition(ATLAS, 2)  # the survivor routes it to the dead owner's lane
        # Frozen, the owner applies nothing of its lane: the refusal reaches the lane, then the owner dies.
        atlas_owner.proc.send_signal(signal.SIGSTOP)
        routed_before = (await other.get("/healthz"))["routing"]["routed"]
        key = _keyed_to(routed_by_other, "orphan")
        await other.publish([_refused("orphan-refusal", ATLAS, key)])

        async def routed():
            return (await other.get("/healthz"))["routing"]["routed"] > routed_before
        await eventually(routed, what="the survivor routing the refusal")
        atlas_owner.kill()
        letters = await other.records("dead-letters", lambda rs: any(r["_key"] == key for r in rs), timeout=90)
        assert [r["error_class"] for r in letters if r["_key"] == key] == ["class_not_allowed_for_source"]
        counters = (await other.get("/healthz"))["counters"]
        assert counters.get("shards_restored", 0) >= 1, counters
    finally:
        for w in (worker, peer):
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
        peer.stop()


async def test_a_refusal_its_owner_reported_is_not_dead_lettered_again_by_the_worker_that_gains_its_lane(
        worker, tmp_path):
    await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
    peer = await start_peer(worker, tmp_path / "peer")
    try:
        atlas_owner, other = await _split(worker, peer)
        key = b"reported-refusal"  # its letter, and the marker's below, land on one dead-letters partition
        await other.publish([_malformed("reported-refusal", ATLAS, key)])
        records = await other.records("dead-letters", lambda rs: any(r["_key"] == key for r in rs))
        partition, offset = next((r["partition"], r["offset"]) for r in records if r["_key"] == key)
        lane = str(plan_partition(ATLAS, 2))

        async def reported():
            lanes = (await atlas_owner.get("/healthz"))["routing"]["lane_reports"]["reported"]
            return lanes.get(lane, {}).get(str(partition), 0) > offset
        await eventually(reported, what="the lane's owner reporting past the refusal")
        restored = (await other.get("/healthz"))["counters"].get("shards_restored", 0)
        atlas_owner.kill()

        async def gained():
            return (await other.get("/healthz"))["counters"].get("shards_restored", 0) > restored
        await eventually(gained, timeout=90, what="the survivor restoring the dead owner's lane")
        await other.publish([_malformed("marker", ATLAS, key)])  # dead-lettered after whatever the restore sent
        records = await other.records("dead-letters", lambda rs: sum(r["_key"] == key for r in rs) >= 2)
        assert [r["offset"] for r in records if r["_key"] == key].count(offset) == 1, "dead-lettered again"
    finally:
        peer.stop()


async def test_a_refusal_its_lane_owner_died_before_sending_is_dead_lettered_by_the_copy_promoted(broker, tmp_path):
    """FRESHPLAN_STANDBY_REPLICAS=1: the survivor holds a warm copy of the dead owner's lane, so it restores
    nothing; the letter it kept for the owner goes out once the copy is promoted."""
    async with launch(broker, tmp_path / "a", FRESHPLAN_STANDBY_REPLICAS="1") as first:
        await first.select(ATLAS_REQUEST, await first.load("atlas.jsonl"))
        peer = await start_peer(first, tmp_path / "b")
        try:
            atlas_owner, other = await _split(first, peer)

            async def warm():
                return all([(await _shard(w))["standby"]["partitions"] for w in (first, peer)])
            await eventually(warm, what="each worker holding a copy of the other's partition")
            atlas_owner.proc.send_signal(signal.SIGSTOP)  # applies nothing more: never sends the letter
            before = (await other.get("/healthz"))["counters"]
            key = _keyed_to(1 - plan_partition(ATLAS, 2), "kept")  # routed by the survivor into the owner's lane
            await other.publish([_refused("kept-refusal", ATLAS, key)])

            async def kept():
                counters = (await other.get("/healthz"))["counters"]
                return counters.get("dead_letters_left_to_owner", 0) > before.get("dead_letters_left_to_owner", 0)
            await eventually(kept, what="the copy judging the refusal and keeping its letter for the owner")
            atlas_owner.kill()
            letters = await other.records("dead-letters", lambda rs: any(r["_key"] == key for r in rs), timeout=90)
            assert [r["error_class"] for r in letters if r["_key"] == key] == ["class_not_allowed_for_source"]
            after = (await other.get("/healthz"))["counters"]
            assert after.get("shards_restored", 0) == before.get("shards_restored", 0), "restored, not promoted"
        finally:
            for w in (first, peer):
                if w.proc.poll() is None:
                    w.proc.send_signal(signal.SIGCONT)
            peer.stop()
