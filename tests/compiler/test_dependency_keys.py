"""Dependency keys are written and read in one place, each kind with its invalidation reason."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compiler import dependency_keys as dk
from schemas.timefmt import format_instant

NOON = datetime(2026, 8, 30, 12, tzinfo=timezone.utc)
PLAN_INVALIDATION_REASONS = {"source_changed", "scope_changed", "principal_changed", "policy_changed",
                             "contract_changed", "time_passed", "state_rebuilt", "stale_on_arrival", "evicted"}


@pytest.mark.parametrize("key, kind, value, reason", [
    (dk.resource("policy-P3"), "resource", "policy-P3", "source_changed"),
    (dk.scope_class("ATLAS-IN-01", "approved_waiver"), "scope", "ATLAS-IN-01/approved_waiver", "scope_changed"),
    (dk.scope_claim("ATLAS-IN-01", "waiver_valid"), "scope", "ATLAS-IN-01/claims:waiver_valid", "scope_changed"),
    (dk.principal("maya"), "principal", "maya", "principal_changed"),
    (dk.policy("credit"), "policy", "credit", "policy_changed"),
    (dk.contract("credit.review.continuation"), "contract", "credit.review.continuation", "contract_changed"),
    (dk.time(NOON), "time", "2026-08-30T12:00:00Z", "time_passed"),
    (dk.entity("ATLAS-IN-01"), "entity", "ATLAS-IN-01", "source_changed"),
    (dk.alias("Atlas"), "alias", "atlas", "source_changed"),
    (dk.name_word("boreal"), "name-word", "boreal", "source_changed"),
    (dk.trust("committee_record"), "trust", "committee_record", "source_changed"),
    (dk.EVICTION, "retention", "plan", "evicted"),
    (dk.plan("plan-1"), "plan", "plan-1", "stale_on_arrival"),
    (dk.REPLAY, "replay", "", "state_rebuilt"),
    (dk.WITHHELD, "resource", "withheld", "source_changed"),
    ("something:new", "something", "new", "source_changed"),
])
def test_each_kind_reads_back_with_its_reason(key, kind, value, reason):
    parsed = dk.parse(key)
    assert (parsed.kind, parsed.value, parsed.reason, dk.reason(key)) == (kind, value, reason, reason)
    assert reason in PLAN_INVALIDATION_REASONS


def test_the_wire_forms_are_the_ones_stored_plans_already_carry():
    """Keys live in DuckDB and on `receipts`: changing a form would orphan every stored edge."""
    assert dk.scope_keys("E", "case_note", ["a", "b"]) == ["scope:E/case_note", "scope:E/claims:a", "scope:E/claims:b"]
    assert [dk.resource("r"), dk.principal("p"), dk.alias("MiXed"), dk.name_word("w"), dk.trust("c")] == [
        "resource:r", "principal:p", "alias:mixed", "name-word:w", "trust:c"]
    assert dk.time("2026-08-30T12:00:00Z") == dk.time(NOON) == "time:2026-08-30T12:00:00Z"
    assert dk.EVICTION == "retention:plan" and dk.plan("x") == "plan:x"


def test_resource_and_time_values_are_read_only_from_their_own_kind():
    assert dk.resource_id("resource:a:b") == "a:b" and dk.resource_id("scope:a") is None
    assert dk.time_of(dk.time(NOON)) == NOON and dk.time_of("principal:maya") is None
    with pytest.raises(ValueError):
        dk.time_of("time:yesterday")


@given(st.text(min_size=1).filter(lambda s: ":" not in s), st.text())
def test_parse_splits_at_the_first_colon_only(kind, value):
    assert dk.parse(f"{kind}:{value}") == dk.DependencyKey(kind, value)


@given(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31),
                    timezones=st.just(timezone.utc)))
def test_time_keys_round_trip_to_the_second(instant):
    assert format_instant(dk.time_of(dk.time(instant))) == format_instant(instant)
