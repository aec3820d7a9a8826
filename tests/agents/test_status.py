"""Operators' reads: /healthz and /metrics read the state file on the status thread, never on the HTTP loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agents.ops.loop_probe import LoopProbe
from agents.plans.backlog import recompile_queued
from agents.stream.lag import LagWatcher
from agents.web.metrics import Metrics
from agents.web.peers import NotOwner, Peers
from agents.web.query import StateError
from agents.web.status import THREAD_NAME, Status, health_figures
from state.parked_plans import ParkedPlans
from tests.agents.applier_kit import raw
from tests.conftest import ATLAS_REQUEST
from tests.events import resource

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def status(setup):  # noqa: F811
    state, _, query = setup
    ParkedPlans(state.store, 4)  # a worker's file always has the table /healthz counts
    query.select(ATLAS_REQUEST)
    lag = LagWatcher(state.store, "127.0.0.1:9", {"revocations": "x-revocations"}, 60.0)
    reader = state.reader()
    out = Status(reader, query, Metrics(state, query, lag),
                 lambda figures: {"parked_plans": figures["parked_plans"], "standby_outbox": figures["standby_outbox"],
                                  "recompile_queue": figures["recompile_queue"]})
    yield out
    out.close()
    reader.store.close()


def _threads_of(status: Status) -> list[str]:
    """Record the thread of every statement the status reader's cursor runs."""
    seen: list[str] = []
    db = status.state.store.db
    execute = db.execute
    db.execute = lambda *args: (seen.append(threading.current_thread().name), execute(*args))[1]
    return seen


async def test_health_and_metrics_read_the_file_on_the_status_thread_only(status):
    seen = _threads_of(status)
    doc = await status.health()
    assert doc["status"] == "ok" and doc["plans"] == {"fresh": 1} and doc["index_edges"] > 0
    assert doc["parked_plans"] == 0 and doc["standby_outbox"] == 0 and doc["freshness_token"]
    assert doc["counters"]["compilations"] >= 1 and doc["counters"]["selects.compiled"] == 1  # file's and the loop's
    reads = doc["status_reads"]
    assert reads["thread"] == f"{THREAD_NAME}_0" and reads["reads"] == 1
    assert reads["cpu_seconds"] > 0  # what being watched cost the worker, on the status thread
    later = (await status.health())["status_reads"]
    assert later["reads"] == 2 and later["cpu_seconds"] > reads["cpu_seconds"]
    text = (await status.metrics_text()).decode()
    assert 'freshplan_plans{status="fresh"} 1.0' in text and "freshplan_index_edges" in text
    assert seen and set(seen) == {f"{THREAD_NAME}_0"}  # every statement, none on the loop's thread
    assert threading.current_thread().name not in seen
    # The in-process path reads where it is called, with the same figures.
    assert 'freshplan_plans{status="fresh"} 1.0' in status.metrics.render().decode()


async def test_a_slow_read_of_the_file_does_not_hold_the_loop(status):
    probe = LoopProbe(interval=0.001)
    task = asyncio.ensure_future(probe.run())
    try:
        while not probe.samples:
            await asyncio.sleep(0.001)

        def slow(state):
            time.sleep(0.3)  # a count over millions of index edges while both cores are busy
            return health_figures(state)

        before = probe.samples
        figures = await status.read(slow)
        assert figures["plans"] == {"fresh": 1}
        assert probe.samples > before + 10  # the loop went on running meanwhile
        assert probe.max_stall < 0.2  # on the loop, the read would have held it 300 ms
    finally:
        task.cancel()


async def test_an_unreadable_file_makes_health_and_metrics_say_so_and_refuse_selects(status):
    status.state.store.db.close()  # every read of the status cursor now fails as a broken file would
    with pytest.raises(StateError) as refused:  # a scrape gets a 503, not a 500
        await status.metrics_text()
    assert refused.value.code == "state_unreadable" and refused.value.status == 503
    assert status.query.unreadable == "ConnectionException"
    doc = await status.health()
    assert doc["status"] == "state_unreadable" and doc["state_error"] == "ConnectionException"
    assert "plans" not in doc and "status_reads" not in doc
    assert status.query.unreadable == "ConnectionException"  # sticky: selects are refused from now on


async def test_a_plan_status_is_read_on_the_status_thread_and_decided_on_the_loop(status):
    query = status.query
    plan = query.select(ATLAS_REQUEST)
    seen = _threads_of(status)
    asked: list[str | None] = []

    def anyone(principal):
        asked.append(principal)
        return True

    assert (await query.plan_status_async(plan["plan_id"], status.read, anyone))["status"] == "fresh"
    assert asked == [ATLAS_REQUEST["principal"]]  # the plan's principal, read with its status
    assert await query.plan_status_async("plan-unknown", status.read, anyone) is None
    assert seen and set(seen) == {f"{THREAD_NAME}_0"}
    assert await query.plan_status_async(plan["plan_id"], status.read, lambda p: False) is None  # as if unknown
    query.peers = Peers(foreign_partition=lambda entity_id: 3)  # another worker owns the entity now: its owner answers
    with pytest.raises(NotOwner):
        await query.plan_status_async(plan["plan_id"], status.read, anyone)
    with pytest.raises(NotOwner):  # the in-process path decides the same
        query.plan_status(plan["plan_id"])
    # A caller who may not see the plan is refused before any owner is asked: nothing is forwarded for it.
    assert await query.plan_status_async(plan["plan_id"], status.read, lambda p: p == "sam") is None
    assert query.plan_status(plan["plan_id"], lambda p: False) is None


async def test_health_counts_the_announced_plans_whose_successors_wait(status, setup):  # noqa: F811
    state, inv, _ = setup
    assert (await status.health())["recompile_queue"] == 0
    inv.apply([raw(*resource("approved-waiver-W2"))])  # announced first: its successor is queued
    assert (await status.health())["recompile_queue"] == 1
    while recompile_queued(inv.plans, 16):
        pass
    assert (await status.health())["recompile_queue"] == 0
