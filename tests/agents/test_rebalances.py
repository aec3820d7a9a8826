"""Rebalance signals wake the followers of the assignment and carry it (pure: a stand-in for Faust's app)."""

from __future__ import annotations

import asyncio

from faust.types import TP

from agents.stream.rebalances import Rebalances, woken

TOPICS = {"source-changes": "t-source-changes", "clock": "t-clock"}


class Signal:
    def __init__(self) -> None:
        self.receivers = []

    def connect(self, fn):
        self.receivers.append(fn)
        return fn

    async def send(self, *args, **kwargs) -> None:
        for fn in self.receivers:
            await fn(self, *args, **kwargs)


class App:
    def __init__(self) -> None:
        self.on_partitions_revoked, self.on_partitions_assigned = Signal(), Signal()


async def test_a_follower_acts_on_each_signal_and_reads_the_assignment_it_carried():
    app = App()
    rebalances = Rebalances(app, TOPICS)
    signal = rebalances.waker()
    assert await woken(signal, 0.5) and rebalances.assigned("source-changes") is None  # the first look
    assert not await woken(signal, 0.01)  # nothing happened since
    await app.on_partitions_revoked.send(set())
    assert await woken(signal, 0.5) and rebalances.assigned("source-changes") is None and rebalances.keys() is None
    await app.on_partitions_assigned.send({TP("t-source-changes", 1), TP("t-clock", 0), TP("t-plans", 1)})
    assert await woken(signal, 0.5)
    assert rebalances.assigned("source-changes") == {1} and rebalances.assigned("revocations") == frozenset()
    assert rebalances.keys() == {("source-changes", 1), ("clock", 0)}
    await app.on_partitions_revoked.send({TP("t-source-changes", 1)})
    assert rebalances.assigned("source-changes") is None  # moving: nobody acts on the old assignment
    await app.on_partitions_assigned.send(set())
    assert rebalances.assigned("source-changes") == frozenset() and rebalances.signals == {"revoked": 2, "assigned": 2}


async def test_every_follower_is_woken():
    app = App()
    rebalances = Rebalances(app, TOPICS)
    followers = [rebalances.waker() for _ in range(3)]
    for f in followers:
        f.clear()
    await app.on_partitions_assigned.send({TP("t-source-changes", 0)})
    assert all(await asyncio.gather(*[woken(f, 1) for f in followers]))
