"""Letters kept for an entity lane's owner: pruned by its reports, sent where the lane is owned, never lost."""
from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace

from aiokafka import TopicPartition

from agents.stream.lane_reader import Fetched, FetchQueue, LaneReader
from agents.stream.raw_message import RawMessage
from agents.stream.replica import Replica
from schemas.routed_batch import RECORD, REPORT_HEADER, Frame, RoutedBatch, pack

LOGICAL = {"e": "entity-changes", "s": "shared-changes"}


def _carrier(offset, batch, report=False):
    return SimpleNamespace(offset=offset, value=pack(batch), headers=[(REPORT_HEADER, b"1")] if report else (),
                           key=None, timestamp=None)


def _replica():
    r = Replica.__new__(Replica)
    r.topics = {"shared-changes": "s", "entity-changes": "e", "source-changes": "x"}
    r.early, r._early_failed, r._unapplied = None, False, deque()
    r._queueing = asyncio.Lock()
    r.lanes = LaneReader(1, lambda: frozenset({0}))
    r.lanes.start({"source-changes": {0: 0}}, {})
    return r


def test_a_report_fetched_alone_reaches_the_writer():
    """The owner reports ~1 s after its last batch: on an idle lane the report is the only record of its fetch."""
    async def main():
        r = _replica()
        q = FetchQueue(8, 500)
        # A refused record at source offset 0, through the entity lane and the shared lane: released and queued.
        rec = RoutedBatch(0, 0, 1, (Frame(RECORD, 0, None, b"k", b"{bad"),))
        first = r.lanes.fetched({TopicPartition("e", 0): [_carrier(0, rec)],
                                 TopicPartition("s", 0): [_carrier(0, RoutedBatch(0, 0, 1, ()))]}, LOGICAL, 0)
        await r._queue(q, first)
        assert [m.offset for m in q.get_nowait().messages] == [0]
        # A source record of an entity in a lane this worker does not hold: only marks move here (queued).
        marks = r.lanes.fetched({TopicPartition("e", 0): [_carrier(1, RoutedBatch(0, 1, 2, ()))],
                                 TopicPartition("s", 0): [_carrier(1, RoutedBatch(0, 1, 2, ()))]}, LOGICAL, 0)
        await r._queue(q, marks)
        assert q.qsize() == 1
        q.get_nowait()
        # Then the owner's report on the lane: it dead-lettered partition 0 below 2 (the writer applied it all).
        report = r.lanes.fetched({TopicPartition("e", 0): [_carrier(2, RoutedBatch(0, 2, 2, ()), report=True)]},
                                 LOGICAL, 0)
        assert report.reports == {(0, 0): 2}
        await r._queue(q, report)
        assert not q.empty(), "the report was dropped by Replica._queue: the kept letter is never pruned"
    asyncio.run(main())


def test_a_report_read_before_its_records_are_released_still_covers_them():
    """The report follows its records on the entity lane, but the shared lane's mark may come a fetch later:
    the records are released (and their letters kept) after the only report that covers them was applied."""
    r = _replica()
    rec = RoutedBatch(0, 0, 1, (Frame(RECORD, 0, None, b"k", b"{bad"),))
    first = r.lanes.fetched({TopicPartition("e", 0): [_carrier(0, rec),
                                                       _carrier(1, RoutedBatch(0, 1, 1, ()), report=True)]},
                            LOGICAL, 0)
    assert first.messages == [] and first.reports == {}  # nothing released (the shared lane lags): held back
    second = r.lanes.fetched({TopicPartition("s", 0): [_carrier(0, RoutedBatch(0, 0, 1, ()))]}, LOGICAL, 0)
    assert [m.offset for m in second.messages] == [0]
    assert second.reports == {(0, 0): 1}, "the record's letter is kept after the report that covers it"


# -- kept letters lost: the copy's promotion depends on `ShardState.copies`, which is not in the file ----------
import pytest  # noqa: E402

from agents.shards.lane_reports import LaneReports  # noqa: E402
from agents.shards.shard_restore import Shards  # noqa: E402
from state.shard_state import ShardState  # noqa: E402
from tests.agents.test_lane_reports import _copy_holder  # noqa: E402
from tests.agents.test_shard_apply import letters, make  # noqa: E402,F401


def _own_report_covers_it(y, shard, bad):
    """What this worker, now the lane's owner, reports (and reads back on its lane): the kept row goes."""
    reports = LaneReports(shard, y.state, None, None, "x-dead-letters")
    positions, owned, kept = reports._look()
    lane = shard.partition_of("ATLAS-IN-01")
    upto = min(positions[bad.partition], kept.get((lane, bad.partition), positions[bad.partition]))
    assert lane in owned
    with y.state.store.transaction():
        y.state.outbox.reported({(lane, bad.partition): upto})


def test_a_copy_promoted_after_a_restart_sends_what_it_kept(make):  # noqa: F811
    y, shards, lane_a, lane_b, bad = _copy_holder(make)
    assert letters(y) == [(bad.offset, True)]
    # The worker restarts (the owner of lane A is dead): `copies` is not in the file, `held` is.
    shard = ShardState(y.state.store, 2)
    y.owns_lane, y.mine = shard.owns_lane, shard.mine
    shards = Shards(shard, y)
    shards.assigned = frozenset({lane_a, lane_b})
    with y.state.store.transaction():
        shards.move(shards.assigned)
    promoted = letters(y, standby=False)
    _own_report_covers_it(y, shard, bad)
    assert promoted or letters(y, standby=False), f"the kept letter was never sent; now: {letters(y)}"


