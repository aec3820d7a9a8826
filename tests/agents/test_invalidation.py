"""The invalidator over a real DuckDB file, fed raw messages directly (no broker needed here)."""

from __future__ import annotations

import hashlib
import itertools
from datetime import datetime, timedelta, timezone

import orjson
import pytest

from agents.plans.backlog import recompile_queued
from agents.stream.event_apply import EventApplier, RawMessage
from agents.plans.plan_writer import PlanWriter
from agents.web.query import QueryService
from compiler.errors import RequestError
from state.dependency_index import HORIZON_MEMO
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from schemas.timefmt import format_instant
from tests.events import resource, revoke_role, tick

_offsets = itertools.count()


def raw(topic: str, event: dict | bytes, partition: int = 0, offset: int | None = None) -> RawMessage:
    value = event if isinstance(event, bytes) else orjson.dumps(event)
    return RawMessage(topic, partition, next(_offsets) if offset is None else offset, b"k", value)


def settle(inv) -> None:
    """Compile every queued successor, as the worker's backlog loop does after each batch."""
    while recompile_queued(inv.plans, 16):
        pass


@pytest.fixture
def setup(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    inv = EventApplier(state, PlanWriter(state, lambda name: f"x-{name}"))
    inv.apply([raw(item["topic"], item["event"]) for item in
               map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines())])
    yield state, inv, QueryService(state, inv.plans)
    state.close()


def outbox(state: LocalState, topic: str) -> list[dict]:
    return [orjson.loads(v) for _, t, _, v in state.outbox.pending() if t == f"x-{topic}"]


def test_duplicate_and_redelivered_events_change_nothing(setup):
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    topic, event = resource("approved-waiver-W2")
    message = raw(topic, event)
    inv.apply([message])
    first = len(outbox(state, "plan-invalidations"))
    inv.apply([message])                                # redelivered: same offset
    inv.apply([raw(topic, event)])                      # same event id, new offset
    assert len(outbox(state, "plan-invalidations")) == first == 1
    counters = state.store.counters()
    assert counters["redelivered_skipped"] == 1 and counters["duplicate_events"] == 1
    assert query.plan_status(plan["plan_id"])["status"] == "invalidated"


def test_identical_recompilation_is_counted_not_announced(setup):
    state, inv, query = setup
    inv.plans.eager_limit = 500  # opted in: a few plans are recompiled before announcing
    plan = query.select(ATLAS_REQUEST)
    same = resource("rm-note-N7", version=2, cls="case_note", valid_to=None, provenance_group="relationship-management",
                    content="The relationship manager says renewal was requested (typo fixed).")
    inv.apply([raw(*same)])
    assert outbox(state, "plan-invalidations") == []
    assert state.store.counters()["unchanged_recompilations"] == 1
    assert query.select(ATLAS_REQUEST)["plan_id"] == plan["plan_id"]


def test_a_plan_that_can_no_longer_compile_is_invalidated_without_successor(setup):
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    atlas_gone = {"event_id": "del-atlas", "schema_version": 1, "occurred_at": "2026-08-30T10:00:00Z",
                  "kind": "entity", "op": "delete", "entity": {"id": "ATLAS-IN-01"}}
    inv.apply([raw("source-changes", atlas_gone)])
    [announced] = outbox(state, "plan-invalidations")
    assert announced["plan_id"] == plan["plan_id"] and announced["successor_plan_id"] is None


def test_a_deleted_principals_plan_is_succeeded_by_one_that_withholds_everything(setup):
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    maya_gone = {"event_id": "del-maya", "schema_version": 1, "occurred_at": "2026-08-30T10:00:00Z",
                 "kind": "principal", "op": "delete", "principal": {"id": "maya"}}
    inv.apply([raw("source-changes", maya_gone)])
    [announced] = outbox(state, "plan-invalidations")
    assert announced["plan_id"] == plan["plan_id"] and announced["reason"] == "principal_changed"
    settle(inv)
    successor = query.select(ATLAS_REQUEST)
    assert successor["plan_id"] == query.plan_status(plan["plan_id"])["successor_plan_id"] != plan["plan_id"]
    assert successor["admitted"] == [] and successor["withheld"] == plan["withheld"] + len(plan["admitted"]) + \
        len(plan["rejected"])


