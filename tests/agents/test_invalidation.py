"""The invalidator over a real DuckDB file, fed raw messages directly: repeats, poison, offsets, lost plans."""

from __future__ import annotations



from tests.conftest import ATLAS_REQUEST
from tests.events import resource, revoke_role
from tests.agents.applier_kit import outbox, raw, settle


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
