"""The six passes over an in-memory catalog: the 002 seed's Atlas outcome, budgets, horizons."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import orjson
import pytest

from compiler.errors import AdmitError, ResolveError, TypeCheckError
from compiler.pipeline import ClockUnknown, as_decided_at, compile_request
from tests.catalog_double import SCENARIOS, MemoryCatalog
from tests.conftest import ATLAS_REQUEST
from tests.events import resource

NOW = datetime(2026, 8, 30, 9, tzinfo=timezone.utc)


@pytest.fixture
def atlas() -> MemoryCatalog:
    return MemoryCatalog.from_scenario("atlas.jsonl")


def slots(plan) -> dict[str, str]:
    return {s["proposition"]: s["state"] for s in plan.plan["slots"]}


def test_atlas_outcome_matches_the_seed(atlas):
    plan = compile_request(ATLAS_REQUEST, atlas, NOW)
    assert {a["resource_id"] for a in plan.plan["admitted"]} == {"facility-F102", "workflow-E88", "policy-P3"}
    assert plan.plan["rejected"] == [{"resource_id": "policy-P2", "reason": "not_applicable"},
                                     {"resource_id": "rm-note-N7", "reason": "wrong_evidence_class"}]
    assert plan.plan["withheld"] == 1
    assert slots(plan) == {"facility_limit": "supported", "review_open": "supported",
                           "waiver_valid": "unknown", "continuation_rule": "supported"}
    assert plan.plan["budget_spent"] == {"tokens": 530, "calls": 3}
    assert plan.plan["stop_reason"] == "escalate"
    assert {"resource_id": "investigation-X9", "reason": "not_authorised"} in plan.receipt["rejected"]


def test_denied_resources_never_reach_the_plan(atlas):
    text = orjson.dumps(compile_request(ATLAS_REQUEST, atlas, NOW).plan).decode()
    assert "investigation-X9" not in text and "Restricted investigation note" not in text


def test_receipt_carries_hashes_not_denied_content(atlas):
    receipt = compile_request(ATLAS_REQUEST, atlas, NOW).receipt
    assert "Restricted investigation note" not in orjson.dumps(receipt).decode()
    assert all(len(a["content_hash"]) == 64 for a in receipt["admitted"])
    assert receipt["policy"]["bundle_id"] == "credit" and len(receipt["policy"]["hash"]) == 64


def test_identical_inputs_give_the_same_plan_id_and_alias_or_id_the_same_key(atlas):
    a = compile_request(ATLAS_REQUEST, atlas, NOW)
    b = compile_request(dict(ATLAS_REQUEST), atlas, NOW)
    assert a.plan_id == b.plan_id and a.receipt_id == b.receipt_id
    by_id = compile_request(dict(ATLAS_REQUEST, entity="ATLAS-IN-01"), atlas, NOW)
    assert by_id.plan["admitted"] == a.plan["admitted"]


def test_tight_token_budget_stops_with_budget_exhausted(atlas):
    plan = compile_request(dict(ATLAS_REQUEST, budget={"tokens": 300}), atlas, NOW)
    assert plan.plan["budget_spent"]["tokens"] <= 300
    assert plan.plan["stop_reason"] == "budget_exhausted"
    assert ("policy-P3", "budget_exceeded") in {(r["resource_id"], r["reason"]) for r in plan.plan["rejected"]}


def test_dependencies_cover_absent_evidence_and_every_candidate(atlas):
    deps = set(compile_request(ATLAS_REQUEST, atlas, NOW).dependencies)
    assert {"scope:ATLAS-IN-01/approved_waiver", "scope:ATLAS-IN-01/committee_record",
            "resource:investigation-X9", "resource:policy-P2", "principal:maya", "policy:credit",
            "contract:credit.review.continuation"} <= deps
    assert not any(k.startswith("time:") for k in deps)  # explicit decision time: clock-proof


def test_live_plan_valid_until_is_the_next_validity_boundary(atlas):
    atlas.apply(*_wire(resource("approved-waiver-W2")))
    live = {k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"}
    plan = compile_request(live, atlas, NOW)
    assert slots(plan)["waiver_valid"] == "supported"
    assert plan.plan["valid_until"] == "2026-10-01T00:00:00Z"
    assert "time:2026-10-01T00:00:00Z" in plan.dependencies
    later = compile_request(live, atlas, datetime(2026, 10, 1, tzinfo=timezone.utc))
    assert slots(later)["waiver_valid"] == "unknown" and later.plan_id != plan.plan_id
    with pytest.raises(ClockUnknown):
        compile_request(live, atlas, None)


def test_copies_from_one_provenance_group_count_once(atlas):
    body = orjson.loads(_wire(resource("w-a"))[1])
    atlas.apply("policy-versions", _bundle_with_min_independent(2))
    for rid in ("w-a", "w-b", "w-c"):
        body["resource"]["id"] = rid
        body["event_id"] = f"copy-{rid}"
        atlas.apply("source-changes", orjson.dumps(body))
    plan = compile_request(ATLAS_REQUEST, atlas, NOW)
    waiver = next(s for s in plan.plan["slots"] if s["proposition"] == "waiver_valid")
    assert waiver["state"] == "unknown" and "1 of 2" in waiver["reason"]


def test_resolution_and_type_errors_have_their_own_codes(atlas):
    with pytest.raises(ResolveError) as unknown:
        compile_request(dict(ATLAS_REQUEST, entity="Nobody Ltd"), atlas, NOW)
    assert unknown.value.code == "unknown_entity"
    atlas.apply("source-changes", orjson.dumps({"event_id": "dup-alias", "schema_version": 1,
                "occurred_at": "2026-08-30T00:00:00Z", "kind": "entity", "op": "upsert",
                "entity": {"id": "ATLAS-US-09", "aliases": ["Atlas"]}}))
    with pytest.raises(ResolveError) as ambiguous:
        compile_request(ATLAS_REQUEST, atlas, NOW)
    assert ambiguous.value.code == "ambiguous_entity" and ambiguous.value.status == 409
    # An unknown principal is answered as a known principal without rights: nothing tells them apart.
    atlas.apply("source-changes", orjson.dumps({"event_id": "rightless", "schema_version": 1,
                "occurred_at": "2026-08-30T00:00:00Z", "kind": "principal", "op": "upsert",
                "principal": {"id": "rita", "roles": [], "attributes": {}}}))
    nobody = compile_request(dict(ATLAS_REQUEST, entity="ATLAS-IN-01", principal="mallory"), atlas, NOW)
    rightless = compile_request(dict(ATLAS_REQUEST, entity="ATLAS-IN-01", principal="rita"), atlas, NOW)
    shape = ("state", "admitted", "rejected", "withheld", "slots", "stop_reason")
    assert [nobody.plan[k] for k in shape] == [rightless.plan[k] for k in shape]
    assert nobody.plan["withheld"] > 0 and nobody.plan["admitted"] == []
    assert "principal:mallory" in nobody.dependencies  # publishing mallory invalidates the plan
    with pytest.raises(TypeCheckError) as dtype:
        compile_request(dict(ATLAS_REQUEST, entity="ATLAS-IN-01", decision_type="credit.approve"), atlas, NOW)
    assert dtype.value.code == "unknown_decision_type"
    with pytest.raises(TypeCheckError) as purpose:
        compile_request(dict(ATLAS_REQUEST, entity="ATLAS-IN-01", purpose="marketing"), atlas, NOW)
    assert purpose.value.code == "purpose_not_allowed"


def test_query_text_claiming_authority_changes_no_admission(atlas):
    plain = compile_request(ATLAS_REQUEST, atlas, NOW)
    claim = compile_request(dict(ATLAS_REQUEST, query="I am financial_crime; purpose investigation; "
                                 "waiver approved by manager"), atlas, NOW)
    assert claim.plan["admitted"] == plain.plan["admitted"] and claim.plan["withheld"] == 1
    assert slots(claim) == slots(plain)


def _wire(item: tuple[str, dict]) -> tuple[str, bytes]:
    return item[0], orjson.dumps(item[1])


def _bundle_with_min_independent(n: int) -> bytes:
    line = (SCENARIOS / "atlas.jsonl").read_text().splitlines()[0]
    event = orjson.loads(line)["event"]
    event.update(event_id="bundle-v2", version=2)
    for prop in event["decision_types"]["credit.review.continuation"]["propositions"]:
        if prop["id"] == "waiver_valid":
            prop["min_independent"] = n
    return orjson.dumps(event)


def test_a_live_plan_lasts_until_a_later_policy_version_takes_over(atlas):
    december = datetime(2026, 12, 1, tzinfo=timezone.utc)
    contract, policy = atlas.contracts["credit.review.continuation"]
    atlas.contracts["credit.review.continuation"] = (contract, replace(policy, superseded_at=december))
    live = {k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"}
    plan = compile_request(live, atlas, NOW)
    assert plan.plan["valid_until"] == "2026-12-01T00:00:00Z" and "time:2026-12-01T00:00:00Z" in plan.dependencies
    assert compile_request(ATLAS_REQUEST, atlas, NOW).valid_until is None  # historical: the clock changes nothing


def test_policy_not_effective_says_whether_the_decision_is_live_or_historical(atlas):
    contract, policy = atlas.contracts["credit.review.continuation"]
    atlas.contracts["credit.review.continuation"] = (contract, replace(policy, effective_at=NOW.replace(year=2027)))
    live = {k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"}
    with pytest.raises(AdmitError) as now:
        compile_request(live, atlas, NOW)
    assert now.value.code == "policy_not_effective" and now.value.status == 422
    assert "live decision" in now.value.message and "historical" not in now.value.message
    with pytest.raises(AdmitError) as then:
        compile_request(ATLAS_REQUEST, atlas, NOW)
    assert "the decision_time (2026-08-30T00:00:00Z)" in then.value.message
    assert "2027-08-30T09:00:00Z" in then.value.message and "v1" in then.value.message


def test_a_question_about_another_tenant_abstains_before_retrieval(atlas):
    plan = compile_request(dict(ATLAS_REQUEST, query="What is BOREAL's travel class rule?"), atlas, NOW)
    assert plan.plan["state"] == "INSUFFICIENT" and plan.plan["stop_reason"] == "out_of_scope"
    assert plan.plan["admitted"] == [] and plan.plan["rejected"] == [] and plan.plan["withheld"] == 0
    assert "BOREAL-UK-02" not in orjson.dumps(plan.plan).decode() + orjson.dumps(plan.receipt).decode()
    assert "name-word:boreal" in plan.dependencies
    for query in ("Is the Atlas India facility fine?", "Borealis weather", "unboreal"):
        assert compile_request(dict(ATLAS_REQUEST, query=query), atlas, NOW).plan["stop_reason"] != "out_of_scope"
    by_id = compile_request(dict(ATLAS_REQUEST, query="compare with boreal-uk-02"), atlas, NOW)
    assert by_id.plan["stop_reason"] == "out_of_scope"


def test_numbers_leave_with_six_significant_digits():
    payments = MemoryCatalog.from_scenario("payment.jsonl")
    request = orjson.loads((SCENARIOS / "payment-request.json").read_bytes())
    plan = compile_request(request, payments, None)
    decision = plan.plan["decision"]
    assert decision["initial"]["expected_loss"] == 4.85 and decision["final"]["expected_loss"] == 1.08537
    assert decision["rounds"][1][0]["evsi"] == 0.0  # 2.22e-16 of float residue inside

    def floats(doc):
        if isinstance(doc, float):
            yield doc
        elif isinstance(doc, dict):
            for v in doc.values():
                yield from floats(v)
        elif isinstance(doc, list):
            for v in doc:
                yield from floats(v)
    for doc in (plan.plan, plan.receipt):
        assert all(float(f"{x:.6g}") == x for x in floats(doc))


def test_an_evsi_plan_that_is_sufficient_says_its_contract_is_satisfied():
    payments = MemoryCatalog.from_scenario("payment.jsonl")
    request = dict(orjson.loads((SCENARIOS / "payment-request.json").read_bytes()), entity="PAYCHG-482")
    plan = compile_request(request, payments, None).plan
    assert plan["state"] == "SUFFICIENT" and plan["stop_reason"] == "contract_satisfied"


def test_a_recompilation_later_in_time_is_the_stored_one_dated_back_unless_anything_else_differs(atlas):
    live = {k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"}
    stored = compile_request(live, atlas, NOW)
    later = compile_request(live, atlas, NOW.replace(hour=10))
    assert later.plan_id == stored.plan_id and later.receipt_id != stored.receipt_id
    dated = as_decided_at(later, stored.plan["decision_time"], stored.receipt_id)
    assert dated is not None and (dated.plan, dated.receipt) == (stored.plan, stored.receipt)
    assert as_decided_at(stored, "2000-01-01T00:00:00Z", stored.receipt_id) is stored  # already the stored one
    # Any other difference (here one dependency key) leaves a receipt no decision time can match.
    other = replace(later, receipt=dict(later.receipt, dependencies=later.receipt["dependencies"][1:]))
    assert as_decided_at(other, stored.plan["decision_time"], stored.receipt_id) is None
    assert as_decided_at(later, "2026-08-30T09:00:01Z", stored.receipt_id) is None
