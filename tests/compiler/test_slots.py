"""The 004 seed's sufficiency: four states each reached by changing one input; copies count once."""

from __future__ import annotations

import orjson
import pytest

from compiler.pipeline import compile_request
from compiler.slots import aggregate, noisy_or, settled_stop
from tests.catalog_double import SCENARIOS, MemoryCatalog
from tests.events import envelope

REQUEST = orjson.loads((SCENARIOS / "screening-request.json").read_bytes())
SCREENED = "2026-10-05T09:00:00Z"  # the screening scenario's event time: its facts are confirmed then


@pytest.fixture
def screening() -> MemoryCatalog:
    return MemoryCatalog.from_scenario("screening.jsonl")


def upsert(catalog: MemoryCatalog, rid: str, **changes) -> None:
    body = dict(orjson.loads((SCENARIOS / "screening.jsonl").read_text().splitlines()[-2])["event"]["resource"])
    body.update(id=rid, **changes)
    event = envelope(kind="resource", op="upsert", resource=body, occurred_at=SCREENED)
    catalog.apply("source-changes", orjson.dumps(event))


def state(catalog: MemoryCatalog) -> str:
    return compile_request(REQUEST, catalog, None).plan["state"]


def test_base_case_is_sufficient(screening):
    assert state(screening) == "SUFFICIENT"


def test_missing_screening_is_insufficient(screening):
    screening.apply("source-changes", orjson.dumps(envelope(kind="resource", op="delete",
                                                            resource={"id": "screening-current"})))
    assert state(screening) == "INSUFFICIENT"


def test_strong_refutation_from_another_group_is_a_conflict(screening):
    upsert(screening, "sanctions-alert-22", supports=[], contradicts=["screening_clear"],
           provenance_group="sanctions-vendor", content="Possible sanctions match for Orion Ltd.",
           attributes={"allowed_roles": ["ap_manager"], "allowed_purposes": ["invoice-hold-review"],
                       "authority": 0.9})
    plan = compile_request(REQUEST, screening, None).plan
    slot = next(s for s in plan["slots"] if s["proposition"] == "screening_clear")
    assert plan["state"] == "CONFLICT" and slot["conflict"] and slot["refute"] == 0.9
    assert plan["stop_reason"] == "escalate"


def test_restricted_screening_is_an_entitlement_block_without_disclosure(screening):
    upsert(screening, "screening-current", version=2, sensitivity="restricted")
    plan = compile_request(REQUEST, screening, None).plan
    assert plan["state"] == "ENTITLEMENT_BLOCK" and plan["withheld"] == 1
    assert "screening-current" not in orjson.dumps(plan).decode()


def test_three_copies_from_one_provenance_group_count_once(screening):
    contract, _ = screening.contract("invoice.hold.release")
    goods = next(p for p in contract.propositions if p.id == "goods_accepted")
    copies = [r for r in screening.resources.values() if r.provenance_group == "warehouse-memo"]
    assert len(copies) == 3
    support, _, groups = aggregate(copies, goods)
    assert groups == 1 and support == pytest.approx(0.7) and support < noisy_or([0.7, 0.7, 0.7])
    screening.apply("source-changes", orjson.dumps(envelope(kind="resource", op="delete",
                                                            resource={"id": "receiving-GRN-7731"})))
    plan = compile_request(REQUEST, screening, None).plan
    slot = next(s for s in plan["slots"] if s["proposition"] == "goods_accepted")
    assert slot["state"] == "unknown" and slot["independent_groups"] == 1
    assert plan["state"] == "INSUFFICIENT"


def test_precedence_resolves_disagreement_instead_of_conflict(screening):
    bundle = orjson.loads((SCENARIOS / "screening.jsonl").read_text().splitlines()[0])["event"]
    bundle.update(event_id="bundle-v2", version=2)
    for prop in bundle["decision_types"]["invoice.hold.release"]["propositions"]:
        if prop["id"] == "screening_clear":
            prop["accepted_classes"] = ["screening_result", "sanctions_hit"]
            prop["precedence"] = ["sanctions_hit", "screening_result"]
    # sanctions_hit is now the slot's authoritative class too: the vendor must be named for it.
    bundle["sources"]["sanctions-vendor"] = ["screening_result", "sanctions_hit"]
    screening.apply("policy-versions", orjson.dumps(bundle))
    upsert(screening, "sanctions-hit-22", evidence_class="sanctions_hit", supports=[],
           contradicts=["screening_clear"], provenance_group="sanctions-vendor",
           attributes={"allowed_roles": ["ap_manager"], "allowed_purposes": ["invoice-hold-review"],
                       "authority": 0.9})
    plan = compile_request(REQUEST, screening, None).plan
    slot = next(s for s in plan["slots"] if s["proposition"] == "screening_clear")
    assert slot["state"] == "contradicted" and not slot["conflict"] and "precedence" in slot["reason"]
    assert plan["state"] == "INSUFFICIENT"


HIT = {"allowed_roles": ["ap_manager"], "allowed_purposes": ["invoice-hold-review"], "authority": 0.9}


def test_a_refutation_the_principal_may_not_see_blocks_the_decision(screening):
    assert state(screening) == "SUFFICIENT"
    upsert(screening, "sanctions-hit-9", supports=[], contradicts=["screening_clear"], sensitivity="restricted",
           provenance_group="sanctions-vendor", content="Possible sanctions match.", attributes=HIT)
    plan = compile_request(REQUEST, screening, None).plan
    assert plan["state"] == "ENTITLEMENT_BLOCK" and plan["withheld"] == 1 and plan["stop_reason"] == "escalate"
    assert "sanctions-hit-9" not in orjson.dumps(plan).decode()


def test_entitlement_block_comes_before_conflict(screening):
    upsert(screening, "sanctions-alert-22", supports=[], contradicts=["screening_clear"],
           provenance_group="sanctions-vendor", attributes={"allowed_roles": ["ap_manager"],
                                                            "allowed_purposes": ["invoice-hold-review"],
                                                            "authority": 0.9})
    assert state(screening) == "CONFLICT"
    # From a named source of screening results: an untrusted one would be kept out anyway, blocking nothing.
    upsert(screening, "sanctions-hit-9", supports=[], contradicts=["screening_clear"], sensitivity="restricted",
           provenance_group="compliance-service", attributes=HIT)
    assert state(screening) == "ENTITLEMENT_BLOCK"


def test_a_redundant_withheld_copy_of_support_blocks_nothing(screening):
    upsert(screening, "screening-copy", sensitivity="restricted")  # supports an already supported slot
    plan = compile_request(REQUEST, screening, None).plan
    assert plan["state"] == "SUFFICIENT" and plan["withheld"] == 1


def test_every_planner_reports_the_stop_its_state_implies():
    assert settled_stop("SUFFICIENT", "no_positive_value") == "contract_satisfied"
    assert settled_stop("CONFLICT", "no_positive_value") == "escalate"
    assert settled_stop("ENTITLEMENT_BLOCK", "contract_satisfied") == "escalate"
    assert settled_stop("INSUFFICIENT", "budget_exhausted") == "budget_exhausted"
