"""Issue 12's edges through the broker and HTTP API: publish, select, change one input, select again."""

from __future__ import annotations

import asyncio
import itertools

import orjson

from agents.stream.event_apply import EventApplier
from agents.stream.raw_message import RawMessage
from agents.plans.plan_writer import PlanWriter
from agents.web.query import QueryService
from schemas.freshness import read_token
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST, launch
from tests.events import envelope, resource, tick

SCREENING = orjson.loads((SCENARIOS / "screening-request.json").read_bytes())
PAYMENT = orjson.loads((SCENARIOS / "payment-request.json").read_bytes())
SCREENED = "2026-10-05T09:00:00Z"


def bundle(version: int, sources: dict | None, **changes) -> tuple[str, dict]:
    """Atlas's `credit` bundle again, at a new version with these source rules (None: no `sources` at all)."""
    first = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    event = {k: v for k, v in first.items() if k != "sources"}
    event.update(event_id=f"credit-v{version}", version=version, **changes)
    return "policy-versions", event if sources is None else dict(event, sources=sources)


def screening_item(rid: str, **changes) -> tuple[str, dict]:
    body = dict(orjson.loads((SCENARIOS / "screening.jsonl").read_text().splitlines()[-2])["event"]["resource"])
    body.update(id=rid, **changes)
    return "source-changes", envelope(kind="resource", op="upsert", resource=body, occurred_at=SCREENED)


async def test_source_trust_is_on_by_default_and_a_bundle_may_opt_out(worker):
    fresh = await worker.load("atlas.jsonl")  # the shipped bundle names credit-committee for waivers
    fresh = await worker.publish_events(resource("approved-waiver-W2"),
                                        resource("forged-waiver", provenance_group="public-web"))
    named = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
    assert named["state"] == "SUFFICIENT" and "approved-waiver-W2" in {a["resource_id"] for a in named["admitted"]}
    assert {"resource_id": "forged-waiver", "reason": "untrusted_source"} in named["rejected"]
    assert "names no sources" not in worker.log_path.read_text()

    fresh = await worker.publish_events(bundle(2, None))  # no rules: no group may assert an authoritative class
    bare = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
    assert (await worker.get(f"/v1/plans/{named['plan_id']}"))["status"] == "invalidated"
    assert bare["state"] == "INSUFFICIENT" and bare["admitted"] == []
    untrusted = {r["resource_id"] for r in bare["rejected"] if r["reason"] == "untrusted_source"}
    assert {"approved-waiver-W2", "forged-waiver", "facility-F102", "workflow-E88", "policy-P3"} <= untrusted
    warning = [line for line in worker.log_path.read_text().splitlines() if "names no sources" in line]
    assert len(warning) == 1 and "credit v2" in warning[0] and "approved_waiver" in warning[0]

    fresh = await worker.publish_events(bundle(3, None, source_trust=False))  # an explicit opt-out
    opted_out = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
    assert opted_out["state"] == "SUFFICIENT" and opted_out["admitted"]
    assert not any(r["reason"] == "untrusted_source" for r in opted_out["rejected"])
    assert not any("credit v3" in line for line in worker.log_path.read_text().splitlines()
                   if "names no sources" in line)


async def test_a_hidden_refutation_blocks_and_its_removal_unblocks(worker):
    fresh = await worker.load("screening.jsonl")
    clear = await asyncio.wait_for(worker.select(SCREENING, fresh), 30)
    assert clear["state"] == "SUFFICIENT"
    hit = {"allowed_roles": ["ap_manager"], "allowed_purposes": ["invoice-hold-review"], "authority": 0.9}
    fresh = await worker.publish_events(screening_item(
        "sanctions-hit-9", supports=[], contradicts=["screening_clear"], sensitivity="restricted",
        provenance_group="sanctions-vendor", content="Possible sanctions match.", attributes=hit))
    blocked = await asyncio.wait_for(worker.select(SCREENING, fresh), 30)
    assert (await worker.get(f"/v1/plans/{clear['plan_id']}"))["status"] == "invalidated"
    assert blocked["state"] == "ENTITLEMENT_BLOCK" and blocked["withheld"] == 1
    assert blocked["stop_reason"] == "escalate" and "sanctions-hit-9" not in orjson.dumps(blocked).decode()
    fresh = await worker.publish_events(("source-changes", envelope(kind="resource", op="delete",
                                                                    resource={"id": "sanctions-hit-9"})))
    assert (await asyncio.wait_for(worker.select(SCREENING, fresh), 30))["state"] == "SUFFICIENT"


