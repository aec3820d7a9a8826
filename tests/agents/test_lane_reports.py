"""Lane reports and the replica's lane reads under the orderings a broker produces (review of stop 45)."""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition

from agents.shards.lane_reports import LaneReports
from agents.shards.shard_restore import Shards
from agents.stream.lane_merge import LaneMerge
from agents.stream.lane_reader import Fetched, FetchQueue, LaneReader
from agents.stream.raw_message import RawMessage
from agents.stream.replica import Replica
from agents.stream.router import Lane, Router
from schemas.codec import decode
from schemas.plan_partition import plan_partition
from schemas.routed_batch import RECORD, Frame, RoutedBatch, pack, unpack
from state.shard_state import ShardState
from tests.agents.test_shard_apply import (A, B, letters, make, only, policy_version, raw,  # noqa: F401
                                           refused, resource, scenario, stored)

pytestmark = pytest.mark.timeout(60)


def _lane_history(messages: list[RawMessage], entity: str) -> tuple[int, list[RawMessage], list[RoutedBatch]]:
    lane = plan_partition(entity, 2)
    source = sorted((m for m in messages if m.topic == "source-changes"), key=lambda m: m.offset)
    router = Router(2, lambda m: decode(m.topic, m.key, m.value))
    return lane, source, [unpack(pack(router.route(0, [m], m.offset, m.offset + 1)[Lane("entity-changes", lane)]))
                          for m in source]


def test_a_report_read_after_the_history_it_covers_keeps_what_the_old_owner_accepted(make):  # noqa: F811 (the fixture)
    # As on the broker: the report follows on its lane what it covers, and the history is released a fetch before.
    y = make("y", only(B))
    history = scenario() + [raw(*resource("waiver-W9", entity=A))]
    y.apply(history)
    y.apply([raw(*policy_version(2, "2026-08-30T10:00:00Z", sources={"credit-committee": ["committee_record"]}))])
    lane, source, batches = _lane_history(history, A)
    end = source[-1].offset + 1
    merge = LaneMerge(2, {0: end, 1: 5})
    merge.gain(lane)
    for carrier, batch in enumerate(batches):
        merge.add("entity-changes", lane, carrier, batch)
    first = merge.release()
    merge.add("entity-changes", lane, len(batches), RoutedBatch(0, end, end, ()))
    merge.report("entity-changes", lane, 0, end)
    merge.add("entity-changes", lane, len(batches) + 1, RoutedBatch(1, 0, 5, ()))
    second = merge.release()
    assert second.caught_up == {lane}
    shard = ShardState(y.state.store, 2)
    shard.catching = frozenset({lane})
    shards = Shards(shard, y)
    shards.assigned = frozenset({lane})
    shards.restore(first.history + second.history)
    shards.caught_up(second.caught_up, second.reported)
    assert stored(y, "waiver-W9") == (1, A), "the restore dropped a resource its old owner accepted and reported"
    assert letters(y) == []


async def _acked(*_):
    future = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


async def _inline(fn, *args):
    return fn(*args)


def test_a_report_stops_at_the_oldest_dead_letter_not_acknowledged_and_no_other_record_holds_it(make):  # noqa: F811 (the fixture)
    y = make("y", lambda e: True)
    y.apply(scenario())
    applied = y.state.store.next_offsets()["source-changes"][0]
    sent: list[tuple[int, RoutedBatch]] = []

    async def send(lane, value, headers):
        sent.append((lane, unpack(value)))
        return await _acked()

    reports = LaneReports(ShardState(y.state.store, 2), y.state, _inline, send, "x-dead-letters")
    with y.state.store.transaction():  # a plan publication due: no reason to hold a report
        y.state.outbox.add_many([("x-plans", b"k", b"plan")], [("source-changes", 0, applied - 1)])
    assert asyncio.run(reports.report()) == 2  # both lanes, source partition 0
    assert {b.end for _, b in sent} == {applied}
    letter_at = applied - 3
    with y.state.store.transaction():
        y.state.outbox.add_many([("x-dead-letters", b"k", b"letter")], [("source-changes", 0, letter_at)])
        y.state.store.save_offsets({("source-changes", 0): applied + 5})
    sent.clear()
    asyncio.run(reports.report())
    assert sent == [], "reported past a dead letter still due"
    assert reports.figures()["reported"] == {"0": {"0": applied}, "1": {"0": applied}}


def _copy_holder(make):  # noqa: F811 (the fixture)
    """A worker holding lane A's copy (B owned) that judged one of lane A's records refused."""
    y = make("y", only(B))
    shard = ShardState(y.state.store, 2)
    lane_a, lane_b = plan_partition(A, 2), plan_partition(B, 2)
    shard.copies = frozenset({lane_a})
    y.owns_lane, y.mine = shard.owns_lane, shard.mine
    y.apply(scenario(), standby=True)
    bad = raw(*refused("waiver-bad", entity=A))
    y.apply([RawMessage(bad.topic, bad.partition, bad.offset, bad.key, bad.value, lane=lane_a)], standby=True)
    return y, Shards(shard, y), lane_a, lane_b, bad