def test_a_poison_event_is_dead_lettered_and_the_batch_still_applies(setup, monkeypatch):
    state, inv, query = setup
    query.select(ATLAS_REQUEST)
    original = state.catalog.apply_identities

    def explode(items, times=None):
        if any(getattr(item, "principal", None) == "omar" for item in items):
            raise RuntimeError("simulated bug")
        return original(items, times)

    monkeypatch.setattr(state.catalog, "apply_identities", explode)
    inv.apply([raw(*revoke_role("omar", "financial_crime")), raw(*revoke_role("maya", "credit_analyst"))])
    [letter] = outbox(state, "dead-letters")
    assert letter["error_class"] == "processing_error" and "RuntimeError" in letter["message"]
    assert "simulated bug" not in letter["message"]  # what went wrong, not what the values were
    assert state.catalog.principal("maya").roles == ()
    assert len(outbox(state, "plan-invalidations")) == 1


def test_offsets_commit_with_the_state_they_produced(setup):
    state, inv, _ = setup
    inv.apply([raw(*resource("w", version=1), partition=1, offset=41)])
    assert state.store.next_offsets()["source-changes"][1] == 42


def _maya(**attributes) -> tuple[str, dict]:
    return "source-changes", {"event_id": f"maya-{sorted(attributes.items())}", "schema_version": 1,
                              "occurred_at": "2026-08-30T10:00:00Z", "kind": "principal", "op": "upsert",
                              "principal": {"id": "maya", "roles": ["credit_analyst"], "delegation_version": 3,
                                            "attributes": dict(unit="corporate-credit", **attributes)}}


def test_a_principal_attribute_invalidates_only_when_some_policy_reads_it(setup):
    state, inv, query = setup
    bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    bundle = dict(bundle, event_id="v2", version=2, cedar=bundle["cedar"] + (
        'forbid(principal, action == Action::"use", resource) when { resource.evidence_class == "approved_waiver" '
        '&& principal has clearance && principal.clearance == "low" };\n'))
    inv.apply([raw("policy-versions", bundle), raw(*_maya(clearance="high")), raw(*resource("approved-waiver-W2"))])
    plan = query.select(ATLAS_REQUEST)
    assert "approved-waiver-W2" in {a["resource_id"] for a in plan["admitted"]}
    before = len(outbox(state, "plan-invalidations"))

    inv.apply([raw(*_maya(clearance="high", phone="555-0100"))])   # read by no policy: nothing to do
    assert len(outbox(state, "plan-invalidations")) == before
    assert query.select(ATLAS_REQUEST)["plan_id"] == plan["plan_id"]

    inv.apply([raw(*_maya(clearance="low", phone="555-0100"))])    # read by the forbid rule
    [announced] = outbox(state, "plan-invalidations")[before:]
    assert announced["plan_id"] == plan["plan_id"] and announced["reason"] == "principal_changed"
    after = query.select(ATLAS_REQUEST)
    assert "approved-waiver-W2" not in {a["resource_id"] for a in after["admitted"]}


def test_an_unread_principal_attribute_cedar_cannot_hold_still_invalidates(setup):
    # Cedar's integers are signed 64-bit: the recompiled plan denies everything, so the cached one must go.
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    assert plan["admitted"]
    before = len(outbox(state, "plan-invalidations"))
    inv.apply([raw(*_maya(phone=2**63))])
    [announced] = outbox(state, "plan-invalidations")[before:]
    assert announced["plan_id"] == plan["plan_id"] and announced["reason"] == "principal_changed"
    assert query.select(ATLAS_REQUEST)["admitted"] == []
    inv.apply([raw(*_maya(phone="555-0100"))])  # representable again: the plan comes back
    assert len(outbox(state, "plan-invalidations")) == before + 2
    assert query.select(ATLAS_REQUEST)["admitted"]


