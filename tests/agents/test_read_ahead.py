"""A lane read ahead while the group rebalances is a copy until an assignment gives it (units; a kill -9 through the
broker)."""

from __future__ import annotations

import asyncio

import pytest

from agents.shards.shard_follow import ShardFollower
from agents.shards.shard_restore import Shards
from agents.stream.lane_merge import LaneMerge
from agents.stream.lane_reader import LaneReader
from agents.stream.router import Lane, Router
from schemas.codec import decode
from schemas.plan_partition import plan_partition
from schemas.routed_batch import RoutedBatch, pack, unpack
from state.shard_state import ShardState
from tests.agents.test_shard_apply import A, B, letters, make, only, raw, refused, scenario, stored  # noqa: F401

pytestmark = pytest.mark.timeout(60)


def _read_ahead(make):  # noqa: F811 (the fixture)
    """A worker owning B's lane that restored A's lane from its history without the group giving it."""
    y = make("y", only(B))
    y.apply(scenario(), standby=True)
    bad = raw(*refused("waiver-bad", entity=A))  # routed to A's lane: never read here before
    lane_a, lane_b = plan_partition(A, 2), plan_partition(B, 2)
    source = sorted((m for m in scenario() + [bad] if m.topic == "source-changes"), key=lambda m: m.offset)
    merge = LaneMerge(2, {0: source[-1].offset + 1})
    merge.gain(lane_a)
    merge.report("entity-changes", lane_a, 0, 0)  # the owner reported nothing yet (it died first, say)
    router = Router(2, lambda m: decode(m.topic, m.key, m.value))
    for carrier, m in enumerate(source):
        merge.add("entity-changes", lane_a, carrier, unpack(pack(router.route(0, [m], m.offset, m.offset + 1)[
            Lane("entity-changes", lane_a)])))
    merge.add("entity-changes", lane_a, len(source), RoutedBatch(1, 0, 0, ()))
    shard = ShardState(y.state.store, 2)
    with y.state.store.transaction():
        shard.add([lane_b])
    shard.catching = frozenset({lane_a})
    y.owns_lane, y.mine = shard.owns_lane, shard.mine
    shards = Shards(shard, y)
    shards.assigned = frozenset({lane_b})  # the assignment before the rebalance: A's lane is not given (yet)
    shards.restore(merge.release().history)
    shards.caught_up(frozenset({lane_a}), {lane_a: {0: 0}})
    return y, shards, lane_a, lane_b, bad


def test_a_lane_read_ahead_is_held_as_a_copy_and_keeps_the_refusals_its_owner_never_reported(make):  # noqa: F811
    y, shards, lane_a, lane_b, bad = _read_ahead(make)
    assert lane_a in shards.state.held and lane_a in shards.standby, "a lane the group did not give is held as owned"
    assert not shards.state.owns_lane(lane_a)
    assert letters(y, standby=False) == [], "a copy sent a letter its lane's owner may still send"
    assert letters(y) == [(bad.offset, True)], "the copy dropped the refusal its owner never reported"


def test_the_assignment_that_gives_a_lane_read_ahead_sends_what_it_kept(make):  # noqa: F811
    y, shards, lane_a, lane_b, bad = _read_ahead(make)
    shards.assigned = frozenset({lane_a, lane_b})
    with y.state.store.transaction():
        shards.move(shards.assigned)
    assert shards.state.owns_lane(lane_a) and shards.standby == frozenset()
    assert letters(y) == [(bad.offset, False)], "the refusal the dead owner never sent went nowhere"


def test_an_assignment_that_does_not_give_a_lane_read_ahead_drops_it_and_what_it_kept(make):  # noqa: F811
    y, shards, lane_a, lane_b, bad = _read_ahead(make)
    with y.state.store.transaction():
        shards.move(frozenset({lane_b}))
    assert shards.state.held == frozenset({lane_b}) and shards.standby == frozenset()
    assert letters(y) == []
    resources = y.state.store.db.execute("SELECT DISTINCT entity FROM resources WHERE NOT deleted").fetchall()
    assert (A,) not in resources, resources


@pytest.mark.parametrize(("partitions", "owned", "ahead"), [
    (2, {0}, {1}), (2, {0, 1}, set()), (4, {1, 3}, {2, 0}), (4, {3}, {0}), (1, {0}, set()), (4, set(), set())])