async def test_a_question_naming_another_tenant_abstains_even_once_the_tenant_is_new(worker):
    fresh = await worker.load("atlas.jsonl")
    boreal = await asyncio.wait_for(worker.select(dict(ATLAS_REQUEST, query="What is Boreal's travel class "
                                                       "rule?"), fresh), 30)
    assert boreal["state"] == "INSUFFICIENT" and boreal["stop_reason"] == "out_of_scope"
    assert boreal["admitted"] == [] and "BOREAL-UK-02" not in orjson.dumps(boreal).decode()
    ask = dict(ATLAS_REQUEST, query="Does the Cinder travel rule apply here?")
    before = await asyncio.wait_for(worker.select(ask, fresh), 30)
    assert before["stop_reason"] != "out_of_scope"  # no entity is called Cinder yet
    fresh = await worker.publish_events(("source-changes", envelope(kind="entity", op="upsert", entity={
        "id": "CINDER-CA-03", "aliases": ["Cinder"]})))
    after = await asyncio.wait_for(worker.select(ask, fresh), 30)
    assert (await worker.get(f"/v1/plans/{before['plan_id']}"))["status"] == "invalidated"
    assert after["stop_reason"] == "out_of_scope" and "CINDER-CA-03" not in orjson.dumps(after).decode()


async def test_a_reconfirmed_record_ages_from_its_confirmation(worker):
    fresh = await worker.load("payment.jsonl")
    live = {k: v for k, v in PAYMENT.items() if k != "decision_time"}
    live["entity"] = "PAYCHG-482"
    row = orjson.loads((SCENARIOS / "payment.jsonl").read_text().splitlines()[8])["event"]["resource"]
    assert row["id"] == "approval-registry-482"
    confirm = ("source-changes", dict(envelope(kind="resource", op="upsert", resource=dict(row, version=2)),
                                      occurred_at="2026-09-01T13:30:00Z"))
    fresh = await worker.publish_events(confirm, tick("2026-09-01T13:30:00Z"))
    confirmed = await asyncio.wait_for(worker.select(live, fresh), 30)
    # Written at 12:00 with valid_from 12:00, confirmed at 13:30: PT60M counts from 13:30.
    assert confirmed["state"] == "SUFFICIENT" and confirmed["stop_reason"] == "contract_satisfied"
    assert confirmed["valid_until"] == "2026-09-01T14:30:01Z"
    assert confirmed["decision"]["final"]["expected_loss"] == round(confirmed["decision"]["final"]["expected_loss"], 6)
    fresh = await worker.publish_events(tick("2026-09-01T14:31:00Z"))
    stale = await asyncio.wait_for(worker.select(live, fresh), 30)
    status = await worker.get(f"/v1/plans/{confirmed['plan_id']}")
    assert status["status"] == "invalidated" and status["reason"] == "time_passed"
    assert stale["state"] == "INSUFFICIENT"
    assert {"resource_id": "approval-registry-482", "reason": "stale"} in stale["rejected"]


async def test_a_plan_id_that_comes_back_keeps_each_invalidation(worker):
    fresh = await worker.load("atlas.jsonl")
    a = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
    first = resource("approved-waiver-W2")
    fresh = await worker.publish_events(first)
    b = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
    fresh = await worker.publish_events(("source-changes", envelope(kind="resource", op="delete",
                                                                    resource={"id": "approved-waiver-W2"})))
    again = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
    assert b["plan_id"] != a["plan_id"] and again["plan_id"] == a["plan_id"]
    back = await worker.get(f"/v1/plans/{a['plan_id']}")
    assert back["status"] == "fresh" and [h["cause"]["event_id"] for h in back["history"]] == [first[1]["event_id"]]
    second = resource("approved-waiver-W2", version=2)
    fresh = await worker.publish_events(second)
    await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
    latest = await worker.get(f"/v1/plans/{a['plan_id']}")
    assert latest["status"] == "invalidated" and latest["cause"]["event_id"] == second[1]["event_id"]
    assert [h["cause"]["event_id"] for h in latest["history"]] == [first[1]["event_id"], second[1]["event_id"]]
    assert latest["history"][0]["successor_plan_id"] == b["plan_id"]


async def test_a_plan_held_in_memory_never_outlives_its_invalidation(worker):
    fresh = await worker.load("atlas.jsonl")
    plan = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
    for version in range(2, 12):
        await asyncio.wait_for(_held_in_memory(worker, ATLAS_REQUEST, fresh, plan["plan_id"]), 60)
        # An admitted record changes; a select as fresh as the change must not get the held plan.
        fresh = await worker.publish_events(resource("waiver-W2", version=version, content=f"Waiver v{version}."))
        after = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
        assert after["plan_id"] != plan["plan_id"]
        assert (await worker.get(f"/v1/plans/{plan['plan_id']}"))["status"] == "invalidated"
        plan = after
    assert (await worker.get("/healthz"))["counters"].get("head_cache_disagreements", 0) == 0


