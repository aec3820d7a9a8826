"""Parked plans: the latest record of each plan key, kept in the shape a take-over restores, old files migrated."""

from __future__ import annotations

import orjson

from schemas.plan_partition import plan_partition
from state.local_state import LocalState
from state import parked_plans
from state.parked_plans import ParkedPlans
from state.plan_restore import restore_parked
from state.store import Store

RECORD = {"plan_id": "p1", "plan_key": "pk-1", "entity_id": "E1", "request": {"decision_time": "now"},
          "dependencies": ["resource:b", "resource:a", "resource:a"], "valid_until": "2026-09-01T00:00:00Z",
          "compiled_as_of": {"source-changes": {"0": 7, "1": 3}}, "compiled_in": "c1", "receipt_id": "r1",
          "admitted": []}


def _row(store: Store, key: str) -> dict:
    cursor = store.db.execute("SELECT * FROM parked_plans WHERE plan_key = ?", [key])
    names = [d[0] for d in cursor.description]
    row = dict(zip(names, cursor.fetchone(), strict=True))
    return dict(row, deps=orjson.loads(row["deps"]), as_of=orjson.loads(row["as_of"]))


def test_a_parked_record_is_kept_prepared_for_a_take_over(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    try:
        parked = ParkedPlans(store, 4)
        parked.park([dict(RECORD, plan_id="p0", compiled_as_of={"source-changes": {"0": 1}}), RECORD,
                     {"plan_id": "bad", "plan_key": "pk-bad", "entity_id": "E2", "dependencies": ["x:1", 5]}])
        row = _row(store, "pk-1")
        assert row["plan_id"] == "p1" and row["partition"] == plan_partition("E1", 4) and row["progress"] == 10
        assert row["deps"] == ["resource:a", "resource:b"] and row["live"] and row["receipt_id"] == "r1"
        assert row["as_of"] == [{"topic": "source-changes", "partition": 0, "next_offset": 7},
                                {"topic": "source-changes", "partition": 1, "next_offset": 3}]
        assert orjson.loads(row["plan"]) == {k: v for k, v in RECORD.items()
                                             if k not in ("compiled_as_of", "compiled_in", "dependencies")}
        assert row["unrestorable"] is None and row["compiled_in"] == "c1"
        bad = _row(store, "pk-bad")
        assert bad["unrestorable"] and bad["deps"] == ["x:1"] and bad["plan"] is None
        parked.park([dict(RECORD, compiled_as_of={"source-changes": {"0": 2}})])
        assert _row(store, "pk-1")["progress"] == 10  # the same plan read less far never replaces it
        assert [(r["plan_id"], ok) for r, ok in parked.records_of(["p1", "bad", "unknown"])] in (
            [("p1", True), ("bad", False)], [("bad", False), ("p1", True)])
    finally:
        store.close()


def test_a_file_parked_before_records_were_prepared_is_migrated(tmp_path):
    store = Store(tmp_path / "old.duckdb")
    store.db.execute("CREATE TABLE parked_plans (plan_key VARCHAR PRIMARY KEY, partition INTEGER, plan_id VARCHAR, "
                     "progress BIGINT, record VARCHAR)")
    store.db.execute("INSERT INTO parked_plans VALUES ('pk-1', 0, 'p1', 10, ?)", [orjson.dumps(RECORD).decode()])
    store.close()
    store = Store(tmp_path / "old.duckdb")
    try:
        parked = ParkedPlans(store, 4)
        assert parked.size() == 1 and parked.records([plan_partition("E1", 4)]) == [RECORD]
        row = _row(store, "pk-1")
        assert row["deps"] == ["resource:a", "resource:b"] and row["partition"] == plan_partition("E1", 4)
    finally:
        store.close()


def test_a_descendant_replaces_its_plan_and_a_late_copy_of_a_replaced_plan_does_not_come_back(tmp_path):
    store = Store(tmp_path / "f.duckdb")
    try:
        parked = ParkedPlans(store, 4)
        behind = {"source-changes": {"0": 8, "1": 0}}  # compiled later by a worker behind on partition 1
        chosen = parked.park([RECORD, dict(RECORD, plan_id="p2", replaces="p1", compiled_as_of=behind)])
        assert _row(store, "pk-1")["plan_id"] == "p2" and chosen["pk-1"]["plan_id"] == "p2"
        assert orjson.loads(_row(store, "pk-1")["superseded"]) == ["p1"] and parked.crossed == 0
        assert parked.park([RECORD]) == {}  # the copy a restarted worker sends again
        assert _row(store, "pk-1")["plan_id"] == "p2"
        parked.park([dict(RECORD, plan_id="p1", replaces="p2", compiled_as_of={"source-changes": {"0": 9}})])
        assert _row(store, "pk-1")["plan_id"] == "p1"  # compiled again from p2 (A -> B -> A): current again
        assert orjson.loads(_row(store, "pk-1")["superseded"]) == ["p2"]
        # Neither descends from the other: the one read further is kept, as before, and nothing counts as replaced
        # (nobody is known to have announced the loser).
        parked.park([dict(RECORD, plan_id="p8", replaces="p7", compiled_as_of={"source-changes": {"0": 3}})])
        assert _row(store, "pk-1")["plan_id"] == "p1" and parked.crossed == 1
        parked.park([dict(RECORD, plan_id="p9", replaces="p7", compiled_as_of={"source-changes": {"0": 30}})])
        assert _row(store, "pk-1")["plan_id"] == "p9" and parked.crossed == 2
        assert orjson.loads(_row(store, "pk-1")["superseded"]) == ["p2"]
        parked.park([dict(RECORD, plan_id="p10", compiled_as_of={"source-changes": {"0": 31}})])
        assert parked.crossed == 2  # a plan compiled afresh (dropped, then selected again) names none: no crossing
    finally:
        store.close()


def test_the_superseded_ids_kept_are_bounded_and_never_name_the_current_plan():
    from state.parked_plans import SUPERSEDED_KEPT, succession

    held = ("p0", 5, [f"old-{i}" for i in range(SUPERSEDED_KEPT)])
    wins, superseded, crossed = succession(held, {"plan_id": "p1", "replaces": "p0"})
    assert wins and not crossed and len(superseded) == SUPERSEDED_KEPT
    assert superseded[-1] == "p0" and superseded[0] == "old-1"  # the oldest goes first
    wins, superseded, _ = succession(held, {"plan_id": "old-3", "replaces": "p0"})
    assert wins and "old-3" not in superseded and superseded[0] == "old-0"
    assert succession(None, {"plan_id": "p1"}) == (True, [], False)


def test_a_file_parked_before_the_plan_id_index_gets_it_and_finds_each_plan_by_its_current_id(tmp_path):
    store = Store(tmp_path / "old.duckdb")
    ParkedPlans(store, 4).park([RECORD])
    # As files of 2026-11-30 were: no `superseded` column (added by ALTER, which an index would refuse) and no index.
    store.db.execute("DROP INDEX parked_plans_plan")
    store.db.execute("ALTER TABLE parked_plans DROP COLUMN superseded")
    store.close()
    store = Store(tmp_path / "old.duckdb")
    try:
        parked = ParkedPlans(store, 4)
        assert store.db.execute("SELECT count(*) FROM duckdb_indexes() WHERE table_name = 'parked_plans' "
                                "AND index_name = 'parked_plans_plan'").fetchone()[0] == 1
        parked.park([dict(RECORD, plan_id="p2", replaces="p1")])
        assert [r["plan_id"] for r, _ in parked.records_of(["p1", "p2"])] == ["p2"]  # the replaced id is gone
        assert store.db.execute("SELECT plan_key FROM parked_plans WHERE plan_id = 'p2'").fetchall() == [("pk-1",)]
    finally:
        store.close()


def test_a_record_keeps_the_receipt_of_its_own_plan_and_a_file_parked_before_that_gets_it(tmp_path):
    own = dict(RECORD, receipt={"receipt_id": "r1", "plan_id": "p1", "withheld": []})
    other = dict(RECORD, plan_id="p2", plan_key="pk-2", receipt_id="r2", receipt={"receipt_id": "r2", "plan_id": "p1"})
    store = Store(tmp_path / "old.duckdb")
    ParkedPlans(store, 4).park([own, other])
    assert orjson.loads(_row(store, "pk-1")["receipt"]) == own["receipt"] and _row(store, "pk-2")["receipt"] is None
    # As files of 2026-12-05 were: the plan id index, no receipt column (a restore read it out of each record).
    store.db.execute("DROP INDEX parked_plans_plan")
    store.db.execute("ALTER TABLE parked_plans DROP COLUMN receipt")
    store.db.execute("CREATE INDEX parked_plans_plan ON parked_plans (plan_id)")
    store.close()
    state = LocalState.open(tmp_path / "old.duckdb")  # with the receipts table a restore writes
    store = state.store
    try:
        ParkedPlans(store, 4)
        assert orjson.loads(_row(store, "pk-1")["receipt"]) == own["receipt"] and _row(store, "pk-2")["receipt"] is None
        with store.transaction():
            restore_parked(store, range(4), compiled_at=None)
        assert [(i, orjson.loads(r)) for i, r in store.db.execute("SELECT receipt_id, receipt FROM receipts")
                .fetchall()] == [("r1", own["receipt"])]
    finally:
        state.close()


def test_records_are_found_by_id_the_same_from_a_list_of_values_or_a_list_parameter(tmp_path, monkeypatch):
    store = Store(tmp_path / "f.duckdb")
    try:
        parked = ParkedPlans(store, 4)
        parked.park([RECORD, dict(RECORD, plan_id="p2", plan_key="pk-2"), dict(RECORD, plan_id="p3", plan_key="pk-3")])
        by_values = sorted(r["plan_id"] for r, _ in parked.records_of(["p1", "p3", "gone"]))
        monkeypatch.setattr(parked_plans, "IN_LIST", 1)
        assert sorted(r["plan_id"] for r, _ in parked.records_of(["p1", "p3", "gone"])) == by_values == ["p1", "p3"]
    finally:
        store.close()
