"""Restoring plans from their `plans` records: the same rows and answers as compiling them, in bulk."""

from __future__ import annotations

import time

import orjson
import pytest

from agents.plans.plan_writer import PlanWriter
from agents.stream.event_apply import EventApplier, RawMessage
from agents.web.query import QueryService
from schemas.plan_partition import plan_partition
from state.local_state import LocalState
from state.key_changes import KeyChanges, PlanPosition
from state.parked_plans import ParkedPlans
from state.plan_restore import ParkedRestore, restore, restore_parked
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST

TABLES = {"plans": "plan_id", "plan_heads": "plan_key", "dependency_index": "plan_key, dep_key",
          "receipts": "receipt_id"}


def _loaded(path, before=None) -> tuple[LocalState, EventApplier]:
    """A worker's state after applying the Atlas scenario at the same offsets as every other replica."""
    state = LocalState.open(path)
    if before is not None:
        before(state)
    inv = EventApplier(state, PlanWriter(state, lambda name: f"x-{name}"))
    inv.apply([RawMessage(item["topic"], 0, offset, b"k", orjson.dumps(item["event"])) for offset, item in
               enumerate(map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines()))])
    return state, inv


@pytest.fixture
def compiled(tmp_path):
    """A worker that compiled the Atlas plan, and the `plan-dependencies` record it published (keys and receipt)."""
    state, inv = _loaded(tmp_path / "owner.duckdb")
    answer = QueryService(state, inv.plans).select(ATLAS_REQUEST)
    out = {topic: orjson.loads(value) for _, topic, _, value in state.outbox.pending()}
    record = out["x-plan-dependencies"]
    assert record["dependencies"] == out["x-receipts"]["dependencies"] and record["receipt"] == out["x-receipts"]
    yield state, inv, answer, record
    state.close()


def _rows(state: LocalState) -> dict[str, list[tuple]]:
    return {t: state.store.db.execute(f"SELECT * FROM {t} ORDER BY {order}").fetchall() for t, order in TABLES.items()}


def test_a_restored_plan_has_the_rows_and_answer_of_the_compiled_one(compiled, tmp_path):
    owner, owner_inv, answer, record = compiled
    taker, taker_inv = _loaded(tmp_path / "taker.duckdb")
    try:
        assert _rows(taker)["plans"] == []
        with taker.store.transaction():
            result = restore(taker.store, [record], range(2), partitions=2, compiled_at=taker.store.now())
        assert result.restored == [record["plan_id"]] and not result.unrestorable
        assert _rows(taker) == _rows(owner) and len(_rows(taker)["receipts"]) == 1  # the receipt came along
        assert sorted(owner.index.affected_pairs(list(record["dependencies"]))) == sorted(
            taker.index.affected_pairs(list(record["dependencies"])))
        served = QueryService(taker, taker_inv.plans).select(ATLAS_REQUEST)
        assert served["served_from"] == "cache"
        cached = QueryService(owner, owner_inv.plans).select(ATLAS_REQUEST)
        assert {k: v for k, v in served.items() if k != "freshness_token"} == {
            k: v for k, v in cached.items() if k != "freshness_token"}
        assert answer["plan_id"] == served["plan_id"]
    finally:
        taker.close()


def test_only_owned_whole_records_are_restored(compiled, tmp_path):
    _, _, _, record = compiled
    taker, _ = _loaded(tmp_path / "taker.duckdb")
    try:
        mine = plan_partition(record["entity_id"], 4)
        other = {k: v for k, v in record.items() if k != "dependencies"}
        compact = dict(record, plan_id="plan-compact", admitted=[dict(i, content_omitted=True)
                                                                  for i in record["admitted"]])
        result = restore(taker.store, [record, other, compact, {"plan_id": 7}, "junk"], [(mine + 1) % 4],
                         partitions=4, compiled_at=None)
        assert result.restored == [] and result.not_owned == 3 and len(result.unrestorable) == 2
        result = restore(taker.store, [other, compact, {"plan_id": "x", "entity_id": record["entity_id"]}], [mine],
                         partitions=4, compiled_at=None)
        assert result.restored == [] and [p for p, _ in result.unrestorable] == [record["plan_id"], "plan-compact",
                                                                                  "x"]
        assert _rows(taker) == {"plans": [], "plan_heads": [], "dependency_index": [], "receipts": []}
    finally:
        taker.close()


def test_the_most_advanced_record_of_a_key_wins_and_invalidated_ids_stay_invalidated(compiled, tmp_path):
    _, _, _, record = compiled
    taker, _ = _loaded(tmp_path / "taker.duckdb")
    try:
        newer = dict(record, plan_id="plan-newer", dependencies=["resource:new"],
                     compiled_as_of={"source-changes": {"0": 10_000}})
        result = restore(taker.store, [newer, record], range(2), partitions=2, compiled_at=None)
        assert result.restored == ["plan-newer"]
        assert taker.plans.heads([record["plan_key"]])[record["plan_key"]][0] == "plan-newer"
        assert taker.index.affected_pairs(["resource:new"]) == [(record["plan_key"], "resource:new")]
        assert taker.index.affected_pairs(list(record["dependencies"])) == []
        taker.plans.invalidate_many([("plan-newer", "source_changed", {}, None)], None)
        taker.plans.drop_heads([record["plan_key"]])
        result = restore(taker.store, [newer], range(2), partitions=2, compiled_at=None)
        assert result.restored == [] and result.known_invalidated == ["plan-newer"]
        # Its key's head again, still invalidated (the caller announces it again and requeues the key).
        [(plan_id, _, status)] = taker.plans.heads([record["plan_key"]]).values()
        assert (plan_id, status) == ("plan-newer", "invalidated")
    finally:
        taker.close()


