"""Pass 6: dependency keys cover evidence that does not exist yet; live horizons are exact to the second
and stay representable at the far ends of time."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import orjson
import pytest

from compiler.attest import next_change
from compiler.dependency_keys import scope_keys
from compiler.pipeline import compile_request
from schemas.codec import resource_from
from schemas.records import Contract, Proposition
from tests.catalog_double import MemoryCatalog
from tests.conftest import ATLAS_REQUEST
from tests.events import resource

NOW = datetime(2026, 8, 30, 9, tzinfo=timezone.utc)
LIVE = {k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"}
PROPOSITIONS = ["facility_limit", "review_open", "waiver_valid", "continuation_rule"]


@pytest.fixture
def atlas() -> MemoryCatalog:
    return MemoryCatalog.from_scenario("atlas.jsonl")


def test_a_plan_depends_on_claims_of_every_proposition_in_any_class(atlas):
    deps = set(compile_request(ATLAS_REQUEST, atlas, NOW).dependencies)
    assert {f"scope:ATLAS-IN-01/claims:{p}" for p in PROPOSITIONS} <= deps


def test_a_new_resource_announces_the_claims_it_makes():
    keys = scope_keys("ATLAS-IN-01", "case_note", ["waiver_valid", "review_open"])
    assert set(keys) == {"scope:ATLAS-IN-01/case_note", "scope:ATLAS-IN-01/claims:waiver_valid",
                         "scope:ATLAS-IN-01/claims:review_open"}


def test_a_claim_in_an_unaccepted_class_changes_the_plan(atlas):
    # Why the claims key matters: this case note is no candidate by class, yet it changes the plan.
    before = compile_request(ATLAS_REQUEST, atlas, NOW)
    atlas.apply(*_wire(resource("rm-note-N8", cls="case_note", valid_to=None)))
    after = compile_request(ATLAS_REQUEST, atlas, NOW)
    assert {"resource_id": "rm-note-N8", "reason": "wrong_evidence_class"} in after.plan["rejected"]
    assert after.plan_id != before.plan_id
    shared = set(before.dependencies) & set(scope_keys("ATLAS-IN-01", "case_note", ["waiver_valid"]))
    assert shared == {"scope:ATLAS-IN-01/claims:waiver_valid"}


def test_a_live_plan_before_valid_from_is_valid_until_exactly_valid_from(atlas):
    starts = NOW + timedelta(days=2)
    atlas.apply(*_wire(resource("approved-waiver-W3", valid_from=_fmt(starts), valid_to=None)))
    plan = compile_request(LIVE, atlas, NOW)
    assert plan.plan["valid_until"] == _fmt(starts) and plan.valid_until == starts
    assert f"time:{_fmt(starts)}" in plan.dependencies
    # The horizon is the first instant the outcome differs: the same plan a second before, a new one at it.
    assert compile_request(LIVE, atlas, starts - timedelta(seconds=1)).plan_id == plan.plan_id
    at = compile_request(LIVE, atlas, starts)
    assert at.plan_id != plan.plan_id
    assert "approved-waiver-W3" in {a["resource_id"] for a in at.plan["admitted"]}


def test_a_live_plan_is_valid_until_one_second_after_valid_to(atlas):
    ends = NOW + timedelta(days=2)
    atlas.apply(*_wire(resource("approved-waiver-W3", valid_to=_fmt(ends))))
    plan = compile_request(LIVE, atlas, NOW)
    assert plan.plan["valid_until"] == _fmt(ends + timedelta(seconds=1))
    assert compile_request(LIVE, atlas, ends).plan_id == plan.plan_id
    assert compile_request(LIVE, atlas, ends + timedelta(seconds=1)).plan_id != plan.plan_id


def _fmt(instant: datetime) -> str:
    return instant.strftime("%Y-%m-%dT%H:%M:%SZ")


def _wire(item: tuple[str, dict]) -> tuple[str, bytes]:
    return item[0], orjson.dumps(item[1])
CONTRACT = Contract("d", ("p",), (Proposition("waiver_valid", ("approved_waiver",), max_age=timedelta.max),))


def far(valid_from: str = "2026-08-29T00:00:00Z", valid_to: str | None = "9999-12-31T23:59:59Z"):
    return resource_from(resource("w-far", valid_from=valid_from, valid_to=valid_to)[1]["resource"])


def test_a_valid_to_at_the_end_of_time_never_changes_the_plan():
    assert next_change([far()], CONTRACT, NOW) is None
    soon = far(valid_to="2026-09-30T23:59:59Z")
    assert next_change([far(), soon], CONTRACT, NOW) == datetime(2026, 10, 1, tzinfo=timezone.utc)


def test_a_future_valid_from_is_still_the_horizon_when_max_age_runs_past_the_end():
    later = far(valid_from="2027-01-01T00:00:00Z")
    assert next_change([later], CONTRACT, NOW) == datetime(2027, 1, 1, tzinfo=timezone.utc)


def test_a_live_plan_compiles_over_a_resource_valid_until_the_end_of_time():
    catalog = MemoryCatalog.from_scenario("atlas.jsonl")
    catalog.apply("source-changes", orjson.dumps(resource("approved-waiver-W2", valid_to="9999-12-31T23:59:59Z")[1]))
    plan = compile_request(dict(ATLAS_REQUEST, decision_time="now"), catalog, NOW)
    assert any(a["resource_id"] == "approved-waiver-W2" for a in plan.plan["admitted"])


def test_a_later_policy_version_taking_over_is_a_change_of_the_plan():
    december = datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert next_change([far()], CONTRACT, NOW, december) == december
    soon = far(valid_to="2026-09-30T23:59:59Z")
    assert next_change([soon], CONTRACT, NOW, december) == datetime(2026, 10, 1, tzinfo=timezone.utc)
    assert next_change([far()], CONTRACT, december, december) is None  # not after `after`: no change


def test_a_max_age_dates_only_resources_of_its_own_proposition(atlas):
    contract, _ = atlas.contract("credit.review.continuation")
    when = datetime(2026, 8, 30, 9, tzinfo=timezone.utc)
    # policy-P3 speaks to continuation_rule, which has no max_age: waiver_valid's P400D never ages it.
    clause = replace(atlas.resources["policy-P3"], valid_to=None)
    assert next_change([clause], contract, when) is None
    waiver = replace(clause, evidence_class="approved_waiver", supports=("waiver_valid",),
                     observed_at=datetime(2026, 8, 29, tzinfo=timezone.utc))
    assert next_change([waiver], contract, when) == datetime(2027, 10, 3, 0, 0, 1, tzinfo=timezone.utc)