def test_the_lanes_read_ahead_are_those_one_standby_copy_would_hold(tmp_path, partitions, owned, ahead):
    from state.local_state import LocalState
    state = LocalState.open(tmp_path / "s.duckdb")
    try:
        assert Shards(ShardState(state.store, partitions), None).ahead(frozenset(owned)) == frozenset(ahead)
    finally:
        state.close()


# Found by the hostile review of the read-ahead (its three reproductions).
def test_a_read_ahead_lane_let_go_before_the_writer_applied_its_gain_is_not_restored(make):  # noqa: F811
    """ahead() gains lane A; the fetch loop hands the writer a Fetched(gained={A}) that waits in the FetchQueue
    (the writer busy); the assignment (a worker joined) does not give A: step() loses it (event loop) and runs
    Shards.lose on the writer, FIFO, *before* the queued batch; that batch's gain() then marks A catching."""
    y = make("y", only(B))
    y.apply(scenario(), standby=True)
    lane_a, lane_b = plan_partition(A, 2), plan_partition(B, 2)
    shard = ShardState(y.state.store, 2)
    with y.state.store.transaction():
        shard._set(frozenset({lane_b}))
    y.owns_lane, y.mine = shard.owns_lane, shard.mine
    reader = LaneReader(2, lambda: shard.held)
    shards = Shards(shard, y, reading=reader.read_now)
    shards.assigned = frozenset({lane_b})
    reader.start(y.state.store.next_offsets(), {})
    reader.gain(frozenset({lane_a}))                  # ShardFollower.ahead -> Replica.gain_lanes
    queued = reader.fetched({}, {}, reader.epoch)     # _fetch_loop: queued for the writer
    assert queued.gained == frozenset({lane_a})
    reader.lose(frozenset({lane_a}))                  # step(): Replica.lose_lanes
    shards.lose(frozenset({lane_a}))                  # step(): run_writes(shards.lose) - runs first (FIFO)
    shards.lanes_applied(queued, before=True)         # the writer then applies the queued batch
    shards.settled()                                  # Ownership.follow's finally
    assert lane_a not in reader.reading()             # nothing will ever catch it up
    assert shard.catching == frozenset() and shard.restoring == frozenset(), (
        f"lane {lane_a} is no longer read but stays catching={sorted(shard.catching)} "
        f"restoring={sorted(shard.restoring)}: selects for its partition get 503 shard_restoring "
        "(routes._forwarded) instead of being forwarded, /healthz says restoring, until the next rebalance")


class _Rebalances:
    revoking = False


class _Replica:
    routed, blocked = True, {}

    def __init__(self, shards: Shards, reading: set[int]) -> None:
        self.shards, self.reading = shards, set(reading)

    def reading_lanes(self):
        return frozenset(self.reading)

    async def lose_lanes(self, lanes):
        self.reading -= lanes

    async def gain_lanes(self, lanes):
        self.reading |= lanes
        self.shards.gain(frozenset(lanes))  # the writer's gain, as early as it can possibly run


class _Ownership:
    def __init__(self, shards: Shards, owned) -> None:
        self.shards, self.owned, self.follows = shards, frozenset(owned), []

    def follow(self, assigned):
        self.follows.append((frozenset(assigned), self.shards.state.catching))
        with self.shards.applier.state.store.transaction():
            self.shards.move(assigned)
        self.owned = frozenset(assigned)
        self.shards.settled()


async def _inline(fn, *args):
    return fn(*args)


async def _published():
    return None


class _Feed:
    """The plan feed as the follower sees it: it has read every partition's parked plans unless `behind`."""

    def __init__(self, behind: frozenset[int] = frozenset()) -> None:
        self.behind = behind
        self.wakers: list = []

    def caught_up(self, partitions) -> bool:
        return not set(partitions) & self.behind


