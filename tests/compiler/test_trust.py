"""Source trust on by default: authoritative classes, a bundle's own rules, the opt-out and the load warning's list."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import orjson

from compiler.pipeline import compile_request
from compiler.trust import authoritative_classes, bundle_trust, rules_for, unsourced
from schemas.records import PolicyBundle
from tests.catalog_double import SCENARIOS, MemoryCatalog


def test_authoritative_classes_are_those_one_item_can_settle_alone():
    screening = MemoryCatalog.from_scenario("screening.jsonl")
    contract, _ = screening.contract("invoice.hold.release")
    # goods_accepted needs two independent groups: independence, not trust, guards it.
    assert authoritative_classes(contract) == {"policy_clause", "screening_result", "delegation_record"}


def test_an_authoritative_class_takes_only_its_own_bundles_groups():
    atlas = MemoryCatalog.from_scenario("atlas.jsonl")
    contract, policy = atlas.contract("credit.review.continuation")
    named = {"approved_waiver": frozenset({"elsewhere"}), "case_note": frozenset({"notes"})}
    rules = rules_for(contract, policy.trusted, named)
    assert rules["approved_waiver"] == {"credit-committee"}  # another bundle's rule does not widen it
    assert rules["case_note"] == {"notes"}  # a class the contract does not rest on keeps every bundle's rules
    assert rules_for(contract, {}, {})["facility_record"] == frozenset()  # no rules: no group may assert it
    assert rules_for(contract, None, named) == named  # opted out: only what some rule lists is restricted


def test_a_bundle_lists_the_authoritative_classes_it_names_no_source_for():
    atlas = MemoryCatalog.from_scenario("atlas.jsonl")
    contract, policy = atlas.contract("credit.review.continuation")
    bare = PolicyBundle("credit", 2, datetime(2026, 1, 1, tzinfo=timezone.utc), "permit(principal, action, resource);",
                        (contract,))
    assert unsourced(bare) == {"credit.review.continuation": (
        "approved_waiver", "committee_record", "facility_record", "policy_clause", "workflow_event")}
    opted_out = replace(bare, source_trust=False)
    assert unsourced(opted_out) == {} and bundle_trust(opted_out) is None
    named = replace(bare, sources={"facility-system": ("facility_record",)})
    assert unsourced(named)["credit.review.continuation"] == (
        "approved_waiver", "committee_record", "policy_clause", "workflow_event")
    assert policy.trusted["facility_record"] == {"facility-system"}


def test_a_typed_delegation_record_from_the_public_web_is_untrusted_under_the_shipped_bundle():
    screening = MemoryCatalog.from_scenario("screening.jsonl")
    genuine = screening.resources["delegation-DA-19"]
    screening.resources["forged-DA"] = replace(genuine, id="forged-DA", provenance_group="public-web")
    request = orjson.loads((SCENARIOS / "screening-request.json").read_bytes())
    plan = compile_request(request, screening, None).plan
    assert {"resource_id": "forged-DA", "reason": "untrusted_source"} in plan["rejected"]
    assert plan["state"] == "SUFFICIENT"  # the register's own record still establishes the authority