def test_a_take_over_judges_then_restores_what_no_later_change_touched(compiled, tmp_path):
    _, _, _, record = compiled
    taker, _ = _loaded(tmp_path / "taker.duckdb", before=lambda s: KeyChanges(s.store))  # recording from the start
    try:
        changes = KeyChanges(taker.store)
        [(topic, by_partition)] = [(t, ps) for t, ps in record["compiled_as_of"].items() if t == "source-changes"]
        partition, next_offset = next(iter(by_partition.items()))
        touched = dict(record, compiled_in="c1")
        untouched = dict(record, compiled_in="c1", plan_id="plan-other", plan_key="pk-other",
                         dependencies=[k for k in record["dependencies"] if k != "principal:maya"])
        assert len(untouched["dependencies"]) == len(record["dependencies"]) - 1
        with taker.store.transaction():
            changes.record({(topic, int(partition), next_offset): ["principal:maya"]})
        with taker.store.transaction():
            stale = changes.stale_plans([PlanPosition.of(touched), PlanPosition.of(untouched)], taker.store.now(), "c1")
            result = restore(taker.store, [r for r in (touched, untouched) if r["plan_id"] not in stale], range(2),
                             partitions=2, compiled_at=taker.store.now())
        assert set(stale) == {record["plan_id"]} and stale[record["plan_id"]].offset == next_offset
        assert result.restored == ["plan-other"]
        assert taker.index.affected_pairs(["principal:maya"]) == []
    finally:
        taker.close()


def test_one_hundred_thousand_plans_are_taken_over_in_bulk(compiled, tmp_path, capsys):
    _, _, _, record = compiled
    taker = LocalState.open(tmp_path / "bulk.duckdb")
    try:
        records = [dict(record, plan_id=f"plan-{i}", plan_key=f"pk-{i}", entity_id=f"E-{i}",
                        dependencies=record["dependencies"] + [f"resource:r{i}"]) for i in range(100_000)]
        owned = [0, 1, 2, 3]
        started = time.perf_counter()
        with taker.store.transaction():
            result = restore(taker.store, records, owned, partitions=4, compiled_at=None)
        took = time.perf_counter() - started
        expected = 100_000
        assert len(result.restored) == expected and result.not_owned == 0
        assert taker.store.db.execute("SELECT count(*) FROM plan_heads").fetchone()[0] == expected
        assert taker.index.size() == expected * (len(record["dependencies"]) + 1)
        with capsys.disabled():
            print(f"\n100,000 owned plans records restored in {took:.2f} s (commit included)")
    finally:
        taker.close()


def test_a_receipt_whose_ids_are_not_strings_is_stored_by_neither_restore(compiled, tmp_path):
    # The parked path compared the ids as extracted text: a receipt with plan_id 41 and receipt_id 42
    # (numbers) passed for a record of plan "41", receipt "42", and was stored and served as that plan's.
    _, _, _, record = compiled
    mine = plan_partition(record["entity_id"], 4)
    poisoned = dict(record, plan_id="41", plan_key="pk-9", receipt_id="42",
                    receipt=dict(record["receipt"], receipt_id=42, plan_id=41))
    by_records, _ = _loaded(tmp_path / "records.duckdb")
    in_place, _ = _loaded(tmp_path / "parked.duckdb")
    try:
        restore(by_records.store, [poisoned], [mine], partitions=4, compiled_at=by_records.store.now())
        ParkedPlans(in_place.store, 4).park([poisoned])
        assert restore_parked(in_place.store, [mine], in_place.store.now()).restored == 1
        assert _rows(in_place)["receipts"] == _rows(by_records)["receipts"] == []
    finally:
        by_records.close()
        in_place.close()


def test_restoring_parked_plans_in_place_writes_what_restoring_their_records_does(compiled, tmp_path):
    _, _, _, record = compiled
    mine = plan_partition(record["entity_id"], 4)
    newer = dict(record, plan_id="plan-newer", plan_key="pk-2", compiled_as_of={"source-changes": {"0": 10_000}})
    compact = dict(record, plan_id="plan-compact", plan_key="pk-3",
                   admitted=[dict(i, content_omitted=True) for i in record["admitted"]])
    elsewhere = dict(record, plan_id="plan-elsewhere", plan_key="pk-4", entity_id="E-other")
    while plan_partition(elsewhere["entity_id"], 4) == mine:
        elsewhere["entity_id"] += "x"
    records = [record, newer, compact, elsewhere]
    by_records, _ = _loaded(tmp_path / "records.duckdb")
    in_place, _ = _loaded(tmp_path / "parked.duckdb")
    try:
        for state in (by_records, in_place):  # one id already invalidated here: it stays so
            state.store.db.execute("INSERT INTO plans (plan_id, plan_key, status) VALUES ('plan-newer', 'pk-2', "
                                   "'invalidated')")
        expected = restore(by_records.store, records, [mine], partitions=4, compiled_at=by_records.store.now())
        ParkedPlans(in_place.store, 4).park(records)
        result = restore_parked(in_place.store, [mine], in_place.store.now())
        assert _rows(in_place) == _rows(by_records) and len(_rows(in_place)["dependency_index"]) > 0
        # Only the original's receipt: the copies carry a receipt of another plan id, which is not theirs.
        assert [r[:2] for r in _rows(in_place)["receipts"]] == [(record["receipt_id"], record["plan_id"])]
        assert (result.considered, result.restored, result.unrestorable) == (3, 1, 1)
        assert result.known_invalidated == expected.known_invalidated == ["plan-newer"]
        assert expected.restored == [record["plan_id"]] and len(expected.unrestorable) == 1
        assert restore_parked(in_place.store, [], None) == ParkedRestore()
    finally:
        by_records.close()
        in_place.close()
