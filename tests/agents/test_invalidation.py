"""The invalidator over a real DuckDB file, fed raw messages directly (no broker needed here)."""

from __future__ import annotations

import itertools
from datetime import timedelta

import orjson
import pytest

from agents.invalidation import Invalidator, RawMessage
from agents.query import QueryService
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from schemas.timefmt import format_instant
from tests.events import resource, revoke_role, tick

_offsets = itertools.count()


def raw(topic: str, event: dict | bytes, partition: int = 0, offset: int | None = None) -> RawMessage:
    value = event if isinstance(event, bytes) else orjson.dumps(event)
    return RawMessage(topic, partition, next(_offsets) if offset is None else offset, b"k", value)


@pytest.fixture
def setup(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    inv = Invalidator(state, lambda name: f"x-{name}")
    inv.apply([raw(item["topic"], item["event"]) for item in
               map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines())])
    yield state, inv, QueryService(state, inv)
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
    plan = query.select(ATLAS_REQUEST)
    same = resource("rm-note-N7", version=2, cls="case_note", valid_to=None,
                    content="The relationship manager says renewal was requested (typo fixed).")
    inv.apply([raw(*same)])
    assert outbox(state, "plan-invalidations") == []
    assert state.store.counters()["unchanged_recompilations"] == 1
    assert query.select(ATLAS_REQUEST)["plan_id"] == plan["plan_id"]


def test_a_plan_that_can_no_longer_compile_is_invalidated_without_successor(setup):
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    maya_gone = {"event_id": "del-maya", "schema_version": 1, "occurred_at": "2026-08-30T10:00:00Z",
                 "kind": "principal", "op": "delete", "principal": {"id": "maya"}}
    inv.apply([raw("source-changes", maya_gone)])
    [announced] = outbox(state, "plan-invalidations")
    assert announced["plan_id"] == plan["plan_id"] and announced["successor_plan_id"] is None
    assert announced["reason"] == "principal_changed"


def test_a_poison_event_is_dead_lettered_and_the_batch_still_applies(setup, monkeypatch):
    state, inv, query = setup
    query.select(ATLAS_REQUEST)
    original = state.catalog.apply_revocation

    def explode(revocation):
        if revocation.principal == "omar":
            raise RuntimeError("simulated bug")
        return original(revocation)

    monkeypatch.setattr(state.catalog, "apply_revocation", explode)
    inv.apply([raw(*revoke_role("omar", "financial_crime")), raw(*revoke_role("maya", "credit_analyst"))])
    [letter] = outbox(state, "dead-letters")
    assert letter["error_class"] == "processing_error" and "simulated bug" in letter["message"]
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
    Invalidator(empty, lambda name: name, max_clock_jump=timedelta(hours=1)).apply([raw(*tick("2206-08-30"))])
    assert format_instant(empty.store.now()) == "2206-08-30T00:00:00Z"
    empty.close()
