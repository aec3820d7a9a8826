"""A worker restarted with a recompile backlog publishes no successor for a plan partition a peer owns now."""

from __future__ import annotations

import asyncio
from datetime import datetime

import duckdb
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas.plan_partition import plan_partition
from tests.conftest import ATLAS_REQUEST, WorkerProcess, eventually, freshest, launch, start_peer
from tests.events import revoke_role
from tests.hostile.test_two_workers import BOREAL_REQUEST, BOREAL_WAIVER, _health, _owns, _split

pytestmark = pytest.mark.timeout(240)

PLANS = 40  # per entity: enough for the backlog to need several writer jobs
STEP = "4"  # plans a backlog job takes while input streams, four times that once none came for 0.2 s: the stop
# must find the queue still holding both partitions' plans (with the default 16, the 64-plan jobs of an idle
# worker drained the 80 plans before a stop under load took effect)


@pytest.fixture
async def worker(broker, tmp_path):
    async with launch(broker, tmp_path, FRESHPLAN_BACKLOG_STEP=STEP) as running:
        yield running


async def test_a_worker_stopped_mid_backlog_compiles_nothing_for_partitions_a_peer_took(worker, tmp_path):
    """Stopped while its backlog held both partitions' plans; the peer takes both and compiles their successors.

    On restart the worker's queue (read from its file) still names every plan. Until the group
    assigns it a partition it owns nothing: compiling then would put a second successor of the
    peer's plans on `plans` and `plan-dependencies`, beside the owner's own lineage.
    """
    fresh = freshest(await worker.load("atlas.jsonl"), await worker.publish_events(BOREAL_WAIVER))
    requests = [dict(r, budget={"tokens": 700 + i}) for i in range(PLANS) for r in (ATLAS_REQUEST, BOREAL_REQUEST)]
    entities = {}
    for request in requests:
        plan = await worker.select(request, fresh)
        entities[plan["plan_key"]] = plan["entity_id"]
    await worker.publish_events(revoke_role("maya", "credit_analyst"))
    await _stop_while_queued(worker)
    path = tmp_path / "state" / "freshplan.duckdb"
    # The stop may have cut the backlog between a job's commit and its publication; the worker would
    # send those records on restart, and while it waits for their acknowledgement the backlog waits
    # too. Sent here instead: the file is then as a stop just after an acknowledgement leaves it.
    await _send_outbox(worker, path)
    queued = _queued(path)
    assert {plan_partition(entities[k], 2) for k in queued} == {0, 1}, queued  # the stop left both queued

    peer = await start_peer(worker, tmp_path / "peer")
    try:
        await eventually(lambda: _owns(peer, [0, 1]), what="the peer owning every partition")
        # The peer has judged the stopped worker's plans stale and compiled every successor (maya's role is gone).
        await peer.records("plans", lambda rs: {r["plan_key"] for r in rs if r["admitted"] == []} >= set(entities),
                           timeout=90)  # judging and compiling 80 plans: allow for a loaded machine
        await eventually(_drained(peer), what="the peer's backlog drained")
        before = len(await _compilations(worker, entities))

        await worker.restart()
        await _split(worker, peer)
        await eventually(_drained(worker), what="the restarted worker's backlog drained")
        owned = set((await _health(worker))["owned_partitions"])
        since = _owning_since(worker)
        # Only the restarted worker publishes plans now (its outbox was empty), and only its own.
        new = sorted(await _compilations(worker, entities), key=lambda r: r[1])[before:]
        early = [key for key, at in new if at < since]
        foreign = [key for key, _ in new if plan_partition(entities[key], 2) not in owned]
        assert not early and not foreign, (f"{len(early)} successors published before the worker owned a "
                                           f"partition, {len(foreign)} of plans the peer owns")
    finally:
        peer.stop()


async def _stop_while_queued(w: WorkerProcess) -> None:
    """SIGTERM the worker as soon as its backlog holds announced plans (it drains a few per writer job).

    A clean stop forgets what the broker acknowledged: the file keeps the queue and an empty outbox,
    so nothing waits to be sent when the worker comes back (a kill -9 leaves records to send again).
    """
    async def queued() -> bool:
        return 16 < (await _health(w)).get("recompile_queue", 0) < 2 * PLANS
    deadline = asyncio.get_running_loop().time() + 30
    while not await queued():
        assert asyncio.get_running_loop().time() < deadline, "the revocation queued no plans"
        await asyncio.sleep(0.01)  # polling a figure: the queue fills and drains within a second
    w.stop()


def _queued(path) -> list[str]:
    """The plan keys in a stopped worker's recompile queue."""
    db = duckdb.connect(str(path), read_only=True)
    try:
        return [r[0] for r in db.execute("SELECT plan_key FROM recompile_queue").fetchall()]
    finally:
        db.close()


async def _send_outbox(w: WorkerProcess, path) -> None:
    """Publish what the stopped worker's outbox holds, in order, and forget it (as its publisher would)."""
    db = duckdb.connect(str(path))
    try:
        rows = db.execute("SELECT topic, key, value FROM outbox WHERE NOT standby ORDER BY seq").fetchall()
        producer = AIOKafkaProducer(bootstrap_servers=w.bootstrap)
        await producer.start()
        try:
            for topic, key, value in rows:
                await producer.send_and_wait(topic, value, key=key)
        finally:
            await producer.stop()
        db.execute("DELETE FROM outbox WHERE NOT standby")
    finally:
        db.close()


async def _compilations(w: WorkerProcess, entities: dict[str, str]) -> list[tuple[str, float]]:
    """(plan key, record timestamp in seconds) of every plan of these keys on `plans`."""
    consumer = AIOKafkaConsumer(bootstrap_servers=w.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(w.settings.topic("plans"), p) for p in range(w.settings.partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends, out = await consumer.end_offsets(parts), []
        while any([await consumer.position(tp) < end for tp, end in ends.items()]):
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                for m in messages:
                    plan = orjson.loads(m.value)
                    if plan["plan_key"] in entities:
                        out.append((plan["plan_key"], m.timestamp / 1000))
        return out
    finally:
        await consumer.stop()


def _owning_since(w: WorkerProcess) -> float:
    """When the worker last began owning plan partitions, from its log."""
    lines = [orjson.loads(line) for line in w.log_path.read_text().splitlines()
             if '"reason":"ownership"' in line]
    return datetime.fromisoformat(lines[-1]["ts"].replace("Z", "+00:00")).timestamp()


def _drained(w: WorkerProcess):
    """A check: nothing queued for recompiling and nothing waiting to be sent."""
    async def drained() -> bool:
        health = await _health(w)
        return health.get("recompile_queue") == 0 and health.get("outbox", 0) == 0
    return drained

