"""Stop 57's review of the plan feed parking only held partitions: each case failed before its fix."""

from __future__ import annotations

import asyncio

import pytest

from agents.shards.shard_follow import ShardFollower
from agents.shards.shard_restore import Shards
from agents.stream.plan_feed import PlanFeed
from state.shard_state import ShardState
from tests.agents.test_ownership import ATLAS, Node, _event
from tests.agents.test_read_ahead import _Feed, _inline, _Ownership, _published, _Rebalances, _Replica
from tests.agents.test_shard_apply import make  # noqa: F401
from tests.conftest import ATLAS_REQUEST
from tests.events import resource

pytestmark = pytest.mark.timeout(60)


def _feed(node: Node, keeps, following=None) -> PlanFeed:
    """A feed whose loop follows `following` (what is held, `keeps()`, unless given)."""
    feed = PlanFeed(node.state, node.ownership, node.parked, None, "", "x-plan-dependencies", keeps=keeps)
    feed.following = frozenset(keeps() if following is None else following)
    return feed


def _own_records(node: Node) -> list[bytes]:
    return [(k, v) for _, t, k, v in node.state.outbox.pending(1000) if t == "x-plan-dependencies" and v]


@pytest.fixture
def one(tmp_path):
    b = Node(tmp_path / "b.duckdb")
    b.apply(*ATLAS)
    yield b
    b.state.close()


def test_a_known_plan_read_after_a_stalled_take_over_is_never_made_current_nor_announced(one):
    """b owned the partition and compiled X; it let the partition go (heads dropped; the feed dropped its parked
    rows). It gains it back (its peer died); the feed is still reading the partition from its start when the wait
    bound ends, so the take-over finds nothing parked. X's record is then read: `_settle` parks it and adopts only
    plans not `known` -- b stored X long ago, so X is not judged. Nobody follows X: a change to its dependency
    is never announced."""
    b = one
    b.own(0, 1)
    plan = b.query.select(ATLAS_REQUEST)
    [(key, value)] = _own_records(b)
    home = b.parked.partition_of(plan["entity_id"])
    b.own()  # let go (the feed would also drop the partition's parked rows and position: none here)
    assert b.parked.size() == 0
    b.own(0, 1)  # gained back after FRESHPLAN_RESTORE_STALL_SECONDS, the feed still behind: nothing parked
    _feed(b, lambda: frozenset({0, 1}))._settle([(home, 0, value, key)])  # "judged as it arrives"
    assert b.parked.size() == 1
    b.apply(_event(resource("approved-waiver-W2")))  # a dependency of X changes
    announced = [r["plan_id"] for r in b.published("plan-invalidations")]
    heads = b.state.store.db.execute("SELECT plan_id FROM plan_heads").fetchall()
    assert plan["plan_id"] in announced or heads == [(plan["plan_id"],)], (
        f"X ({plan['plan_id']}) read after the take-over was neither made current (heads {heads}) nor announced "
        f"(announced {announced}): its invalidation is lost")


async def test_the_wait_bound_started_by_an_abandoned_assignment_lets_a_later_one_take_over_unread(make):  # noqa: F811
    """The follower waits on {0,1} (the feed behind on 1); the group moves on before it ends. Much later an
    assignment gains 2, whose plans the feed has not read: `feed_waited_since` still holds the first wait's start,
    so the take-over proceeded at once, with nothing of 2 parked, instead of waiting up to stall_seconds."""
    y = make("y", lambda e: True)
    shard = ShardState(y.state.store, 3)
    with y.state.store.transaction():
        shard._set(frozenset({0, 1, 2}))
    y.owns_lane, y.mine = shard.owns_lane, shard.mine
    shards = Shards(shard, y)
    shards.assigned = frozenset({0})
    rebalances, replica, ownership = _Rebalances(), _Replica(shards, {0, 1, 2}), _Ownership(shards, {0})
    feed = _Feed(behind=frozenset({1}))
    follower = ShardFollower(rebalances, replica, shards, ownership, _inline, _published, feed, stall_seconds=5.0)
    assert await follower.step(frozenset({0, 1})) is False      # waits for 1's plans
    await asyncio.sleep(5.1)                                    # the group went back to {0} meanwhile (settled)
    # A new assignment gains 2: its lane was restored meanwhile (held), the feed still reads its plans from the start.
    replica.reading = {0, 2}
    feed.behind = frozenset({2})
    assert follower.feed_waited is not None
    assert await follower.step(frozenset({0, 2})) is False, (
        f"took {ownership.follows[-1][0]} over at once, without waiting for the feed to read partition 2")