def test_a_copy_promoted_by_a_move_retried_after_a_rollback_sends_what_it_kept(make):  # noqa: F811
    y, shards, lane_a, lane_b, bad = _copy_holder(make)
    shards.assigned = frozenset({lane_a, lane_b})
    with pytest.raises(RuntimeError):
        with y.state.store.transaction():
            shards.move(shards.assigned)
            raise RuntimeError("the take-over failed after the move (Ownership.change)")
    shards.reload()  # as Ownership.follow does
    assert letters(y) == [(bad.offset, True)]  # rolled back: still kept
    with y.state.store.transaction():
        shards.move(shards.assigned)  # ShardFollower's retry
    assert letters(y, standby=False), f"the retried move did not promote the kept letter: {letters(y)}"


def test_the_router_is_never_held_even_when_its_send_releases_more_than_it_carries():
    """`FetchQueue.waits` is asked with the sent frames, but merging them releases what other lanes held back."""
    async def main():
        r = _replica()
        # The reader has the entity lane's frame at source offset 0; the shared lane's mark is not there yet.
        held_back = r.lanes.fetched({TopicPartition("e", 0): [
            _carrier(0, RoutedBatch(0, 0, 1, (Frame(RECORD, 0, None, b"k", b"v"),)))]}, LOGICAL, 0)
        assert held_back.messages == []
        r._fetched = FetchQueue(1, 2)  # the writer is behind: one batch of the batch size waiting
        r._fetched.put_nowait(Fetched([RawMessage("source-changes", 0, 9, b"k", b"v")] * 2))
        # This worker's router had the shared lane's mark acknowledged (no frame of its own)
        await asyncio.wait_for(r.sent([("shared-changes", 0, 0, RoutedBatch(0, 0, 1, ()))]), 1.0)
    asyncio.run(main())


def test_a_lane_gained_as_owner_sends_the_letters_of_records_applied_live_before_it_caught_up(make):  # noqa: F811
    """A gained lane joins the merge one source partition at a time: its live records of a joined partition are
    applied before it is held, judged as a copy's (kept), and neither promoted nor sent after the move."""
    from schemas.plan_partition import plan_partition
    from tests.agents.test_shard_apply import A, B, only, raw, refused, scenario
    y = make("y", only(B))
    shard = ShardState(y.state.store, 2)
    lane_a, lane_b = plan_partition(A, 2), plan_partition(B, 2)
    shard.held = frozenset({lane_b})  # (in memory only: held as the file would have it before the gain)
    shard.catching = frozenset({lane_a})  # gained as its owner, still catching up
    y.owns_lane, y.mine = shard.owns_lane, shard.mine
    y.apply(scenario(), standby=True)
    bad = raw(*refused("waiver-live", entity=A))
    y.apply([RawMessage(bad.topic, bad.partition, bad.offset, bad.key, bad.value, lane=lane_a)], standby=True)
    shards = Shards(shard, y)
    shards.assigned = frozenset({lane_a, lane_b})
    shards.caught_up(frozenset({lane_a}))
    with y.state.store.transaction():
        shards.move(shards.assigned)
    assert letters(y, standby=False), f"the refusal's letter is neither sent nor promoted: {letters(y)}"


def test_a_lane_gained_again_while_batches_wait_is_not_caught_up_by_the_read_before():
    """Two fetches joined for the writer: the first caught the lane up, then it was lost and gained again."""
    old = Fetched([])
    old.caught_up, old.reported = frozenset({0, 1}), {0: {0: 5}, 1: {0: 7}}
    old.history = [RawMessage("source-changes", 0, 3, b"k", b"v", lane=0),
                   RawMessage("source-changes", 0, 4, b"k", b"v", lane=1)]
    new = Fetched([], gained=frozenset({0}))
    new.history = [RawMessage("source-changes", 0, 0, b"k", b"v", lane=0)]
    joined = old.join(new)
    assert joined.caught_up == frozenset({1}) and joined.reported == {1: {0: 7}}
    assert [(m.lane, m.offset) for m in joined.history] == [(1, 4), (0, 0)]
    assert joined.gained == frozenset({0})


def test_a_failing_prune_by_reports_never_stops_applying(make, monkeypatch):  # noqa: F811
    """A DuckDB error while dropping covered letters leaves the batch applied and the letter kept (sent twice at
    worst), and the replica goes on."""
    y, _, lane_a, _, bad = _copy_holder(make)
    replica = Replica.__new__(Replica)
    replica.applier, replica.lanes_applied, replica.after_commit = y, None, None

    def broken(reports):
        raise RuntimeError("disk full")
    monkeypatch.setattr(y.state.outbox, "reported", broken)
    batch = Fetched([])
    batch.reports = {(lane_a, bad.partition): bad.offset + 1}
    replica._apply(batch)
    assert letters(y) == [(bad.offset, True)]