async def test_a_name_held_in_memory_follows_an_alias_change(worker):
    fresh = await worker.load("atlas.jsonl")
    canonical = dict(ATLAS_REQUEST, entity="ATLAS-IN-01")  # its plan survives the alias change below
    by_alias = dict(ATLAS_REQUEST, entity="Atlas")  # an alias of ATLAS-IN-01: the same plan key
    first = await asyncio.wait_for(worker.select(canonical, fresh), 30)
    assert (await worker.select(by_alias, fresh))["plan_id"] == first["plan_id"]
    assert (await worker.select(by_alias, fresh))["plan_id"] == first["plan_id"]  # name and plan held
    fresh = await worker.publish_events(("source-changes", envelope(kind="entity", op="upsert",
                                                                    entity={"id": "ATLAS-IN-01",
                                                                            "aliases": ["Atlas India"]})))
    assert (await asyncio.wait_for(worker.select(canonical, fresh), 30))["plan_id"]  # the key has a head
    refused = await asyncio.wait_for(worker.select(by_alias, fresh, expect=404), 30)
    assert refused["error"]["code"] == "unknown_entity"


async def test_a_plan_announced_before_its_successor_is_not_served_from_memory(broker, tmp_path):
    async with launch(broker, tmp_path, FRESHPLAN_EAGER_RECOMPILE_LIMIT="0") as worker:  # announce first, always
        fresh = await worker.load("atlas.jsonl")
        plan = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
        for version in range(2, 6):
            await asyncio.wait_for(_held_in_memory(worker, ATLAS_REQUEST, fresh, plan["plan_id"]), 60)
            fresh = await worker.publish_events(resource("waiver-W2", version=version, content=f"Waiver v{version}."))
            after = await asyncio.wait_for(worker.select(ATLAS_REQUEST, fresh), 30)
            assert after["plan_id"] != plan["plan_id"]
            plan = after


async def _held_in_memory(worker, request: dict, fresh: str, plan_id: str) -> None:
    """Select until an answer comes from memory (a fill or the position can lag a commit), always this plan."""
    before = (await worker.get("/healthz"))["counters"].get("selects.held", 0)
    for _ in range(50):
        assert (await worker.select(request, fresh))["plan_id"] == plan_id
        if (await worker.get("/healthz"))["counters"].get("selects.held", 0) > before:
            return
    raise AssertionError("no select was answered from memory")


def test_a_token_served_from_memory_never_names_a_state_the_plan_was_stale_at(tmp_path):
    # Unit test of the worker's wiring: the replica's offsets reach the event loop only once its
    # batch committed and the loop ran again, while the heads that batch stored are shown at once.
    state = LocalState.open(tmp_path / "f.duckdb")
    applier = EventApplier(state, PlanWriter(state, lambda name: name))
    offsets = itertools.count()

    def apply(*events):
        applier.apply([RawMessage(topic, 0, next(offsets), b"k", orjson.dumps(event)) for topic, event in events])
        return state.store.next_offsets()

    try:
        positions = [apply(*[(i["topic"], i["event"]) for i in
                             map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines())])]
        query = QueryService(state.reader(), applier.plans, position=lambda: positions[0])
        a = query.select(ATLAS_REQUEST)
        positions[0] = apply(resource("approved-waiver-W2"))  # a replaced by b
        b = query.select(ATLAS_REQUEST)
        assert b["plan_id"] != a["plan_id"] and query.select(ATLAS_REQUEST)["plan_id"] == b["plan_id"]
        stale_at = positions[0]
        # The deletion brings a back; the loop has not yet taken the batch's offsets.
        after = apply(("source-changes", envelope(kind="resource", op="delete", resource={"id": "approved-waiver-W2"})))
        again = query.select(ATLAS_REQUEST)
        assert again["plan_id"] == a["plan_id"]
        assert read_token(again["freshness_token"], query.tokens.accepted()).offsets == after != stale_at
        positions[0] = after
        held = query.select(ATLAS_REQUEST)
        assert held["plan_id"] == a["plan_id"]
        assert read_token(held["freshness_token"], query.tokens.accepted()).offsets == after
        assert query.selects["selects.held"] >= 2
    finally:
        state.close()
