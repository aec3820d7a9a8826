"""Crash consistency: SIGKILL while a fan-out is being published loses no invalidation, serves nothing stale."""

from __future__ import annotations

import asyncio

import orjson

from tests.catalog_double import SCENARIOS
from tests.conftest import freshest
from tests.events import envelope

PLANS = 200


async def test_sigkill_mid_fan_out_loses_no_invalidation(worker):
    loaded = await worker.load("atlas.jsonl")
    entities = [("source-changes", envelope(kind="entity", op="upsert", entity={"id": f"CO-{i}", "aliases": []}))
                for i in range(PLANS)]
    fresh = freshest(loaded, await worker.publish_events(*entities))
    requests = [{"decision_type": "credit.review.continuation", "principal": "maya",
                 "purpose": "annual_credit_review", "entity": f"CO-{i}", "budget": {"tokens": 500}}
                for i in range(PLANS)]
    old = {}
    for request in requests:
        plan = await worker.select(request, fresh)
        old[plan["plan_id"]] = request

    bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    body = {k: v for k, v in bundle.items() if k not in ("event_id", "schema_version", "occurred_at")}
    await worker.publish_events(("policy-versions", envelope(**dict(body, version=2))))
    # Kill as soon as the first announcement of the fan-out is visible.
    await worker.records("plan-invalidations", lambda rs: any(r["plan_id"] in old for r in rs), timeout=60)
    worker.kill()

    await worker.restart()
    for request in requests:  # nothing stale in between: every answer already reflects version 2
        assert (await worker.select(request))["plan_id"] not in old
    announced = await worker.records(
        "plan-invalidations", lambda rs: set(old) <= {r["plan_id"] for r in rs}, timeout=60)
    assert {r["plan_id"] for r in announced if r["plan_id"] in old} == set(old)
    assert all(r["cause"]["dependency_key"] in ("policy:credit", "contract:credit.review.continuation")
               for r in announced if r["plan_id"] in old)
    for plan_id, request in list(old.items())[:20]:  # announced first: the status names the successor later
        current = (await worker.select(request))["plan_id"]
        assert (await worker.get(f"/v1/plans/{plan_id}"))["successor_plan_id"] == current
    await asyncio.sleep(0)