async def test_a_held_copy_read_again_from_its_start_is_not_taken_over_before_it_caught_up(make):  # noqa: F811
    """4 partitions, this worker owns 0 and read 1 ahead (caught up: a held copy). The assignment gives 0 and 2:
    step() stops reading 1 (held until the move) and waits for 2. A second rebalance: ahead() skips 1 (held). It
    gives 0 and 1: step() reads 1 from its start again, yet `wanted <= held` holds (1 is in the file) and the
    plans of 1 are taken over while 1 is catching up: judged and served from a stale, then partial, shard."""
    y = make("y", lambda e: True)
    shard = ShardState(y.state.store, 4)
    with y.state.store.transaction():
        shard._set(frozenset({0, 1}))
    shard.copies = frozenset({1})                    # Shards.caught_up of the read-ahead lane
    y.owns_lane, y.mine = shard.owns_lane, shard.mine
    shards = Shards(shard, y)
    shards.assigned = frozenset({0})
    rebalances, replica, ownership = _Rebalances(), _Replica(shards, {0, 1}), _Ownership(shards, {0})
    follower = ShardFollower(rebalances, replica, shards, ownership, _inline, _published, _Feed())
    assert await follower.step(frozenset({0, 2})) is False   # 2 is catching up; 1 no longer read, still held
    assert replica.reading == {0, 2} and 1 in shard.held
    rebalances.revoking = True
    await follower.ahead()
    assert replica.reading == {0, 2}, "ahead() skips a held lane"
    rebalances.revoking = False
    took_over = await follower.step(frozenset({0, 1}))
    assert 1 in shard.catching, "lane 1 is being read from its start again"
    assert not took_over and ownership.follows == [], (
        f"step() took over {ownership.follows} while lane 1 was catching up {sorted(shard.catching)}")


async def test_the_take_over_waits_for_the_feed_to_park_a_gained_partitions_plans_but_not_for_ever(make):  # noqa: F811
    y = make("y", lambda e: True)
    shard = ShardState(y.state.store, 2)
    with y.state.store.transaction():
        shard._set(frozenset({0, 1}))
    y.owns_lane, y.mine = shard.owns_lane, shard.mine
    shards = Shards(shard, y)
    shards.assigned = frozenset({0})
    rebalances, replica, ownership = _Rebalances(), _Replica(shards, {0, 1}), _Ownership(shards, {0})
    feed = _Feed(behind=frozenset({1}))
    follower = ShardFollower(rebalances, replica, shards, ownership, _inline, _published, feed, stall_seconds=0.3)
    assert await follower.step(frozenset({0, 1})) is False and ownership.follows == []  # 1's plans not parked yet
    feed.behind = frozenset()
    assert await follower.step(frozenset({0, 1})) is True and ownership.follows[-1][0] == {0, 1}
    feed.behind = frozenset({0})  # a feed stuck behind: after stall_seconds the plans follow anyway
    assert await follower.step(frozenset({0})) is False
    await asyncio.sleep(0.35)
    assert await follower.step(frozenset({0})) is True and ownership.follows[-1][0] == {0}


async def test_a_lane_read_ahead_after_a_failed_step_is_a_copy_not_owned(make):  # noqa: F811
    """step() sets Shards.assigned before gain_lanes, which can time out (restore_stall_seconds). A rebalance
    then starts: ahead() reads that lane, and caught_up() takes it for owned (assigned still names it), though
    the rebalance is under way and the next assignment may give it to someone else."""
    y = make("y", lambda e: True)
    shard = ShardState(y.state.store, 2)
    with y.state.store.transaction():
        shard._set(frozenset({1}))
    y.owns_lane, y.mine = shard.owns_lane, shard.mine
    shards = Shards(shard, y)
    rebalances, ownership = _Rebalances(), _Ownership(shards, {1})

    class Stalled(_Replica):
        tries = 0

        async def gain_lanes(self, lanes):
            self.tries += 1
            if self.tries == 1:
                raise asyncio.TimeoutError
            await super().gain_lanes(lanes)

    replica = Stalled(shards, {1})
    follower = ShardFollower(rebalances, replica, shards, ownership, _inline, _published, _Feed())
    with pytest.raises(asyncio.TimeoutError):
        await follower.step(frozenset({0, 1}))
    rebalances.revoking = True
    await follower.ahead()
    assert 0 in shard.catching and shards.read_ahead["times"] == 1
    shards.caught_up(frozenset({0}), {0: {}})
    assert not shard.owns_lane(0), "a lane read ahead during a rebalance is taken for owned (no copy)"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("read_ahead", ["1", "0"], ids=["read ahead", "FRESHPLAN_READ_AHEAD=0"])
