"""Key change positions and the one-query staleness judgement of plans records."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from schemas.plan_partition import plan_partition
from state.key_changes import KeyChanges, PlanPosition, Staleness
from state.parked_plans import ParkedPlans
from state.store import Store

NOW = datetime(2026, 8, 30, tzinfo=timezone.utc)


@pytest.fixture
def store(tmp_path):
    opened = Store(tmp_path / "f.duckdb")
    yield opened
    opened.close()


def plan(plan_id, deps, as_of, compiled_in="c1"):
    return PlanPosition(plan_id, deps, as_of, compiled_in)


def test_a_key_changed_at_or_after_the_compiled_offset_makes_the_plan_stale(store):
    changes = KeyChanges(store)
    with store.transaction():
        changes.record({("source-changes", 1, 7): ["resource:a", "scope:E/x"], ("revocations", 0, 3): ["principal:m"]})
    plans = [plan("before", ["resource:a"], {"source-changes": {"1": 7}}),        # offset 7 not applied: stale
             plan("after", ["resource:a"], {"source-changes": {"1": 8}}),         # applied: fresh
             plan("missing", ["principal:m"], {"source-changes": {"1": 8}}),      # revocations/0 counts as 0
             plan("other-partition", ["scope:E/x"], {"source-changes": {"0": 99, "1": 8}}),
             plan("unrelated", ["resource:b", "principal:n"], {}),
             plan("int-keys", ["scope:E/x"], {"source-changes": {1: 8}})]
    stale = changes.stale_plans(plans, NOW, "c1")
    assert stale == {"before": Staleness("resource:a", "source-changes", 1, 7),
                     "missing": Staleness("principal:m", "revocations", 0, 3)}


def test_the_latest_change_of_a_key_per_partition_counts(store):
    changes = KeyChanges(store)
    changes.record({("source-changes", 0, 4): ["scope:E/x"], ("source-changes", 0, 9): ["scope:E/x"]})
    changes.record({("source-changes", 0, 2): ["scope:E/x"], ("source-changes", 1, 1): ["scope:E/x"]})
    assert changes.last_change("scope:E/x") == {("source-changes", 0): 9, ("source-changes", 1): 1}
    as_of = {"source-changes": {"0": 5, "1": 2}}
    assert set(changes.stale_plans([plan("p", ["scope:E/x"], as_of)], NOW, "c1")) == {"p"}
    as_of = {"source-changes": {"0": 10, "1": 2}}
    assert changes.stale_plans([plan("p", ["scope:E/x"], as_of)], NOW, "c1") == {}


def test_time_keys_at_or_before_now_are_stale_and_unreadable_ones_deny(store):
    changes = KeyChanges(store)
    plans = [plan("passed", ["time:2026-08-29T00:00:00Z"], {}), plan("now", ["time:2026-08-30T00:00:00Z"], {}),
             plan("future", ["time:2026-09-01T00:00:00Z"], {}), plan("garbled", ["time:soon"], {})]
    stale = changes.stale_plans(plans, NOW, "c1")
    assert set(stale) == {"passed", "now", "garbled"}
    assert stale["passed"] == Staleness("time:2026-08-29T00:00:00Z", None, None, None)
    assert set(changes.stale_plans(plans, None, "c1")) == {"passed", "now", "future", "garbled"}  # no clock: deny


def test_positions_come_from_a_published_plans_record(store):
    changes = KeyChanges(store)
    changes.record({("source-changes", 1, 7): ["resource:a"]})
    record = {"plan_id": "p", "dependencies": ["resource:a"], "compiled_as_of": {"source-changes": {"1": 7}},
              "compiled_in": "c1", "state": "SUFFICIENT"}
    assert PlanPosition.of(record) == PlanPosition("p", ("resource:a",), {"source-changes": {"1": 7}}, "c1")
    assert set(changes.stale_plans([PlanPosition.of(record)], NOW, "c1")) == {"p"}
    # No dependency keys on the record (published before they were carried): nothing can vouch for it.
    bare = PlanPosition.of({"plan_id": "q", "compiled_as_of": {}, "compiled_in": "c1"})
    assert bare.dependencies == ()
    assert changes.stale_plans([bare], NOW, "c1") == {"q": Staleness("dependencies:", None, None, None)}


def test_offsets_of_another_incarnation_say_nothing(store):
    changes = KeyChanges(store)
    plans = [plan("p", ["policy:x"], {}, "old-cluster"), plan("q", ["policy:x"], {}, None)]
    stale = changes.stale_plans(plans, NOW, "c1")
    assert set(stale) == {"p", "q"} and stale["p"].dependency_key == "incarnation:"
    changes.record({("revocations", 0, 3): ["principal:m"]})
    changes.forget(["revocations"])
    assert changes.stale_plans([plan("p", ["principal:m"], {})], NOW, "c1") == {}


def test_a_file_that_applied_events_before_recording_changes_distrusts_older_plans(tmp_path):
    store = Store(tmp_path / "old.duckdb")
    try:
        store.save_offsets({("source-changes", 0): 40})
        changes = KeyChanges(store)
        stale = changes.stale_plans([plan("old", ["resource:a"], {"source-changes": {"0": 39}}),
                                     plan("new", ["resource:a"], {"source-changes": {"0": 40}})], NOW, "c1")
        assert stale == {"old": Staleness("offsets:source-changes/0", "source-changes", 0, 40)}
    finally:
        store.close()
    reopened = Store(tmp_path / "old.duckdb")  # the table exists now: no second snapshot of offsets
    try:
        reopened.save_offsets({("source-changes", 0): 90})
        assert KeyChanges(reopened).stale_plans([plan("new", ["resource:a"], {"source-changes": {"0": 40}})],
                                                NOW, "c1") == {}
    finally:
        reopened.close()


def test_recording_rolls_back_with_the_transaction(store):
    changes = KeyChanges(store)
    with pytest.raises(RuntimeError):
        with store.transaction():
            changes.record({("source-changes", 0, 1): ["resource:a"]})
            raise RuntimeError("apply failed")
    assert changes.last_change("resource:a") == {}


def test_one_hundred_thousand_plans_judged_in_one_query(store, capsys):
    changes = KeyChanges(store)
    changes.record({("source-changes", p, o): [f"resource:r{p}-{o}", f"scope:E{o % 500}/x"]
                    for p in range(4) for o in range(5000)})
    as_of = {"source-changes": {str(p): 4990 for p in range(4)}, "revocations": {"0": 10, "1": 10}}
    plans = [PlanPosition(f"plan-{i}", [f"resource:r{i % 4}-{i % 5000}", f"scope:E{i % 500}/x", f"principal:u{i % 97}",
                                        "policy:credit", "contract:credit.review", f"name-word:w{i % 13}",
                                        "time:2026-09-30T00:00:00Z"] + [f"trust:c{j}" for j in range(8)],
                          as_of, "c1") for i in range(100_000)]
    started = time.perf_counter()
    stale = changes.stale_plans(plans, NOW, "c1")
    took = time.perf_counter() - started
    # scope:E<k> changed at offsets >= 4990 for k in 490..499: those plans and the recent resources are stale.
    expected = {f"plan-{i}" for i in range(100_000) if i % 500 >= 490 or i % 5000 >= 4990}
    assert set(stale) == expected
    with capsys.disabled():
        print(f"\n100,000 plans (15 keys each) judged in {took:.2f} s")  # measured in bench/takeover.py, not asserted


def test_parked_plans_are_judged_in_place_like_the_records_they_came_from(store):
    """`stale_parked` (SQL over parked_plans, what a take-over uses) agrees with `stale_plans` over the records."""
    store.save_offsets({("clock", 0): 5})  # changes on clock/0 before offset 5 were never recorded
    changes = KeyChanges(store)
    with store.transaction():
        changes.record({("source-changes", 1, 7): ["resource:a", "scope:E/x"], ("revocations", 0, 3): ["principal:m"]})
    cases = {"before": (["resource:a"], {"source-changes": {"1": 7}, "clock": {"0": 5}}, "c1"),
             "after": (["resource:a"], {"source-changes": {"1": 8}, "clock": {"0": 5}}, "c1"),
             "missing": (["principal:m"], {"source-changes": {"1": 8}, "clock": {"0": 5}}, "c1"),
             "unrecorded": (["resource:b"], {"clock": {"0": 4}}, "c1"),
             "passed": (["time:2026-08-29T00:00:00Z"], {"clock": {"0": 5}}, "c1"),
             "future": (["time:2026-09-01T00:00:00Z", "resource:b"], {"clock": {"0": 5}}, "c1"),
             "foreign": (["policy:x"], {}, "old-cluster"), "no-cluster": (["policy:x"], {}, None),
             "no-keys": ([], {"clock": {"0": 5}}, "c1")}
    records = [{"plan_id": pid, "plan_key": f"pk-{pid}", "entity_id": f"E-{pid}", "dependencies": deps,
                "compiled_as_of": as_of, "compiled_in": cluster} for pid, (deps, as_of, cluster) in cases.items()]
    parked = ParkedPlans(store, 4)
    parked.park(records)
    expected = changes.stale_plans([PlanPosition.of(r) for r in records], NOW, "c1")
    assert set(expected) == {"before", "missing", "unrecorded", "passed", "foreign", "no-cluster", "no-keys"}
    assert changes.stale_parked(range(4), NOW, "c1") == expected
    assert changes.stale_parked(range(4), None, "c1") == changes.stale_plans(
        [PlanPosition.of(r) for r in records], None, "c1")
    some = {plan_partition(f"E-{pid}", 4) for pid in ("before", "after")}
    assert changes.stale_parked(sorted(some), NOW, "c1") == {
        r["plan_id"]: why for r in records if plan_partition(r["entity_id"], 4) in some
        for why in [expected.get(r["plan_id"])] if why}
    assert changes.stale_parked([], NOW, "c1") == {}


def test_a_file_with_changes_keyed_by_three_columns_is_rekeyed_on_one(tmp_path):
    # DuckDB scans the table to find rows of a composite key: the per-batch upsert grew with every key recorded.
    store = Store(tmp_path / "old.duckdb")
    try:
        store.db.execute("CREATE TABLE key_changes (dep_key VARCHAR, topic VARCHAR, partition INTEGER, "
                         "change_offset BIGINT, PRIMARY KEY (dep_key, topic, partition)); "
                         "CREATE TABLE key_changes_from (topic VARCHAR, partition INTEGER, from_offset BIGINT, "
                         "PRIMARY KEY (topic, partition)); "
                         "INSERT INTO key_changes VALUES ('resource:a', 'source-changes', 1, 7), "
                         "('resource:a', 'source-changes', 2, 3)")
        changes = KeyChanges(store)
        assert store.db.execute("SELECT constraint_column_names FROM duckdb_constraints() WHERE table_name = "
                                "'key_changes' AND constraint_type = 'PRIMARY KEY'").fetchone()[0] == ["change_key"]
        assert changes.last_change("resource:a") == {("source-changes", 1): 7, ("source-changes", 2): 3}
        with store.transaction():  # an older position never moves a key's last change back
            changes.record({("source-changes", 1, 5): ["resource:a"], ("source-changes", 2, 9): ["resource:a"]},
                           {("source-changes", 2, 9): "e9"})
        assert changes.last_change("resource:a") == {("source-changes", 1): 7, ("source-changes", 2): 9}
        stale = changes.stale_plans([plan("p", ["resource:a"], {"source-changes": {"1": 8, "2": 9}})], NOW, "c1")
        assert stale == {"p": Staleness("resource:a", "source-changes", 2, 9, "e9")}
    finally:
        store.close()


def test_keys_recorded_again_are_updated_in_place_to_their_latest_change(store):
    changes = KeyChanges(store)
    with store.transaction():
        changes.record({("source-changes", 0, 4): ["resource:a", "scope:E/x"]}, {("source-changes", 0, 4): "e4"})
    with store.transaction():  # both keys are the writer's own rows now: an update, not an upsert
        changes.record({("source-changes", 0, 9): ["resource:a", "scope:E/x"]}, {("source-changes", 0, 9): "e9"})
    with store.transaction():  # an older change (a restore replaying history) never moves a key back
        changes.record({("source-changes", 0, 2): ["resource:a"]}, {("source-changes", 0, 2): "e2"})
    rows = store.db.execute("SELECT dep_key, change_offset, event_id FROM key_changes ORDER BY dep_key").fetchall()
    assert rows == [("resource:a", 9, "e9"), ("scope:E/x", 9, "e9")]
    changes.forget(["source-changes"])  # rows gone: the next record inserts them again
    with store.transaction():
        changes.record({("source-changes", 0, 1): ["resource:a"]}, {("source-changes", 0, 1): "e1"})
    assert changes.last_change("resource:a") == {("source-changes", 0): 1}
