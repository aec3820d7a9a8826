"""Issue 31 through the broker and HTTP API: relevance, the controller's trace, and the scope guard on the request."""

from __future__ import annotations

import asyncio

import orjson

from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from tests.events import envelope

TYPE = "credit.review.continuation"
ASK = ('\npermit(principal, action == Action::"ask", resource)\n'
       'when { principal has tenants && resource has id && principal.tenants.contains(resource.id) };\n')


def scoped_bundle(version: int, **contract_changes) -> tuple[str, dict]:
    """Atlas's `credit` bundle at a new version: analysts may ask only about entities their attributes name."""
    first = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    types = orjson.loads(orjson.dumps(first["decision_types"]))
    types[TYPE].update(ask_scope=True, **contract_changes)
    return "policy-versions", dict(first, event_id=f"credit-v{version}", version=version,
                                   cedar=first["cedar"] + ASK, decision_types=types)


def maya(**attributes) -> tuple[str, dict]:
    return "source-changes", envelope(kind="principal", op="upsert", principal={
        "id": "maya", "roles": ["credit_analyst"], "attributes": {"unit": "corporate-credit", **attributes},
        "delegation_version": 3})


async def test_unrelated_questions_and_entities_out_of_scope_abstain_and_new_rules_recompile(worker):
    fresh = await worker.load("atlas.jsonl")
    pet = await asyncio.wait_for(worker.select(dict(ATLAS_REQUEST, query="Is pet dental insurance covered?"),
                                               fresh), 30)
    assert pet["state"] == "INSUFFICIENT" and pet["stop_reason"] == "no_relevant_evidence"
    assert pet["admitted"] == [] and pet["retrieval"]["trace"][-1]["step"] == "stop"
    assert "investigation-X9" not in orjson.dumps(pet).decode()

    # A catalogue version that scopes the question: maya names no tenant, so she may ask about none.
    fresh = await worker.publish_events(scoped_bundle(2))
    scoped = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
    assert scoped["stop_reason"] == "out_of_scope" and scoped["withheld"] == 0 and scoped["admitted"] == []
    assert scoped["rejected"] == [] and scoped["retrieval"]["trace"] == []
    assert (await worker.get(f"/v1/plans/{pet['plan_id']}"))["status"] == "invalidated"

    # Her attributes now name the entity: the stored plan is invalidated and she is answered as before.
    fresh = await worker.publish_events(maya(tenants=["ATLAS-IN-01"]))
    inside = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
    assert (await worker.get(f"/v1/plans/{scoped['plan_id']}"))["status"] == "invalidated"
    assert inside["stop_reason"] == "escalate" and inside["withheld"] == 1
    assert {a["resource_id"] for a in inside["admitted"]} == {"facility-F102", "workflow-E88", "policy-P3"}

    # A new rewrite rule is catalogue data: it invalidates the plans it could change.
    fresh = await worker.publish_events(scoped_bundle(3, controller={"rewrites": [
        {"when": ["overdraft"], "add": ["facility limit"]}], "min_coverage": 0.2}))
    ruled = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
    assert (await worker.get(f"/v1/plans/{inside['plan_id']}"))["status"] == "invalidated"
    assert ruled["plan_id"] != inside["plan_id"] and ruled["retrieval"]["retrievals"] >= 1
