"""Refusals in an entity lane are dead-lettered even when the lane's owner dies first, and not twice once reported."""

from __future__ import annotations

import signal

import orjson
import pytest

from schemas.plan_partition import plan_partition
from tests.agents.test_shards import ATLAS, _split
from tests.conftest import ATLAS_REQUEST, eventually, start_peer
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
