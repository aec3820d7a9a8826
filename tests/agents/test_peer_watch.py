"""A peer whose web port refuses connections is suspected dead: its partitions are wanted as copies (no broker)."""

from __future__ import annotations

import asyncio

import pytest

from agents.shards.peer_watch import PeerWatch
from agents.shards.shard_restore import Shards
from state.local_state import LocalState
from state.shard_state import ShardState

pytestmark = pytest.mark.timeout(30)

ME, PEER, OTHER = "http://127.0.0.1:7001", "http://127.0.0.1:7002", "http://127.0.0.1:7003"


class _Writer:
    def close(self) -> None:
        pass


@pytest.fixture
def shards(tmp_path):
    state = LocalState.open(tmp_path / "s.duckdb")
    yield Shards(ShardState(state.store, 4), None)
    state.close()


def _watch(shards, owners: dict[int, str], down: set[int], slow: set[int] = frozenset()):
    woken = []

    async def connect(host: str, port: int):
        if port in slow:
            await asyncio.sleep(10)
        if port in down:
            raise ConnectionRefusedError
        return None, _Writer()
    watch = PeerWatch(shards, lambda: dict(owners), lambda url: url == ME, lambda: woken.append(1),
                      timeout=0.05, connect=connect)
    return watch, woken


async def test_the_partitions_of_a_peer_that_refuses_are_suspected_and_the_follower_woken(shards):
    owners = {0: ME, 1: PEER, 2: OTHER, 3: PEER}
    watch, woken = _watch(shards, owners, down={7002})
    assert await watch.check() == frozenset({1, 3}) and shards.suspected == frozenset({1, 3}) and woken == [1]
    assert shards.standby_for(frozenset({0})) == frozenset({1, 3}), "the suspected partitions are not wanted"
    assert await watch.check() == frozenset({1, 3}) and woken == [1], "an unchanged suspicion woke the follower"


async def test_a_slow_peer_or_this_worker_is_never_suspected(shards):
    watch, woken = _watch(shards, {0: ME, 1: PEER, 2: OTHER}, down={7001}, slow={7002})
    assert await watch.check() == frozenset() and woken == []


async def test_the_suspicion_ends_when_the_peer_answers_or_the_group_gives_its_partitions_away(shards):
    owners = {0: ME, 1: PEER, 2: OTHER, 3: PEER}
    watch, woken = _watch(shards, owners, down={7002})
    await watch.check()
    owners.clear()  # a rebalance under way: nobody is known to own anything
    watch.owners = lambda: {}
    assert await watch.check() == frozenset({1, 3}), "a suspicion dropped while the group is rebalancing"
    watch.owners = lambda: {0: ME, 1: ME, 2: OTHER, 3: ME}  # the group gave them to this worker
    assert await watch.check() == frozenset() and shards.suspected == frozenset() and woken == [1, 1]
    assert shards.standby_for(frozenset({0, 1, 3})) == frozenset()
