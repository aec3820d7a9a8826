"""The invalidator over a real DuckDB file, fed raw messages directly (no broker needed here)."""

from __future__ import annotations

import itertools

import orjson
import pytest

from agents.invalidation import Invalidator, RawMessage
from agents.query import QueryService
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from tests.events import resource, revoke_role

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


def test_a_fan_out_beyond_the_eager_limit_is_announced_first_and_recompiled_later(setup):
    state, inv, query = setup
    inv.eager_limit = 1
    first = query.select(ATLAS_REQUEST)
    other = query.select(dict(ATLAS_REQUEST, principal="omar", purpose="annual_credit_review"))
    bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    inv.apply([raw("policy-versions", dict(bundle, event_id="v2", version=2))])
    announced = {r["plan_id"]: r for r in outbox(state, "plan-invalidations")}
    assert set(announced) == {first["plan_id"], other["plan_id"]}
    assert all(r["successor_plan_id"] is None and r["reason"] in ("policy_changed", "contract_changed")
               for r in announced.values())
    compiled_by_selects = {p["plan_id"] for p in outbox(state, "plans")}
    assert state.queue.size() == 2 and compiled_by_selects == set(announced)
    # Nothing stale in between: the head is invalidated, so a select compiles against version 2.
    assert query.plan_status(first["plan_id"])["status"] == "invalidated"

    assert inv.recompile_queued(10, lambda topic, partition: True) == 2
    assert state.queue.size() == 0 and inv.recompile_queued(10, lambda t, p: True) == 0
    successors = {p["plan_id"] for p in outbox(state, "plans")} - compiled_by_selects
    assert len(successors) == 2 and not successors & set(announced)
    assert query.plan_status(first["plan_id"])["successor_plan_id"] in successors
    served = query.select(ATLAS_REQUEST)
    assert served["served_from"] == "cache" and served["plan_id"] in successors
    assert served["policy"]["version"] == 2


def test_queued_successors_are_published_only_by_the_owner_of_their_cause(setup):
    state, inv, query = setup
    inv.eager_limit = 0
    query.select(ATLAS_REQUEST)
    state.outbox.remove([seq for seq, *_ in state.outbox.pending()])   # as if published
    bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    inv.apply([raw("policy-versions", dict(bundle, event_id="v2", version=2))])
    assert inv.recompile_queued(10, lambda topic, partition: False) == 1
    assert outbox(state, "plans") == []                      # another worker owns policy-versions/0
    assert query.select(ATLAS_REQUEST)["served_from"] == "cache"
