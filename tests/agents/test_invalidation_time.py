"""The invalidator and time: horizons, clock ticks and jumps, future policy versions."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import orjson
import pytest

from agents.plans.backlog import recompile_queued
from agents.stream.event_apply import EventApplier
from agents.plans.plan_writer import PlanWriter
from compiler.errors import RequestError
from state.dependency_index import HORIZON_MEMO
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from schemas.timefmt import format_instant
from tests.events import resource, tick
from tests.agents.applier_kit import outbox, raw, settle


LIVE_REQUEST = {k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"}


def test_a_claim_in_a_class_the_contract_does_not_accept_invalidates(setup):
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    # A case note is no candidate by class, only by what it claims: only the claims key reaches the plan.
    inv.apply([raw(*resource("rm-note-N8", cls="case_note", valid_to=None,
                             provenance_group="relationship-management"))])
    settle(inv)
    status = query.plan_status(plan["plan_id"])
    assert status["status"] == "invalidated" and status["reason"] == "scope_changed"
    assert status["cause"]["dependency_key"] == "scope:ATLAS-IN-01/claims:waiver_valid"
    after = query.select(ATLAS_REQUEST)
    assert after["served_from"] == "cache" and after["plan_id"] == status["successor_plan_id"]
    assert {"resource_id": "rm-note-N8", "reason": "wrong_evidence_class"} in after["rejected"]


def test_a_tick_at_exactly_valid_from_invalidates_a_live_plan(setup):
    state, inv, query = setup
    inv.apply([raw(*resource("approved-waiver-W3", valid_from="2026-09-01T00:00:00Z", valid_to=None))])
    plan = query.select(LIVE_REQUEST)
    assert plan["valid_until"] == "2026-09-01T00:00:00Z"
    assert "approved-waiver-W3" in {r["resource_id"] for r in plan["rejected"]}  # not yet applicable

    inv.apply([raw(*tick("2026-08-31T23:59:59Z"))])
    assert query.plan_status(plan["plan_id"])["status"] == "fresh"
    inv.apply([raw(*tick("2026-09-01T00:00:00Z"))])
    settle(inv)
    status = query.plan_status(plan["plan_id"])
    assert status["status"] == "invalidated" and status["reason"] == "time_passed"
    assert status["cause"]["dependency_key"] == "time:2026-09-01T00:00:00Z"
    after = query.select(LIVE_REQUEST)
    assert after["plan_id"] == status["successor_plan_id"]
    assert "approved-waiver-W3" in {a["resource_id"] for a in after["admitted"]}


def test_a_plan_stored_after_the_writer_read_the_horizons_is_still_due_at_its_own(setup):
    state, inv, query = setup
    inv.apply([raw(*tick("2026-08-31T00:00:00Z"))])  # the writer reads the live heads' earliest horizon: none
    assert state.store.cached(HORIZON_MEMO, dict) == {"earliest": None}
    inv.apply([raw(*resource("approved-waiver-W3", valid_from="2026-09-01T00:00:00Z", valid_to=None))])
    plan = query.select(LIVE_REQUEST)
    assert state.store.cached(HORIZON_MEMO, dict)["earliest"] == datetime(2026, 9, 1, tzinfo=timezone.utc)
    inv.apply([raw(*tick("2026-08-31T12:00:00Z"))])  # before it: no read
    assert query.plan_status(plan["plan_id"])["status"] == "fresh"
    inv.apply([raw(*tick("2026-09-01T00:00:01Z"))])
    settle(inv)
    status = query.plan_status(plan["plan_id"])
    assert status["status"] == "invalidated" and status["reason"] == "time_passed"
    inv.apply([raw(*tick("2026-09-01T00:00:02Z"))])  # read again: the successor's horizon is the earliest now
    successor = query.plan_status(status["successor_plan_id"])
    assert format_instant(state.store.cached(HORIZON_MEMO, dict)["earliest"]) == query.select(LIVE_REQUEST)[
        "valid_until"] and successor["status"] == "fresh"

def test_a_clock_jump_is_dead_lettered_and_the_first_tick_is_unbounded(setup, tmp_path):
    state, inv, _ = setup
    before = state.store.now()
    inv.apply([raw(*tick("2206-08-30T00:00:00Z"))])
    [letter] = outbox(state, "dead-letters")
    assert letter["error_class"] == "clock_jump" and "P400D" in letter["message"]
    assert state.store.now() == before
    inv.apply([raw(*tick("2027-09-30T00:00:00Z"))])            # within 400 days of now: applied
    assert format_instant(state.store.now()) == "2027-09-30T00:00:00Z"

    empty = LocalState.open(tmp_path / "empty.duckdb")
    applier = EventApplier(empty, PlanWriter(empty, lambda name: name), max_clock_jump=timedelta(hours=1))
    applier.apply([raw(*tick("2206-08-30"))])                  # a first tick is bounded by when it was published
    assert empty.store.now() is None
    soon = format_instant(datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=30))
    applier.apply([raw(*tick(soon))])
    assert format_instant(empty.store.now()) == soon and applier.now == empty.store.now()
    empty.close()


def test_steps_each_under_the_jump_bound_cannot_add_up_to_years(tmp_path):
    state = LocalState.open(tmp_path / "steps.duckdb")
    applier = EventApplier(state, PlanWriter(state, lambda name: name))
    topic_of = applier.plans.topic_of
    start = datetime.now(timezone.utc).replace(microsecond=0)
    applier.apply([raw(*tick(format_instant(start)))])
    applier.apply([raw(*tick(format_instant(start + timedelta(days=399 * n)))) for n in range(1, 9)])
    assert state.store.now() == start + timedelta(days=399)  # only the first step leads the wall by under 400 days
    letters = [orjson.loads(v) for _, t, _, v in state.outbox.pending() if t == topic_of("dead-letters")]
    assert [r["error_class"] for r in letters] == ["clock_jump"] * 7
    assert "ahead of the time it was published" in letters[0]["message"]
    state.close()


def _future_version(version: int = 2, effective_at: str = "2026-12-01T00:00:00Z") -> dict:
    bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    return dict(bundle, event_id=f"credit-v{version}", version=version, effective_at=effective_at,
                cedar=bundle["cedar"] + f"\n// version {version}\n")


@pytest.mark.parametrize("eager_limit", [500, 0])
def test_a_future_policy_version_takes_over_when_the_clock_crosses_its_effective_at(setup, eager_limit):
    state, inv, query = setup
    live_request = {k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"}
    live, past = query.select(live_request), query.select(ATLAS_REQUEST)
    assert live["policy"]["version"] == 1

    inv.plans.eager_limit = eager_limit  # recompiled at once (opted in) or announced first (the default)
    inv.apply([raw("policy-versions", _future_version())])
    # Nothing changes until December: announced first, every successor comes out the same plan.
    assert len(outbox(state, "plan-invalidations")) == (0 if eager_limit else 2)
    settle(inv)
    state.outbox.remove([seq for seq, *_ in state.outbox.pending(10_000)])
    same = query.select(live_request)
    assert same["plan_id"] == live["plan_id"] and same["served_from"] == "cache"
    assert same["valid_until"] == "2026-12-01T00:00:00Z" and same["policy"]["version"] == 1

    inv.apply([raw(*tick("2026-11-30T23:59:59Z"))])
    assert outbox(state, "plan-invalidations") == []
    inv.apply([raw(*tick("2026-12-01T00:00:00Z"))])
    [announced] = outbox(state, "plan-invalidations")
    assert announced["plan_id"] == live["plan_id"] and announced["reason"] == "policy_changed"
    assert announced["cause"]["dependency_key"] == "time:2026-12-01T00:00:00Z"
    if eager_limit:
        assert announced["successor_plan_id"] is not None
    else:
        settle(inv)
    successor = query.select(live_request)
    assert successor["policy"]["version"] == 2 and successor["plan_id"] != live["plan_id"]
    assert query.plan_status(live["plan_id"])["successor_plan_id"] == successor["plan_id"]
    # The historical decision keeps the version in effect at its decision_time.
    assert query.plan_status(past["plan_id"])["status"] == "fresh"
    assert query.select(ATLAS_REQUEST)["policy"]["version"] == 1


def test_a_crossed_record_boundary_stays_time_passed_under_a_kept_future_version(setup):
    state, inv, query = setup
    inv.apply([raw("policy-versions", _future_version()), raw(*resource("approved-waiver-W2"))])
    live_request = {k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"}
    live = query.select(live_request)
    assert live["valid_until"] == "2026-10-01T00:00:00Z"
    inv.apply([raw(*tick("2026-10-01T00:00:00Z"))])
    [announced] = outbox(state, "plan-invalidations")
    assert announced["reason"] == "time_passed"
    assert query.select(live_request)["valid_until"] == "2026-12-01T00:00:00Z"


def test_no_version_in_effect_refuses_only_decisions_before_the_first(setup):
    state, inv, query = setup
    inv.apply([raw("policy-versions", dict(_future_version(1, "2027-01-01T00:00:00Z"), bundle_id="later",
                                           decision_types={"later.review": {"purposes": ["annual_credit_review"],
                                                                            "propositions": []}}))])
    request = dict(ATLAS_REQUEST, decision_type="later.review")
    with pytest.raises(RequestError) as early:
        query.select(request)
    assert early.value.code == "policy_not_effective" and "decision_time" in early.value.message
    assert query.select(dict(request, decision_time="2027-01-02T00:00:00Z"))["policy"]["bundle_id"] == "later"


def test_a_future_version_announced_to_a_large_fan_out_keeps_every_plan_id(setup):
    state, inv, query = setup
    inv.plans.eager_limit = 0  # announced before recompiling: the successors must come out identical
    live_request = {k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"}
    live, past = query.select(live_request), query.select(ATLAS_REQUEST)
    inv.apply([raw("policy-versions", _future_version())])
    assert {r["plan_id"] for r in outbox(state, "plan-invalidations")} == {live["plan_id"], past["plan_id"]}
    recompile_queued(inv.plans, 10)
    assert state.store.counters()["announced_unchanged"] == 2
    assert query.select(live_request)["plan_id"] == live["plan_id"]
    assert query.select(ATLAS_REQUEST)["plan_id"] == past["plan_id"]
