"""Pass 4 reason precedence: a resource Cedar denies is only ever withheld, whatever else is wrong with it."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import orjson
import pytest

from compiler.admission import admit, fresh_propositions, is_stale
from compiler.pipeline import compile_request
from compiler.slots import fill_slots
from schemas.records import Proposition
from tests.catalog_double import SCENARIOS, MemoryCatalog
from tests.conftest import ATLAS_REQUEST

NOW = datetime(2026, 8, 30, 9, tzinfo=timezone.utc)
DENIED_AND_ALSO = {  # each would be rejected for its own reason if Cedar permitted it
    "superseded": {"superseded_by": "investigation-X10"},
    "expired": {"valid_to": datetime(2026, 8, 25, tzinfo=timezone.utc)},
    "not_yet_valid": {"valid_from": datetime(2026, 9, 5, tzinfo=timezone.utc)},
    "stale": {"valid_from": datetime(2025, 6, 1, tzinfo=timezone.utc)},  # waiver_valid has max_age P400D
    "other_entity": {"entity": "BOREAL-UK-02"},
}


@pytest.fixture
def atlas() -> MemoryCatalog:
    return MemoryCatalog.from_scenario("atlas.jsonl")


@pytest.mark.parametrize("flaw", sorted(DENIED_AND_ALSO))
def test_a_denied_resource_is_withheld_never_rejected(atlas, flaw):
    # investigation-X9 is restricted to financial_crime; maya is a credit analyst.
    x9 = atlas.resources["investigation-X9"]
    denied = replace(x9, id=f"x9-{flaw}", evidence_class="approved_waiver", **DENIED_AND_ALSO[flaw])
    contract, policy = atlas.contract("credit.review.continuation")
    admission = admit([denied], entity_id="ATLAS-IN-01", principal=atlas.principal("maya"), contract=contract,
                      policy=policy, purpose="annual_credit_review", decision_time=NOW)
    assert admission.withheld == (denied.id,)
    assert admission.rejected == () and admission.typed == ()


# The catalog offers only the entity's own resources, so another entity's is checked through admit() only.
@pytest.mark.parametrize("flaw", sorted(set(DENIED_AND_ALSO) - {"other_entity"}))
def test_the_plan_lists_no_reason_for_a_denied_resource(atlas, flaw):
    x9 = atlas.resources["investigation-X9"]
    atlas.resources["investigation-X9"] = replace(x9, evidence_class="approved_waiver", **DENIED_AND_ALSO[flaw])
    plan = compile_request(ATLAS_REQUEST, atlas, NOW)
    assert "investigation-X9" not in {r["resource_id"] for r in plan.plan["rejected"]}
    assert plan.plan["withheld"] == 1
    assert {"resource_id": "investigation-X9", "reason": "not_authorised"} in plan.receipt["rejected"]


def _forged(atlas: MemoryCatalog, group: str):
    waiver = replace(atlas.resources["policy-P3"], id=f"waiver-{group}", evidence_class="approved_waiver",
                     supports=("waiver_valid",), provenance_group=group, tokens=100)
    atlas.resources[waiver.id] = waiver
    return waiver


def test_a_class_a_source_rule_reserves_is_untrusted_from_any_other_group(atlas):
    forged = _forged(atlas, "public-web")
    contract, policy = atlas.contract("credit.review.continuation")
    rules = {"approved_waiver": frozenset({"credit-committee"})}
    kwargs = dict(entity_id="ATLAS-IN-01", principal=atlas.principal("maya"), contract=contract, policy=policy,
                  purpose="annual_credit_review", decision_time=NOW)
    assert admit([forged], trusted=rules, **kwargs).rejected == ((forged.id, "untrusted_source"),)
    assert admit([forged], **kwargs).typed[0][0] == forged  # no rule names the class: any group may assert it
    genuine = _forged(atlas, "credit-committee")
    assert admit([genuine], trusted=rules, **kwargs).typed[0][0] == genuine
    # Cedar's denial still comes first: a denied forgery is only withheld.
    denied = replace(forged, id="waiver-denied", sensitivity="restricted")
    assert admit([denied], trusted=rules, **kwargs).withheld == ("waiver-denied",)


def test_a_forged_waiver_does_not_make_atlas_sufficient(atlas):
    _forged(atlas, "public-web")
    plan = compile_request(ATLAS_REQUEST, atlas, NOW)  # the shipped bundle names credit-committee for waivers
    assert plan.plan["state"] == "INSUFFICIENT"
    assert {"resource_id": "waiver-public-web", "reason": "untrusted_source"} in plan.plan["rejected"]
    assert "trust:approved_waiver" in plan.dependencies
    atlas.apply(*_bundle_v2(atlas_sources=None, source_trust=False))  # an explicit opt-out admits it again
    assert compile_request(ATLAS_REQUEST, atlas, NOW).plan["state"] == "SUFFICIENT"


def test_a_bundle_without_source_rules_trusts_no_group_for_its_authoritative_classes(atlas):
    atlas.apply(*_bundle_v2(atlas_sources={}))
    plan = compile_request(ATLAS_REQUEST, atlas, NOW).plan
    assert plan["admitted"] == [] and plan["state"] == "INSUFFICIENT"
    # Every typed item is of a class its proposition accepts as the one authoritative source.
    assert {"facility-F102", "workflow-E88", "policy-P3"} <= {
        r["resource_id"] for r in plan["rejected"] if r["reason"] == "untrusted_source"}


def _bundle_v2(atlas_sources: dict | None, **changes) -> tuple[str, bytes]:
    """Atlas's bundle at version 2 with these source rules (None: no `sources` field at all)."""
    event = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    event = dict(event, event_id="credit-v2", version=2, **changes)
    event.pop("sources")
    if atlas_sources is not None:
        event["sources"] = atlas_sources
    return "policy-versions", orjson.dumps(event)


def test_a_max_age_counts_from_observed_at_and_only_in_its_own_slot(atlas):
    contract, policy = atlas.contract("credit.review.continuation")
    hour = timedelta(hours=1)
    props = tuple(replace(p, max_age=hour) if p.id == "facility_limit" else p for p in contract.propositions)
    props += (Proposition("limit_known", ("facility_record",), required=False),)
    contract = replace(contract, propositions=props)
    old_row = replace(atlas.resources["facility-F102"], supports=("facility_limit", "limit_known"),
                      valid_from=NOW - 10 * hour, observed_at=NOW - 10 * hour)
    assert fresh_propositions(old_row, contract, NOW) == {"limit_known"}
    assert not is_stale(old_row, contract, NOW)  # still usable where no max_age applies
    confirmed = replace(old_row, observed_at=NOW - hour / 2)  # an old row confirmed half an hour ago
    assert fresh_propositions(confirmed, contract, NOW) == {"facility_limit", "limit_known"}
    only_limit = replace(old_row, supports=("facility_limit",))
    assert is_stale(only_limit, contract, NOW)
    admission = admit([old_row], entity_id="ATLAS-IN-01", principal=atlas.principal("maya"), contract=contract,
                      policy=policy, purpose="annual_credit_review", decision_time=NOW)
    usable = {r.id: p for r, p in admission.typed}
    slots = {s.proposition: s for s in fill_slots([old_row], contract, usable)}
    assert slots["facility_limit"].state == "unknown" and slots["limit_known"].state == "supported"
