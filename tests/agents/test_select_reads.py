"""A select the head cache cannot answer reads the file on the select thread, never on the HTTP loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agents.ops.loop_probe import LoopProbe
from agents.web.query import QueryService
from agents.web.select_reads import THREAD_NAME, SelectReads
from tests.conftest import ATLAS_REQUEST

pytestmark = pytest.mark.timeout(120)


async def inline(fn, *args):
    return fn(*args)


@pytest.fixture
def served(setup):  # noqa: F811
    """A query service on a cursor of its own (the loop's), and the select thread with another."""
    state, applier, _ = setup
    loop_reader = state.reader()
    reads = SelectReads(state.reader())
    yield QueryService(loop_reader, applier.plans), reads
    reads.close()
    loop_reader.store.close()


def watch(cursor_owner) -> list[str]:
    """The thread of every statement run through this reader's cursor."""
    seen: list[str] = []
    db = cursor_owner.store.db
    execute = db.execute
    db.execute = lambda *args: (seen.append(threading.current_thread().name), execute(*args))[1]
    return seen


async def test_a_lookup_the_head_cache_misses_reads_on_the_select_thread_only(served):
    query, reads = served
    on_loop, on_thread = watch(query.state), watch(reads.state)
    first = await query.select_async(ATLAS_REQUEST, inline, reads.run)
    again = await query.select_async(ATLAS_REQUEST, inline, reads.run)
    assert first["served_from"] == "compiled" and again["served_from"] == "cache"
    assert again["plan_id"] == first["plan_id"] and again["freshness_token"]
    assert on_loop == []  # the loop's cursor ran nothing
    assert on_thread and set(on_thread) == {f"{THREAD_NAME}_0"}
    assert reads.reads == 2


async def test_a_slow_lookup_does_not_hold_the_loop(served):
    query, reads = served
    await query.select_async(ATLAS_REQUEST, inline, reads.run)
    db = reads.state.store.db
    execute = db.execute

    def slow(*args):
        time.sleep(0.1)  # a read waiting on the writer's checkpoint while both cores are busy
        return execute(*args)

    db.execute = slow
    probe = LoopProbe(interval=0.001)
    task = asyncio.ensure_future(probe.run())
    try:
        while not probe.samples:
            await asyncio.sleep(0.001)
        before = probe.samples
        answer = await query.select_async(ATLAS_REQUEST, inline, reads.run)
        assert answer["served_from"] == "cache"
        assert probe.samples > before + 10  # the loop went on running meanwhile
        assert probe.max_stall < 0.2  # on the loop, the lookup's statements would have held it 300 ms or more
    finally:
        task.cancel()


async def test_after_a_restart_a_stored_plan_is_read_on_the_select_thread(worker):
    fresh = await worker.load("atlas.jsonl")
    plan = await worker.select(ATLAS_REQUEST, fresh)
    worker.stop()
    await worker.restart()  # the head cache starts empty: the file answers
    again = await worker.select(ATLAS_REQUEST)
    assert again["served_from"] == "cache" and again["plan_id"] == plan["plan_id"]
    assert (await worker.get("/healthz"))["select_reads"] >= 1
