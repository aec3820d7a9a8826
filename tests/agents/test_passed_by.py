"""Other shards' resource changes passed by unread, and judged by whoever gains their input partition."""

from __future__ import annotations

import itertools

import orjson
import pytest

from agents.plans.plan_writer import PlanWriter
from agents.stream.event_apply import EventApplier, RawMessage
from agents.stream.passed_by import judge_passed, passed_by
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS
from tests.events import policy_version, resource

pytestmark = pytest.mark.timeout(90)

A, B = "ATLAS-IN-01", "BOREAL-UK-02"
SC = "source-changes"
_offsets = itertools.count(1000)


def raw(event: tuple[str, dict] | bytes | None, partition: int = 0, offset: int | None = None) -> RawMessage:
    value = event if isinstance(event, bytes) or event is None else orjson.dumps(event[1])
    return RawMessage(SC, partition, next(_offsets) if offset is None else offset, b"k", value)


def only(entity: str):
    return lambda e: e is None or e == entity


def nothing_held(ids):
    return set()


def bad(rid: str, entity: str) -> tuple[str, dict]:
    """Placed at a glance (a resource upsert naming its id and entity), refused by the schema."""
    return resource(rid, entity=entity, tokens="many")


def test_another_shards_upserts_are_passed_by_only_on_partitions_this_worker_does_not_judge():
    batch = [raw(resource("r1", entity=B), 0), raw(resource("r2", entity=B), 1), raw(resource("r3", entity=A), 0)]
    passed = passed_by(batch, {}, only(A), lambda topic, partition: partition == 1, nothing_held)
    assert set(passed) == {0} and passed[0].resource_id == "r1", "r2 is on a judged partition, r3 about this worker's entity"


def test_a_resource_held_here_or_upserted_here_earlier_in_the_batch_is_read_whatever_entity_it_moves_to():
    batch = [raw(resource("held", entity=B)), raw(resource("new", entity=A)), raw(resource("new", entity=B, version=2)),
             raw(resource("other", entity=B))]
    passed = passed_by(batch, {}, only(A), lambda topic, partition: False, lambda ids: {"held"} & set(ids))
    assert set(passed) == {3}


@pytest.mark.parametrize("value", [None, b"{not json", orjson.dumps({"kind": "resource", "op": "delete", "id": "x"}),
                                   orjson.dumps({"payload": {"op": "c"}})])
def test_a_batch_with_a_change_the_glance_cannot_place_is_read_whole(value):
    batch = [raw(resource("r1", entity=B)), raw(value)]
    assert passed_by(batch, {}, only(A), lambda topic, partition: False, nothing_held) == {}


def test_records_already_applied_and_other_topics_are_left_to_the_applier():
    batch = [RawMessage("revocations", 0, 1, b"k", b"{}"), raw(resource("r1", entity=B), 0, offset=5)]
    assert passed_by(batch, {SC: {0: 6}}, only(A), lambda topic, partition: False, nothing_held) == {}


@pytest.fixture
def applier(tmp_path):
    state = LocalState.open(tmp_path / "w.duckdb")
    applier = EventApplier(state, PlanWriter(state, lambda n: f"x-{n}"), mine=only(A),
                           duty=lambda topic, partition: partition == 1)
    scenario = [orjson.loads(line) for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines()]
    applier.apply([RawMessage(item["topic"], 0, i, b"k", orjson.dumps(item["event"])) for i, item in
                   enumerate(scenario)])
    yield applier
    state.close()


def letters(applier: EventApplier) -> list[tuple]:
    return applier.state.store.db.execute("SELECT src_partition, src_offset, standby FROM outbox "
                                          "WHERE topic = 'x-dead-letters' ORDER BY ALL").fetchall()


def test_a_broken_change_passed_by_is_left_to_the_duty_owner_and_one_on_a_judged_partition_waits_on_standby(applier):
    applier.apply([raw(bad("b0", B), 0, offset=10), raw(bad("b1", B), 1, offset=10)], standby=True)
    assert letters(applier) == [(1, 10, True)]
    counts = applier.state.store.counters()
    assert counts["resources_passed_by"] == counts["resources_of_other_shards"] == 1


def test_a_held_resource_moving_to_another_shard_is_still_applied_here(applier):
    applier.apply([raw(resource("mover", entity=A), 0, offset=20)])
    applier.apply([raw(resource("mover", entity=B, version=2), 0, offset=21)])
    assert applier.state.store.db.execute("SELECT deleted FROM resources WHERE id = 'mover'").fetchone() == (True,)


def passed_rows(applier: EventApplier) -> list[tuple]:
    """Kept on partition 1 (the scenario's own records on partition 0 about B are passed by too)."""
    return applier.state.store.db.execute("SELECT src_partition, src_offset FROM passed_records "
                                          "WHERE src_partition = 1 ORDER BY ALL").fetchall()


