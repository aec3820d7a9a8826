"""A poisoned internal lane: records on `entity-changes` or `shared-changes` that are not routed batches are
skipped and counted, and the routed records around them are still applied; the worker keeps going."""

from __future__ import annotations

import pytest

from schemas.routed_batch import RoutedBatch, pack
from tests.conftest import ATLAS_REQUEST
from tests.events import resource

pytestmark = pytest.mark.timeout(180)


def _slot(plan: dict, proposition: str) -> dict:
    return next(s for s in plan["slots"] if s["proposition"] == proposition)


async def test_records_that_are_not_routed_batches_are_skipped_and_what_follows_is_applied(worker):
    fresh = await worker.load("atlas.jsonl")
    await worker.select(ATLAS_REQUEST, fresh)
    before = (await worker.get("/healthz"))["routing"]
    poison = [b"", b"{not a batch", b"\x07" + pack(RoutedBatch(0, 0, 1, ()))[1:],  # unknown framing version
              pack(RoutedBatch(0, 5, 2, ())),  # a span that is not one
              pack(RoutedBatch(0, 0, 10, ()))[:-1] + b"\x01"]  # a frame cut short
    await worker.publish([(lane, b"x", value) for lane in ("shared-changes", "entity-changes") for value in poison])
    fresh = await worker.publish_events(resource("approved-waiver-W2"))
    after = await worker.select(ATLAS_REQUEST, fresh)  # routed and applied behind the poison
    assert _slot(after, "waiver_valid")["state"] == "supported"
    health = await worker.get("/healthz")
    skipped = health["routing"]["lane_records_skipped"] - before["lane_records_skipped"]
    assert skipped >= len(poison), health["routing"]  # the entity lane's share reaches its holder (every lane here)
    assert health["routing"]["failures"] == 0 and worker.proc.poll() is None
    assert "lane_record_invalid" in worker.log_path.read_text()