def test_a_standby_copy_promoted_to_owner_dead_letters_what_it_left_to_the_dead_owner(make):  # noqa: F811 (the fixture)
    y, shards, lane_a, lane_b, bad = _copy_holder(make)
    shards.assigned = frozenset({lane_a, lane_b})
    with y.state.store.transaction():
        shards.move(shards.assigned)
    assert letters(y, standby=False) == [(bad.offset, False)], "the refusal the dead owner never sent went nowhere"


def test_a_letter_kept_for_a_lanes_owner_goes_once_its_report_covers_it(make):  # noqa: F811 (the fixture)
    y, shards, lane_a, lane_b, bad = _copy_holder(make)
    assert letters(y) == [(bad.offset, True)] and letters(y, standby=False) == []
    with y.state.store.transaction():
        y.state.outbox.reported({(lane_a, bad.partition): bad.offset})  # reported below it: still kept
        y.state.outbox.promote(bad.topic, bad.partition, 0, bad.offset + 1)  # the duty's promotion is not for it
    assert letters(y) == [(bad.offset, True)]
    with y.state.store.transaction():
        y.state.outbox.reported({(lane_a, bad.partition): bad.offset + 1})
    assert letters(y) == []
    shards.assigned = frozenset({lane_a, lane_b})
    with y.state.store.transaction():
        shards.move(shards.assigned)
    assert letters(y) == []  # its owner sent it: the promoted copy does not again


def test_a_lost_copy_forgets_the_letters_it_kept_and_they_never_hold_the_group_commit(make):  # noqa: F811
    from agents.stream.duty import _targets
    y, shards, lane_a, lane_b, bad = _copy_holder(make)
    floors = {(bad.topic, bad.partition): 0}
    assert _targets(y.state, floors) == {(bad.topic, bad.partition): bad.offset + 1}
    shards.standby_replicas = 0
    with y.state.store.transaction():
        shards.move(frozenset({lane_b}))  # the copy of lane A is let go
    assert letters(y) == []


def test_the_router_is_never_held_by_this_workers_writer():
    async def main():
        replica = Replica.__new__(Replica)  # only what `sent` reads
        replica.topics = {"shared-changes": "s", "entity-changes": "e", "source-changes": "x"}
        replica.early, replica._early_failed, replica._unapplied = None, False, deque()
        replica._queueing = asyncio.Lock()
        replica.lanes = LaneReader(1, frozenset)
        replica.lanes.start({}, {})
        replica._fetched = FetchQueue(1, 1)
        replica._fetched.put_nowait(Fetched([raw(*refused("w", entity=A))]))  # the writer is behind, its batch full
        batch = RoutedBatch(0, 0, 1, (Frame(RECORD, 0, None, b"k", b"v"),))
        await asyncio.wait_for(replica.sent([("shared-changes", 0, 0, batch)]), 1.0)
        assert replica.lanes.fed == 0  # left to the lane's reader
        replica._fetched = FetchQueue(1, 2)  # room in the batch waiting: joined to it, not waiting either
        replica._fetched.put_nowait(Fetched([raw(*refused("w", entity=A))]))
        await asyncio.wait_for(replica.sent([("shared-changes", 0, 0, batch)]), 1.0)
        assert replica.lanes.fed == 1 and replica._fetched.qsize() == 1
        assert [m.offset for m in replica._fetched.get_nowait().messages][-1:] == [0]
    asyncio.run(main())


def _carrier(offset: int, batch: RoutedBatch) -> SimpleNamespace:
    return SimpleNamespace(offset=offset, value=pack(batch), headers=(), key=None, timestamp=None)


def test_a_fetch_taken_before_a_lane_was_gained_again_does_not_skip_the_lanes_history():
    logical = {"e": "entity-changes", "s": "shared-changes"}
    reader = LaneReader(1, lambda: frozenset({0}))
    reader.start({"source-changes": {0: 10}}, {"entity-changes": {0: 5}, "shared-changes": {0: 3}})
    read_at = reader.epoch  # the fetch loop fetched carrier 5, then waited for its turn to merge
    stale = {TopicPartition("e", 0): [_carrier(5, RoutedBatch(0, 10, 11, (Frame(RECORD, 10, None, b"k", b"v"),)))]}
    reader.lose(frozenset({0}))  # meanwhile the lane was lost, and gained again (read from its start)
    reader.gain(frozenset({0}))
    reader.fetched(stale, logical, read_at)
    history = RoutedBatch(0, 0, 10, (Frame(RECORD, 3, None, b"k", b"h"),))
    out = reader.fetched({TopicPartition("e", 0): [_carrier(0, history)]}, logical, reader.epoch)
    assert [m.offset for m in out.history] == [3], "the gained lane's history was dropped"
