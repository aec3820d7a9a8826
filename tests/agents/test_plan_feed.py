"""The plan-dependencies feed: every record parked, owned ones taken over without compiling, poison skipped."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from agents.cli.settings import Settings
from agents.stream.plan_feed import PlanFeed
from streams.admin import ensure_topics
from tests.agents.test_ownership import ATLAS, Node, _event
from tests.conftest import ATLAS_REQUEST
from tests.events import resource


@pytest.fixture
def pair(tmp_path):
    a, b = Node(tmp_path / "a.duckdb"), Node(tmp_path / "b.duckdb")
    for node in (a, b):
        node.apply(*ATLAS)
    a.own(0, 1)
    yield a, b
    a.state.close()
    b.state.close()


def _feed(node: Node) -> PlanFeed:
    return PlanFeed(node.state, node.ownership, node.parked, None, "", "x-plan-dependencies")


def _records(node: Node) -> list[tuple[int, int, bytes | None, bytes | None]]:
    rows = [(k, v) for _, t, k, v in node.state.outbox.pending(1000) if t == "x-plan-dependencies"]
    return [(0, offset, value, key) for offset, (key, value) in enumerate(rows)]


def test_a_record_is_parked_by_every_worker_and_taken_over_only_by_the_owner(pair):
    a, b = pair
    plan = a.query.select(ATLAS_REQUEST)
    b.own()  # owns nothing: parks, indexes nothing
    assert not _feed(b)._settle(_records(a))  # nothing announced: no flush to start
    assert b.parked.size() == 1 and b.state.index.size() == 0
    b.own(0, 1)  # the take-over restores from the parked record, without the network or a compile
    assert b.query.select(ATLAS_REQUEST)["plan_id"] == plan["plan_id"]
    assert b.counter("compilations") == 0


def test_an_owned_record_compiled_elsewhere_is_judged_by_key_changes(pair):
    a, b = pair
    plan = a.query.select(ATLAS_REQUEST)
    b.own(0, 1)
    b.apply(_event(resource("approved-waiver-W2")))  # b is ahead of the plan
    assert _feed(b)._settle(_records(a))  # announced: the worker's feed starts a flush
    [announced] = b.published("plan-invalidations")
    assert announced["plan_id"] == plan["plan_id"] and announced["cause"]["topic"] == "x-source-changes"
    assert b.state.plans.status(plan["plan_id"])["status"] == "invalidated"


def test_poisoned_records_are_skipped_and_a_tombstone_forgets_a_key(pair):
    a, b = pair
    plan = a.query.select(ATLAS_REQUEST)
    [(_, _, value, key)] = _records(a)
    record = orjson.loads(value)
    foreign_key = dict(record, plan_id="plan-poison", request=dict(record["request"], purpose="other"))
    _feed(b)._settle([(0, 0, b"{not json", b"x"), (0, 1, orjson.dumps({"plan_id": 7}), b"y"),
                      (0, 2, orjson.dumps(foreign_key), key), (0, 3, value, key)])
    assert b.counter("bad_internal_records.plan-dependencies") == 3
    assert [r["plan_id"] for r in b.parked.records([0, 1])] == [plan["plan_id"]]
    _feed(b)._settle([(0, 4, None, key)])
    assert b.parked.size() == 0


@pytest.mark.timeout(60)
async def test_through_the_broker_the_feed_starts_a_flush_after_a_batch_that_announced_and_only_then(pair, broker):
    # Unwired, a stale plan's announcement waited for the next input batch's flush or the 1 s timer.
    a, b = pair
    a.query.select(ATLAS_REQUEST)
    settings = Settings(topic_prefix=f"feed{uuid.uuid4().hex[:8]}-")
    await ensure_topics(settings, broker.bootstrap_servers)
    topic = settings.topic("plan-dependencies")
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    try:
        for _, _, value, key in _records(a):
            await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()
    settled, kicked = asyncio.Queue(), asyncio.Event()

    async def run(fn, *args):
        result = fn(*args)
        if getattr(fn, "__name__", "") == "_settle":
            settled.put_nowait(result)
        return result

    async def follow(node) -> bool:
        kicked.clear()
        ready = asyncio.Event()
        ready.set()
        feed = PlanFeed(node.state, node.ownership, node.parked, SimpleNamespace(ready=ready),
                        broker.bootstrap_servers, topic, after_apply=kicked.set, run=run)
        task = asyncio.ensure_future(feed.run())
        try:
            announced = await asyncio.wait_for(settled.get(), 30)
            await asyncio.sleep(0)  # the feed calls after_apply right after the batch's job returns
            return announced
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    assert not await follow(a) and not kicked.is_set()  # its own plan's record: parked, nothing to publish
    b.own(0, 1)
    b.apply(_event(resource("approved-waiver-W2")))  # ahead of the plan: judged stale, announced
    assert await follow(b) and kicked.is_set()
    assert [r["plan_id"] for r in b.published("plan-invalidations")]