async def test_the_survivor_of_a_kill_restores_the_dead_workers_partition_before_the_assignment(broker, tmp_path,
                                                                                               read_ahead):
    from tests.agents.test_shards import ATLAS, BOREAL, BOREAL_REQUEST, _shard, _split
    from tests.conftest import ATLAS_REQUEST, eventually, freshest, launch, start_peer
    from tests.events import resource

    async with launch(broker, tmp_path / "a", FRESHPLAN_READ_AHEAD=read_ahead) as first:
        token = freshest(await first.load("atlas.jsonl"),
                         await first.publish_events(resource("boreal-waiver-B1", entity=BOREAL),
                                                    *[resource(f"ahead-{e}-{i}", entity=e) for e in (ATLAS, BOREAL)
                                                      for i in range(3)]))
        await first.select(ATLAS_REQUEST, token)
        total = (await _shard(first))["resources"]
        peer = await start_peer(first, tmp_path / "b")
        try:
            survivor, victim = await _split(first, peer)  # the survivor owns Atlas's partition, the victim Boreal's
            mark = survivor.log_path.stat().st_size
            victim.kill()

            async def whole():
                s = await _shard(survivor)
                return s if sorted(s["partitions"]["plans"]) == [0, 1] and not s["restoring"] else None
            s = await eventually(whole, what="the survivor holding both partitions")
            boreal = plan_partition(BOREAL, 2)
            assert s["resources"] == total and s["standby"]["partitions"] == [], s
            assert s["last_restore"]["partitions"] == [boreal], s
            log = survivor.log_path.read_bytes()[mark:].decode()
            noticed, assigned = log.find("refuses connections"), log.rfind("the group assigned")
            restored = log.find(f"restored entity partition {boreal} from its lane")
            if read_ahead == "1":
                # The dead worker's port refused at once: its partition was restored as a copy before the group
                # (a session timeout later, then held by the broker) named the new assignment.
                assert -1 < noticed < restored < assigned, log[-4000:]
                async def unsuspected():  # the next knock after the assignment ends the suspicion
                    return (await _shard(survivor))["suspected"] == []
                await eventually(unsuspected, what="the survivor no longer suspecting the partition it owns")
            else:
                assert noticed == -1 and s["read_ahead"]["times"] == 0 and assigned < restored, s
            assert (await survivor.select(BOREAL_REQUEST, token))["admitted"]
        finally:
            peer.stop()


@pytest.mark.timeout(240)
async def test_a_worker_joining_leaves_each_incumbent_its_own_shard_and_no_copy(broker, tmp_path):
    """2 partitions, 2 workers, a third joins: each incumbent reads the other's lane ahead during the rebalance,
    and the assignment, which moves nothing, drops it again; selects of the other partition are still forwarded."""
    from tests.agents.test_shards import ATLAS, BOREAL, BOREAL_REQUEST, _shard, _split
    from tests.conftest import ATLAS_REQUEST, eventually, freshest, launch, start_peer
    from tests.events import resource

    async with launch(broker, tmp_path / "a") as first:
        token = freshest(await first.load("atlas.jsonl"),
                         await first.publish_events(resource("boreal-waiver-B1", entity=BOREAL),
                                                    *[resource(f"join-{e}-{i}", entity=e) for e in (ATLAS, BOREAL)
                                                      for i in range(3)]))
        await first.select(ATLAS_REQUEST, token)
        peers = [await start_peer(first, tmp_path / "b")]
        try:
            atlas_owner, boreal_owner = await _split(first, peers[0])
            before = [await _shard(w) for w in (atlas_owner, boreal_owner)]
            peers.append(await start_peer(first, tmp_path / "c"))
            joiner = peers[-1]

            async def read_ahead_and_settled():
                shards = [await _shard(w) for w in (atlas_owner, boreal_owner, joiner)]
                done = all(s["read_ahead"]["times"] >= 1 for s in shards[:2]) and all(
                    not s["restoring"] and s["standby"]["partitions"] == [] for s in shards)
                return shards if done and shards[2]["owned_partitions"] == [] else None
            a, b, c = await eventually(read_ahead_and_settled, what="the incumbents read ahead and let go again")
            for s, was in zip((a, b), before, strict=True):
                assert s["partitions"] == was["partitions"] and s["owned_partitions"] == was["owned_partitions"], s
                assert s["resources"] == was["resources"], (s, was)  # the copy's rows went with it
            for w in (atlas_owner, boreal_owner, joiner):  # the other's partition is forwarded, not refused
                for request in (ATLAS_REQUEST, BOREAL_REQUEST):
                    assert (await w.select(request, token))["admitted"]
        finally:
            for p in peers:
                p.stop()