def _maya_with(attributes: dict) -> tuple[str, dict]:
    topic, event = _maya()
    event["event_id"] = f"maya-{hashlib.sha256(orjson.dumps(attributes, option=orjson.OPT_SORT_KEYS)).hexdigest()}"
    event["principal"]["attributes"] = dict(event["principal"]["attributes"], **attributes)
    return topic, event


def _forbid_waivers_when(condition: str) -> dict:
    bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    return dict(bundle, event_id="v2", version=2, cedar=bundle["cedar"] + (
        'forbid(principal, action == Action::"use", resource) when { resource.evidence_class == "approved_waiver" '
        f'&& {condition} }};\n'))


@pytest.mark.parametrize("name, condition", [
    ("level!", 'principal has "level!" && principal["level!"] == "low"'),   # no word boundary after the name
    ("-", 'principal has "-" && principal["-"] == "low"'),                  # no word character at all
    ("clearance", 'principal has "\\u{63}learance" && principal["\\u{63}learance"] == "low"'),  # spelt by an escape
])
def test_a_principal_attribute_a_policy_reads_by_any_spelling_invalidates(setup, name, condition):
    state, inv, query = setup
    inv.apply([raw("policy-versions", _forbid_waivers_when(condition)), raw(*_maya_with({name: "high"})),
               raw(*resource("approved-waiver-W2"))])
    plan = query.select(ATLAS_REQUEST)
    assert "approved-waiver-W2" in {a["resource_id"] for a in plan["admitted"]}
    before = len(outbox(state, "plan-invalidations"))
    inv.apply([raw(*_maya_with({name: "low"}))])                   # read by the forbid rule
    [announced] = outbox(state, "plan-invalidations")[before:]
    assert announced["plan_id"] == plan["plan_id"] and announced["reason"] == "principal_changed"
    assert "approved-waiver-W2" not in {a["resource_id"] for a in query.select(ATLAS_REQUEST)["admitted"]}


@pytest.mark.parametrize("old, new, literal", [(1, True, "true"), (0, False, "false"),
                                                (1, 1.0, 'decimal("1.0")'), ([1], [True], "[true]")])
def test_a_read_principal_attribute_changing_type_but_not_python_equality_invalidates(setup, old, new, literal):
    # Python holds 1 == True == 1.0; Cedar does not (a Long, a Bool, a decimal): the forbid rule now applies.
    state, inv, query = setup
    inv.apply([raw("policy-versions", _forbid_waivers_when(f"principal has blocked && principal.blocked == {literal}")),
               raw(*_maya_with({"blocked": old})), raw(*resource("approved-waiver-W2"))])
    plan = query.select(ATLAS_REQUEST)
    assert "approved-waiver-W2" in {a["resource_id"] for a in plan["admitted"]}
    before = len(outbox(state, "plan-invalidations"))
    inv.apply([raw(*_maya_with({"blocked": new}))])
    [announced] = outbox(state, "plan-invalidations")[before:]
    assert announced["plan_id"] == plan["plan_id"] and announced["reason"] == "principal_changed"
    assert "approved-waiver-W2" not in {a["resource_id"] for a in query.select(ATLAS_REQUEST)["admitted"]}


def test_an_unread_principal_attribute_too_deep_for_cedar_still_invalidates(setup):
    # Cedar's entity parser stops at 128 levels of nesting: the principal is denied everything on recompile.
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    assert plan["admitted"]
    before = len(outbox(state, "plan-invalidations"))
    deep: object = "555-0100"
    for _ in range(125):  # short of orjson's limit (1024) and the event size bound
        deep = {"n": deep}
    inv.apply([raw(*_maya_with({"phone": deep}))])
    [announced] = outbox(state, "plan-invalidations")[before:]
    assert announced["plan_id"] == plan["plan_id"] and announced["reason"] == "principal_changed"
    assert query.select(ATLAS_REQUEST)["admitted"] == []


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


def _maya_roles(event_id: str, roles: list[str]) -> tuple[str, dict]:
    return "source-changes", {"event_id": event_id, "schema_version": 1, "occurred_at": "2026-08-30T10:00:00Z",
                              "kind": "principal", "op": "upsert",
                              "principal": {"id": "maya", "roles": roles, "delegation_version": 3,
                                            "attributes": {"unit": "corporate-credit"}}}


