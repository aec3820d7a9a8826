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
from compiler.request import parse_request, plan_key
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
    """A feed whose loop follows every partition."""
    feed = PlanFeed(node.state, node.ownership, node.parked, None, "", "x-plan-dependencies",
                    keeps=lambda: frozenset(range(node.parked.partitions)))
    feed.following = feed.keeps()
    return feed


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


async def _topic_holding(broker, records: list[tuple[bytes, bytes, int]]) -> str:
    """A new `plan-dependencies` topic holding these (key, value, partition) records, in order."""
    settings = Settings(topic_prefix=f"feed{uuid.uuid4().hex[:8]}-")
    await ensure_topics(settings, broker.bootstrap_servers)
    topic = settings.topic("plan-dependencies")
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    try:
        for key, value, partition in records:
            await producer.send_and_wait(topic, value, key=key, partition=partition)
    finally:
        await producer.stop()
    return topic


@pytest.mark.timeout(60)
async def test_through_the_broker_the_feed_starts_a_flush_after_a_batch_that_announced_and_only_then(pair, broker):
    # Unwired, a stale plan's announcement waited for the next input batch's flush or the 1 s timer.
    a, b = pair
    a.query.select(ATLAS_REQUEST)
    topic = await _topic_holding(broker, [(key, value, 0) for _, _, value, key in _records(a)])
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
                        broker.bootstrap_servers, topic, keeps=lambda: frozenset(range(node.parked.partitions)),
                        after_apply=kicked.set, run=run)
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


def _moved(record: dict, entity: str) -> dict:
    """The record of the same request about another entity (its key is that request's key)."""
    request = dict(record["request"], entity=entity)
    return dict(record, request=request, entity_id=entity, plan_id=f"{record['plan_id']}-{entity}",
                plan_key=plan_key(parse_request(request), entity))


@pytest.mark.timeout(60)
async def test_through_the_broker_the_feed_parks_only_the_held_partitions_plans_and_forgets_one_let_go(pair, broker):
    a, b = pair
    a.query.select(ATLAS_REQUEST)
    [(_, _, value, _)] = _records(a)
    mine = orjson.loads(value)
    home = b.parked.partition_of(mine["entity_id"])
    other = next(f"entity-{i}" for i in range(100) if b.parked.partition_of(f"entity-{i}") != home)
    theirs = _moved(mine, other)
    # Each on its entity's partition, as the publisher places them.
    topic = await _topic_holding(broker, [(r["plan_key"].encode(), orjson.dumps(r),
                                           b.parked.partition_of(r["entity_id"])) for r in (mine, theirs)])
    with b.state.store.transaction():  # parked before records were placed: kept whatever is let go
        b.parked.park([_moved(mine, "legacy-entity")], [None])
    legacy = _moved(mine, "legacy-entity")["plan_key"]
    keeps = frozenset({home})
    ready = asyncio.Event()
    ready.set()
    feed = PlanFeed(b.state, b.ownership, b.parked, SimpleNamespace(ready=ready), broker.bootstrap_servers, topic,
                    keeps=lambda: keeps)

    async def caught_up(partitions) -> None:
        """Until the feed reads these partitions and has read each to its end."""
        for _ in range(200):
            if feed.following == partitions and feed.caught_up(partitions):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"the feed did not catch up on {sorted(partitions)}")

    def parked() -> dict[str, int | None]:
        return dict(b.state.store.db.execute("SELECT plan_key, source FROM parked_plans").fetchall())

    task = asyncio.ensure_future(feed.run())
    try:
        await caught_up({home})
        assert feed.following == {home}  # the other partition is not read at all
        assert parked() == {mine["plan_key"]: home, legacy: None}
        keeps = frozenset({home, 1 - home})            # gained: read from its start
        await caught_up(keeps)
        assert parked() == {mine["plan_key"]: home, theirs["plan_key"]: 1 - home, legacy: None}
        keeps = frozenset({1 - home})                   # let go: its plans are forgotten, the legacy row stays
        await caught_up(keeps)
        assert parked() == {theirs["plan_key"]: 1 - home, legacy: None}
        positions = dict(b.state.store.db.execute("SELECT partition, next_offset FROM plan_feed").fetchall())
        assert positions == {1 - home: 1}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_an_owner_publishes_records_parked_before_placement_again_on_their_entity_s_partition(pair):
    a, b = pair
    a.query.select(ATLAS_REQUEST)
    [(_, _, value, _)] = _records(a)
    record = orjson.loads(value)
    home = b.parked.partition_of(record["entity_id"])
    with b.state.store.transaction():  # an earlier version's feed parked it from wherever its key hashed
        b.parked.park([record], [None])
    b.own(1 - home)
    assert not [r for r in b.state.outbox.due(1000) if r[1] == "x-plan-dependencies"]  # not its partition
    b.own(home)
    [(_, _, key, placed, partition)] = [r for r in b.state.outbox.due(1000) if r[1] == "x-plan-dependencies"]
    assert (key, orjson.loads(placed), partition) == (record["plan_key"].encode(), record, home)
    _feed(b)._settle([(home, 0, placed, key)])  # read back from its partition: parked as placed, not sent again
    assert b.state.store.db.execute("SELECT source FROM parked_plans").fetchall() == [(home,)]
    b.own(1 - home)
    b.own(home)
    assert len([r for r in b.state.outbox.due(1000) if r[1] == "x-plan-dependencies"]) == 1


@pytest.mark.timeout(60)
async def test_through_the_broker_records_a_reset_topic_lost_are_published_again_once(pair, broker):
    a, b = pair
    a.query.select(ATLAS_REQUEST)
    [(_, _, value, key)] = _records(a)
    home = b.parked.partition_of(orjson.loads(value)["entity_id"])
    _feed(b)._settle([(home, 0, value, key)])  # read from the old topic; a rebase then forgot the feed's positions
    b.state.store.db.execute("DELETE FROM plan_feed")
    topic = await _topic_holding(broker, [])    # the new broker's topic holds none of it
    keeps = frozenset({home})
    ready = asyncio.Event()
    ready.set()
    feed = PlanFeed(b.state, b.ownership, b.parked, SimpleNamespace(ready=ready), broker.bootstrap_servers, topic,
                    keeps=lambda: keeps)

    def again() -> list:
        return [r for r in b.state.outbox.due(1000) if r[1] == topic]

    task = asyncio.ensure_future(feed.run())
    try:
        for _ in range(100):
            if feed.following == keeps:
                break
            await asyncio.sleep(0.1)
        [(_, _, sent_key, sent, partition)] = again()   # the only copy left is this file's: on the entity's partition
        assert (sent_key, sent, partition) == (key, value, home)
        keeps = frozenset({home, 1 - home})              # following again does not publish it again
        for _ in range(100):
            if feed.following == keeps:
                break
            await asyncio.sleep(0.1)
        assert feed.following == keeps and len(again()) == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
