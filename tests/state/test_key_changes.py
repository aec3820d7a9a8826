"""Key change positions and the one-query staleness judgement of plans records."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from state.key_changes import KeyChanges, PlanPosition, Staleness
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
        print(f"\n100,000 plans (15 keys each) judged in {took:.2f} s")
    assert took < 20