def test_a_replayed_principal_update_does_not_undo_a_later_one(setup):
    state, inv, query = setup
    grant = _maya_roles("maya-grant", ["credit_analyst", "financial_crime"])
    inv.apply([raw(*grant)])
    inv.apply([raw(*_maya_roles("maya-narrow", ["credit_analyst"]))])
    inv.apply([raw(*grant)])  # the same event again, at a new offset (a producer retry, a re-published file)
    assert state.catalog.principal("maya").roles == ("credit_analyst",)
    assert query.select(ATLAS_REQUEST)["withheld"] == 1  # investigation-X9 stays out of her plan


def test_a_principal_update_repeated_in_one_batch_does_not_undo_a_later_one(setup):
    state, inv, query = setup
    grant = _maya_roles("maya-grant", ["credit_analyst", "financial_crime"])
    inv.apply([raw(*grant), raw(*_maya_roles("maya-narrow", ["credit_analyst"])), raw(*grant)])
    assert state.catalog.principal("maya").roles == ("credit_analyst",)
    assert query.select(ATLAS_REQUEST)["withheld"] == 1


def test_a_batch_that_fails_after_saving_offsets_is_applied_when_retried(setup, monkeypatch):
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    before = state.store.next_offsets()
    claim = state.store.claim_events
    calls = []

    def fail_once(event_ids):  # runs after the batch's offsets are written, inside its transaction
        calls.append(event_ids)
        if len(calls) == 1:
            raise RuntimeError("simulated failure after saving offsets")
        return claim(event_ids)

    monkeypatch.setattr(state.store, "claim_events", fail_once)
    batch = [raw(*revoke_role("maya", "credit_analyst"), offset=500),
             raw(*resource("approved-waiver-W2"), offset=900)]
    inv.apply(batch)
    assert len(calls[0]) == 2  # the whole batch failed once, then each event was retried alone
    assert state.store.next_offsets()["revocations"][0] == 501
    assert state.store.next_offsets()["source-changes"][0] == 901
    assert before["source-changes"][0] < 900
    # The retry applied both events instead of skipping them as already consumed.
    assert state.catalog.principal("maya").roles == ()
    assert "approved-waiver-W2" in {r.id for r in state.catalog.candidates(
        "ATLAS-IN-01", state.catalog.contract("credit.review.continuation")[0])}
    assert outbox(state, "dead-letters") == []
    assert query.plan_status(plan["plan_id"])["status"] == "invalidated"
def _roles(event_id: str, roles: list[str]) -> tuple[str, dict]:
    return "source-changes", {"event_id": event_id, "schema_version": 1, "occurred_at": "2026-08-30T10:00:00Z",
                              "kind": "principal", "op": "upsert",
                              "principal": {"id": "maya", "roles": roles, "delegation_version": 3}}


def test_a_replayed_principal_update_does_not_undo_a_later_change(setup):
    state, inv, _ = setup
    first, later = _roles("p-1", ["credit_analyst", "auditor"]), _roles("p-2", ["auditor"])
    inv.apply([raw(*first), raw(*later), raw(*first)])          # a repeat within one batch
    assert state.catalog.principal("maya").roles == ("auditor",)
    inv.apply([raw(*first)])                                    # and at a new offset
    assert state.catalog.principal("maya").roles == ("auditor",)
    assert state.store.counters()["duplicate_events"] == 2


def test_an_id_reused_with_other_content_is_dead_lettered(setup):
    state, inv, _ = setup
    inv.apply([raw(*_roles("p-1", ["auditor"])), raw(*_roles("p-1", ["credit_analyst", "admin"]))])
    [letter] = outbox(state, "dead-letters")
    assert letter["error_class"] == "event_id_conflict" and "admin" not in letter["message"]
    assert state.catalog.principal("maya").roles == ("auditor",)
    inv.apply([raw(*_roles("p-1", ["admin"]))])
    assert state.catalog.principal("maya").roles == ("auditor",)
    assert state.store.counters()["dead_letters.event_id_conflict"] == 2


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
