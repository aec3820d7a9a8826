"""Finding 10: an invalidation caused by a resource the principal may not discover does not name it."""

from __future__ import annotations

import orjson
import pytest

from tests.conftest import ATLAS_REQUEST
from tests.events import envelope

pytestmark = pytest.mark.timeout(180)


async def test_deleting_a_withheld_resource_is_announced_without_its_id(worker):
    loaded = await worker.load("atlas.jsonl")
    plan = await worker.select(ATLAS_REQUEST, loaded)
    assert plan["withheld"] == 1  # investigation-X9: restricted, maya may not use it
    deleted = await worker.publish_events(("source-changes", envelope(kind="resource", op="delete",
                                                                      resource={"id": "investigation-X9"})))
    after = await worker.select(ATLAS_REQUEST, deleted)
    assert after["plan_id"] != plan["plan_id"] and after["withheld"] == 0

    status = await worker.get(f"/v1/plans/{plan['plan_id']}")
    announced = await worker.records("plan-invalidations",
                                     lambda rs: any(r["plan_id"] == plan["plan_id"] for r in rs))
    public = [status["cause"]] + [r["cause"] for r in announced if r["plan_id"] == plan["plan_id"]]
    for cause in public:
        assert cause["dependency_key"] == "resource:withheld" and cause["event_id"] == "withheld"
    assert b"investigation-X9" not in orjson.dumps([status, [{k: v for k, v in r.items() if k != "_key"}
                                                             for r in announced]])

    receipts = await worker.records("receipts", lambda rs: any(r.get("kind") == "invalidation" for r in rs))
    [audit] = [r for r in receipts if r.get("kind") == "invalidation" and r["plan_id"] == plan["plan_id"]]
    assert audit["cause"]["dependency_key"] == "resource:investigation-X9"  # auditors get the full cause


async def test_a_resource_the_plan_names_is_named_in_its_cause(worker):
    loaded = await worker.load("atlas.jsonl")
    plan = await worker.select(ATLAS_REQUEST, loaded)
    assert "policy-P2" in {r["resource_id"] for r in plan["rejected"]}
    deleted = await worker.publish_events(("source-changes", envelope(kind="resource", op="delete",
                                                                      resource={"id": "policy-P2"})))
    await worker.select(ATLAS_REQUEST, deleted)
    status = await worker.get(f"/v1/plans/{plan['plan_id']}")
    assert status["cause"]["dependency_key"] == "resource:policy-P2" and status["cause"]["event_id"] != "withheld"
