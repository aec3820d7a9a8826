"""Two workers on one group: partitions are shared, any worker answers, a hand-over loses nothing."""

from __future__ import annotations

import asyncio

import pytest

from streams.settings import INPUT_TOPICS
from tests.conftest import ATLAS_REQUEST, start_peer
from tests.events import resource, revoke_role

pytestmark = pytest.mark.timeout(240)


async def _until(check, timeout: float = 60.0, what: str = "condition"):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.2)


async def test_second_worker_shares_partitions_and_takes_over_without_loss(worker, tmp_path):
    fresh = await worker.load("atlas.jsonl")
    first = await worker.select(ATLAS_REQUEST, fresh)
    peer = await start_peer(worker, tmp_path / "peer")
    try:
        async def shared():
            a, b = (await worker.get("/healthz"))["duty"], (await peer.get("/healthz"))["duty"]
            covered = all(sorted(a.get(t, []) + b.get(t, [])) == list(range(worker.settings.partitions))
                          for t in INPUT_TOPICS)
            return covered and a and b
        await _until(shared, what="both workers owning input partitions")

        # The peer learned the plan from the `plans` topic and answers it from its own replica.
        await _until(lambda: _known(peer, first["plan_id"]), what="peer adopting the plan")
        assert (await peer.select(ATLAS_REQUEST, fresh))["plan_id"] == first["plan_id"]

        waiver_token = await worker.publish_events(resource("approved-waiver-W2"))
        announced = await worker.records("plan-invalidations",
                                         lambda rs: any(r["plan_id"] == first["plan_id"] for r in rs))
        [cause] = {r["cause"]["event_id"] for r in announced if r["plan_id"] == first["plan_id"]}
        successor = next(r["successor_plan_id"] for r in announced if r["plan_id"] == first["plan_id"])
        for w in (worker, peer):   # whichever worker is asked, the answer reflects the waiver
            plan = await w.select(ATLAS_REQUEST, waiver_token)
            assert plan["plan_id"] == successor
            assert {s["proposition"]: s["state"] for s in plan["slots"]}["waiver_valid"] == "supported"

        worker.stop()   # the first worker leaves; the peer must take over its partitions
        await _until(lambda: _owns_all(peer), what="peer owning every partition")
        revoked = await peer.publish_events(revoke_role("maya", "credit_analyst"))
        announced = await peer.records("plan-invalidations", lambda rs: any(r["plan_id"] == successor for r in rs))
        assert any(r["cause"]["topic"].endswith("revocations") for r in announced if r["plan_id"] == successor)
        plan = await peer.select(ATLAS_REQUEST, revoked)
        assert plan["admitted"] == [] and plan["plan_id"] != successor
        assert cause.startswith("test-")
        # At least once, and a repeat (both workers owning a partition for a moment during a
        # rebalance) is the same record: same plan, same cause, same successor.
        records = await peer.everything("plan-invalidations")
        by_cause: dict = {}
        for r in records:
            by_cause.setdefault((r["plan_id"], r["cause"]["event_id"]), set()).add(
                (r["cause"]["topic"], r["cause"]["partition"], r["cause"]["offset"], r["successor_plan_id"]))
        assert (first["plan_id"], cause) in by_cause and all(len(v) == 1 for v in by_cause.values())
    finally:
        peer.stop()


async def _known(peer, plan_id: str) -> bool:
    async with peer.http.get(f"{peer.url}/v1/plans/{plan_id}") as resp:
        return resp.status == 200 and (await resp.json())["status"] == "fresh"


async def _owns_all(peer) -> bool:
    duty = (await peer.get("/healthz"))["duty"]
    return all(duty.get(t) == list(range(peer.settings.partitions)) for t in INPUT_TOPICS)
