"""Retention over a real DuckDB file: eviction of unused plans, expiry of old rows and receipts, bounds."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import orjson

from agents.stream.event_apply import EventApplier
from agents.web.query import QueryService
from schemas.codec import validate
from state.local_state import LocalState
from state.retention import RetentionPolicy, Topics
from tests.conftest import ATLAS_REQUEST
from tests.events import resource, tick
from tests.agents.applier_kit import raw

TOPICS = Topics("x-plan-invalidations", "x-plans", "x-clock")
POLICY = RetentionPolicy(plan_span=timedelta(days=30), receipt_span=timedelta(days=400), batch=1000)
START = datetime(2026, 8, 30, 9, tzinfo=timezone.utc)


def run_pass(state: LocalState, query: QueryService, policy: RetentionPolicy = POLICY):
    with state.store.transaction():
        return state.retention.run_pass(state.store.now(), policy, query.take_selected(), TOPICS,
                                        "2026-01-01T00:00:00Z")


def advance(state: LocalState, inv: EventApplier, days: float) -> None:
    now = state.store.now() + timedelta(days=days)
    inv.apply([raw(*tick(now.isoformat().replace("+00:00", "Z")))])


def announced(state: LocalState) -> list[tuple[str, bytes, bytes | None]]:
    return [(t, k, v) for _, t, k, v in state.outbox.pending() if t in (TOPICS.invalidations, TOPICS.plans)]


def rows(state: LocalState, table: str, key: str) -> int:
    column = "plan_id" if table in ("plans", "receipts") else "plan_key"
    return state.store.db.execute(f"SELECT count(*) FROM {table} WHERE {column} = ?", [key]).fetchone()[0]


def test_a_plan_not_selected_for_the_span_is_evicted_announced_and_compiled_again(setup):
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    key = plan["plan_key"]
    run_pass(state, query)
    state.outbox.remove([seq for seq, *_ in state.outbox.pending()])
    assert state.retention.last_selected(key) == START
    assert rows(state, "dependency_index", key) > 0
    deps = [d for (d,) in state.store.db.execute("SELECT dep_key FROM dependency_index WHERE plan_key = ?",
                                                 [key]).fetchall()]
    assert {k for k, _ in state.index.affected_pairs(deps)} == {key}  # the writer now remembers these edges

    advance(state, inv, 29)
    assert run_pass(state, query).evicted == []          # not yet idle for the span
    advance(state, inv, 2)
    result = run_pass(state, query)
    assert result.evicted == [(key, plan["plan_id"])]

    for table in ("plan_heads", "dependency_index", "recompile_queue", "plan_selected"):
        assert rows(state, table, key) == 0, table
    assert state.index.affected_pairs(deps) == []  # nor does the writer remember them
    assert rows(state, "plans", plan["plan_id"]) == 0
    assert rows(state, "receipts", plan["plan_id"]) == 1   # receipts follow their own span
    [(_, k1, v1), (topic2, k2, v2)] = announced(state)
    record = orjson.loads(v1)
    validate("plan-invalidations", record)
    assert k1 == k2 == plan["plan_id"].encode() and topic2 == TOPICS.plans and v2 is None  # tombstone
    assert record["reason"] == "evicted" and record["successor_plan_id"] is None
    assert record["cause"]["topic"] == "x-clock" and record["cause"]["dependency_key"] == "retention:plan"
    status = query.plan_status(plan["plan_id"])
    assert status["status"] == "invalidated" and status["reason"] == "evicted"
    assert state.store.counters()["plans_evicted"] == 1

    again = query.select(ATLAS_REQUEST)
    assert again["served_from"] == "compiled" and again["plan_id"] == plan["plan_id"]
    assert query.plan_status(plan["plan_id"])["status"] == "fresh"
    assert rows(state, "dependency_index", key) > 0


def test_a_plan_selected_within_the_span_is_kept(setup):
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    run_pass(state, query)
    advance(state, inv, 20)
    assert query.select(ATLAS_REQUEST)["served_from"] == "cache"
    run_pass(state, query)                                   # the cached select is stamped here
    advance(state, inv, 20)
    assert run_pass(state, query).evicted == []
    assert state.plans.fresh_plan(plan["plan_key"]) is not None
    advance(state, inv, 11)
    assert run_pass(state, query).evicted == [(plan["plan_key"], plan["plan_id"])]


def test_a_cached_select_writes_nothing(setup):
    state, inv, query = setup
    query.select(ATLAS_REQUEST)
    run_pass(state, query)
    before = state.store.db.execute("SELECT selected_at FROM plan_selected").fetchall()
    advance(state, inv, 1)
    assert query.select(ATLAS_REQUEST)["served_from"] == "cache"
    assert state.store.db.execute("SELECT selected_at FROM plan_selected").fetchall() == before
    run_pass(state, query)
    assert state.retention.last_selected(query.select(ATLAS_REQUEST)["plan_key"]) == START + timedelta(days=1)


def test_superseded_plan_rows_and_eviction_markers_expire_after_the_span(setup):
    state, inv, query = setup
    old = query.select(ATLAS_REQUEST)
    inv.apply([raw(*resource("approved-waiver-W2"))])      # supersedes the plan
    assert query.plan_status(old["plan_id"])["status"] == "invalidated"
    new = query.select(ATLAS_REQUEST)
    assert new["plan_id"] != old["plan_id"]
    run_pass(state, query)
    advance(state, inv, 25)
    query.select(ATLAS_REQUEST)
    run_pass(state, query)
    advance(state, inv, 6)
    result = run_pass(state, query)
    assert result.evicted == [] and result.plan_rows_expired == 1
    assert query.plan_status(old["plan_id"]) is None          # gone: 404 unknown_plan
    assert query.plan_status(new["plan_id"])["status"] == "fresh"

    advance(state, inv, 31)
    assert run_pass(state, query).evicted == [(new["plan_key"], new["plan_id"])]
    assert query.plan_status(new["plan_id"])["reason"] == "evicted"
    advance(state, inv, 31)
    assert run_pass(state, query).plan_rows_expired == 1      # the eviction marker itself
    assert query.plan_status(new["plan_id"]) is None


def test_receipts_expire_after_their_own_span(setup):
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    policy = RetentionPolicy(plan_span=timedelta(days=400), receipt_span=timedelta(days=60), batch=10)
    run_pass(state, query, policy)
    advance(state, inv, 59)
    query.select(ATLAS_REQUEST)
    assert run_pass(state, query, policy).receipts_expired == 0
    advance(state, inv, 2)
    result = run_pass(state, query, policy)
    assert result.receipts_expired == 1 and result.evicted == []
    assert rows(state, "receipts", plan["plan_id"]) == 0
    assert state.plans.fresh_plan(plan["plan_key"]) is not None  # the plan itself is still selected
    assert state.store.counters()["receipts_expired"] == 1


def test_a_pass_removes_at_most_its_batch(setup):
    state, inv, query = setup
    plans = [query.select(dict(ATLAS_REQUEST, budget={"tokens": 1000 + i})) for i in range(5)]
    assert len({p["plan_key"] for p in plans}) == 5
    run_pass(state, query)
    advance(state, inv, 31)
    small = RetentionPolicy(plan_span=timedelta(days=30), receipt_span=timedelta(days=1), batch=2)
    firsts = run_pass(state, query, small)
    assert len(firsts.evicted) == 2 and firsts.receipts_expired == 2
    assert len(run_pass(state, query, small).evicted) == 2
    assert len(run_pass(state, query, small).evicted) == 1
    assert state.store.db.execute("SELECT count(*) FROM plan_heads").fetchone()[0] == 0


def test_files_from_before_retention_get_receipt_stamps(tmp_path):
    import duckdb
    path = tmp_path / "old.duckdb"
    db = duckdb.connect(str(path))
    db.execute("CREATE TABLE receipts (receipt_id VARCHAR PRIMARY KEY, plan_id VARCHAR, receipt VARCHAR)")
    db.execute("INSERT INTO receipts VALUES ('r1', 'p1', '{}')")
    db.close()
    state = LocalState.open(path)
    try:
        with state.store.transaction():
            state.retention.run_pass(START, POLICY, [], TOPICS, "x")
        assert state.store.db.execute("SELECT stored_at FROM receipts").fetchone()[0] == START
    finally:
        state.close()


def test_a_pass_drops_aged_event_id_generations_and_counts_the_ids(setup):
    """The applier's own ids: an event re-sent within the span is a duplicate, after two spans it applies again."""
    state, inv, query = setup
    waiver = dict(resource("approved-waiver-W2", version=9)[1], event_id="w-9")
    inv.apply([raw("source-changes", waiver)])
    run_pass(state, query)
    advance(state, inv, 7)
    assert run_pass(state, query).event_ids.opened
    inv.apply([raw("source-changes", waiver)])
    counters = state.store.counters()
    assert counters["duplicate_events"] == 1 and "ignored_old_versions" not in counters
    advance(state, inv, 7)
    result = run_pass(state, query)
    assert result.event_ids.generations_dropped == 1 and result.event_ids.ids_dropped >= 2  # Atlas's, W2's
    inv.apply([raw("source-changes", waiver)])  # forgotten: applied again, and its version changes nothing
    counters = state.store.counters()
    assert counters["duplicate_events"] == 1 and counters["ignored_old_versions"] == 1
    assert counters["event_ids_expired"] == result.event_ids.ids_dropped
    assert counters["event_id_generations_dropped"] == 1
    assert state.retention.sizes()["event_id_generations"] == 2