def judged(applier: EventApplier, since=None) -> int:
    with applier.state.store.transaction():
        return judge_passed(applier, since)


def test_the_new_duty_owner_judges_what_it_passed_by_from_the_group_offset_on(applier):
    """Kept in the file with the offsets that passed them; judged once, from the floor on."""
    applier.duty = lambda topic, partition: False  # partition 1 is another worker's to judge, until it is gained
    records = [resource("ok", entity=B), bad("early", B), bad("late", B), bad("mine", A)]
    applier.apply([raw(event, 1, offset=i) for i, event in enumerate(records)], standby=True)
    assert letters(applier) == [(1, 3, True)], "only the change about this worker's entity was judged"
    assert passed_rows(applier) == [(1, 0), (1, 1), (1, 2)]
    assert judged(applier, {(SC, 1): 2}) == 1
    assert letters(applier) == [(1, 2, True), (1, 3, True)], "below the floor the old owner judged; 3 had its letter"
    assert passed_rows(applier) == [], "the gained partition's records are judged or were their owner's"
    assert judged(applier, {(SC, 1): 0}) == 0, "judged again, nothing is queued twice"
    assert applier.state.store.counters()["passed_by_judged"] == 1


def test_what_this_worker_decoded_itself_is_never_judged_again(applier):
    """A resource of its own entity applied under one policy is not refused at take-on under a tighter one; a
    letter it published while it owned the partition is not queued again when it regains the partition."""
    applier.apply([raw(resource("waiver-W9", entity=A), 1, offset=0), raw(bad("b0", B), 1, offset=1)], standby=True)
    tightened = policy_version(2, "2026-08-30T10:00:00Z", sources={"credit-committee": ["committee_record"]})
    applier.apply([RawMessage("policy-versions", 0, 100, b"k", orjson.dumps(tightened[1]))])
    with applier.state.store.transaction():  # its letter published, acknowledged and forgotten
        applier.state.store.db.execute("DELETE FROM outbox WHERE topic = 'x-dead-letters'")
    assert judged(applier, {(SC, 1): 0}) == 0
    assert letters(applier) == []


def test_a_rebase_sends_the_letters_of_what_was_passed_by(applier):
    """Every standby letter of a reset topic goes out (the old records can never be promoted), and so do the
    letters owed by records passed by: nobody can read those records again."""
    from agents.stream.replica import _rebase
    applier.duty = lambda topic, partition: False
    applier.apply([raw(bad("b0", B), 1, offset=0)], standby=True)
    assert letters(applier) == []
    _rebase(applier, "new-cluster", [SC])
    assert letters(applier) == [(1, 0, False)]
    assert passed_rows(applier) == []


def test_records_the_group_committed_past_are_forgotten(applier):
    applier.duty = lambda topic, partition: False
    applier.apply([raw(bad(f"b{i}", B), 1, offset=i) for i in range(3)], standby=True)
    with applier.state.store.transaction():
        applier.state.passed.prune({(SC, 1): 2, ("clock", 0): 5})
    assert passed_rows(applier) == [(1, 2)]


def test_a_topic_blocked_on_a_reset_keeps_its_rows_while_the_others_are_pruned(applier):
    """A worker blocked on one reset topic still applies the others: their rows must not pile up."""
    from agents.worker.build import _prune
    applier.duty = lambda topic, partition: False
    applier.apply([raw(bad(f"b{i}", B), 1, offset=i) for i in range(3)], standby=True)
    _prune(applier.state, {(SC, 1): 2}, blocked=frozenset({SC}))
    assert passed_rows(applier) == [(1, 0), (1, 1), (1, 2)], "a blocked topic's offsets name another incarnation"
    _prune(applier.state, {(SC, 1): 2}, blocked=frozenset({"clock"}))
    assert passed_rows(applier) == [(1, 2)]


@pytest.mark.parametrize("tightened", [True, False])
def test_a_passed_record_is_refused_by_the_rules_it_was_passed_under_not_those_of_the_take_on(applier, tightened):
    """A worker that decoded the record judged it by the rules of its batch: the judge must agree, whichever way
    the policy moved before the partition came to this worker."""
    applier.duty = lambda topic, partition: False
    # The scenario's bundle lets credit-committee assert committee_record and approved_waiver, not facility_record.
    change = resource("r0", entity=B) if tightened else resource("r0", entity=B, cls="facility_record")
    applier.apply([raw(change, 1, offset=0)], standby=True)
    sources = {"credit-committee": ["committee_record"]} if tightened else \
        {"credit-committee": ["committee_record", "approved_waiver", "facility_record"]}
    applier.apply([RawMessage("policy-versions", 0, 100, b"k", orjson.dumps(
        policy_version(2, "2026-08-30T10:00:00Z", sources=sources)[1]))])
    judged(applier, {(SC, 1): 0})
    assert letters(applier) == ([] if tightened else [(1, 0, True)])