def test_a_record_placed_before_placement_read_from_where_its_key_hashed_is_never_placed(one):
    """b holds both partitions as copies after the upgrade (a file of its own: it reads them from their start).
    A record published before placement lies on Q, where its key hashed, not on P, its entity's: b parks it with
    source Q. `_place_again` only publishes rows with no source, so when b owns P the record is not placed on P;
    once b lets P go (the row is dropped), the next owner of P, reading P, never learns the plan."""
    b = one
    b.own(0, 1)
    plan = b.query.select(ATLAS_REQUEST)
    [(key, value)] = _own_records(b)
    b.own()
    b.state.store.db.execute("DELETE FROM outbox")
    home = b.parked.partition_of(plan["entity_id"])
    b.state.store.db.execute("DELETE FROM parked_plans")
    _feed(b, lambda: frozenset({0, 1}))._settle([(1 - home, 0, value, key)])  # legacy: on the other partition
    assert b.state.store.db.execute("SELECT partition, source FROM parked_plans").fetchall() == [(home, 1 - home)]
    b.own(home)
    placed = [r for r in b.state.outbox.due(1000) if r[1] == "x-plan-dependencies"]
    assert placed, f"a record lying on partition {1 - home}, of a plan of partition {home}, was not placed on {home}"


async def test_a_broker_timeout_while_the_feed_reassigns_does_not_end_it(one, monkeypatch):
    """Each change of the held partitions makes the feed ask the broker for end offsets (new in f7af6a2). A broker
    that does not answer in request_timeout_ms (a restart, a partition leader moving: the moments rebalances
    happen) raises KafkaTimeoutError there; `run` only retried duckdb.Error, so the feed task ended (an app.task:
    mode's Service crashes the whole worker), in the middle of a rebalance. It now follows again a second later."""
    from types import SimpleNamespace

    from aiokafka.errors import KafkaTimeoutError
    from aiokafka.structs import TopicPartition

    import agents.stream.plan_feed as plan_feed

    b = one
    calls = {"end_offsets": 0}

    class Consumer:
        def __init__(self, **_):
            pass

        async def start(self):
            pass

        async def stop(self):
            pass

        def assign(self, tps):
            self.tps = tps

        def seek(self, tp, offset):
            pass

        async def seek_to_beginning(self, tp):
            pass

        async def end_offsets(self, tps):
            calls["end_offsets"] += 1
            if calls["end_offsets"] == 1:
                raise KafkaTimeoutError()
            return {tp: 0 for tp in tps}

        async def position(self, tp):
            return 0

        async def getmany(self, timeout_ms=0, max_records=0):
            await asyncio.sleep(timeout_ms / 1000)
            return {}

    async def discover(consumer, topics, attempts=None):
        return [TopicPartition("x-plan-dependencies", p) for p in (0, 1)]

    monkeypatch.setattr(plan_feed, "AIOKafkaConsumer", Consumer)
    monkeypatch.setattr(plan_feed, "discover", discover)
    ready = asyncio.Event()
    ready.set()
    feed = PlanFeed(b.state, b.ownership, b.parked, SimpleNamespace(ready=ready), "", "x-plan-dependencies",
                    keeps=lambda: frozenset({0}))
    task = asyncio.ensure_future(feed.run())
    try:
        for _ in range(50):
            if task.done() or feed.following == {0}:
                break
            await asyncio.sleep(0.1)
        assert not task.done(), f"the plan feed ended on a broker timeout: {task.exception()!r}"
        assert feed.following == {0} and calls["end_offsets"] == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_a_batch_settled_while_its_partition_is_briefly_out_of_keeps_is_parked_as_its_position_is_saved(one):
    """`_settle` (writer thread) filtered by `keeps()` read at that moment but saved every read partition's
    position. Had the partition left keeps only for that moment (a read-ahead `_gain` timing out, then the
    assignment gaining it again), the loop saw the same keeps afterwards and never read the records again. It
    now filters by what the loop follows, whose positions it saves."""
    b = one
    b.own(0, 1)
    plan = b.query.select(ATLAS_REQUEST)
    [(key, value)] = _own_records(b)
    home = b.parked.partition_of(plan["entity_id"])
    b.own()
    b.state.store.db.execute("DELETE FROM parked_plans")
    held = {"now": frozenset()}                       # the instant `_settle` runs: home is out
    _feed(b, lambda: held["now"], following={home})._settle([(home, 0, value, key)])
    positions = dict(b.state.store.db.execute("SELECT partition, next_offset FROM plan_feed").fetchall())
    assert b.parked.size() == 1 and positions == {home: 1}
