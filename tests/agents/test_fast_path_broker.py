"""Early announcements through the broker: subscribers hear first, selects never contradict them, a crash re-sends."""

from __future__ import annotations

import asyncio
import time
import uuid

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agents.cli.loader import publish, read_scenario
from agents.plans.plan_writer import PlanWriter
from agents.stream.event_apply import EventApplier
from agents.stream.fast_path import FastPath
from agents.stream.replica import Replica
from agents.web.query import QueryService
from schemas.codec import decode
from schemas.freshness import decode_token
from state.local_state import LocalState
from streams.settings import INPUT_TOPICS, Settings
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST, token_key_file

EDITS = 40


def edits(plan: dict, first_version: int, n: int = EDITS) -> list[tuple[str, dict]]:
    """`n` new versions of the facility record the Atlas plan admitted (each changes the plan)."""
    item = next(i for i in plan["admitted"] if i["resource_id"] == "facility-F102")
    line = next(line for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines()
                if orjson.loads(line)["event"].get("resource", {}).get("id") == "facility-F102")
    base = orjson.loads(line)["event"]
    assert item["version"] < first_version
    return [("source-changes", dict(base, event_id=f"edit-{uuid.uuid4().hex[:8]}-{v}",
                                    resource=dict(base["resource"], version=v, content=f"limit, revision {v}")))
            for v in range(first_version, first_version + n)]


class Subscriber:
    """A consumer of `plan-invalidations` from its end: when each record was seen."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10)
        self.parts = [TopicPartition(topic, p) for p in range(partitions)]
        self.seen: list[tuple[float, dict]] = []
        self.task: asyncio.Task | None = None

    async def __aenter__(self) -> "Subscriber":
        await self.consumer.start()
        self.consumer.assign(self.parts)
        await self.consumer.seek_to_end(*self.parts)
        for tp in self.parts:
            await self.consumer.position(tp)
        self.task = asyncio.ensure_future(self._read())
        return self

    async def _read(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=20)
            now = time.time()
            self.seen.extend((now, orjson.loads(m.value)) for records in batch.values() for m in records)

    async def __aexit__(self, *exc) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.consumer.stop()


@pytest.mark.timeout(120)
async def test_selects_never_answer_a_plan_after_its_early_announcement(worker):
    fresh = await worker.load("atlas.jsonl")
    plan = await worker.select(ATLAS_REQUEST, fresh)
    answers: list[tuple[float, str]] = []  # (when the select was sent, the plan id it answered)
    stop = asyncio.Event()

    async def select_while_editing() -> None:
        while not stop.is_set():
            started = time.time()
            async with worker.http.post(f"{worker.url}/v1/select", json=ATLAS_REQUEST) as resp:
                doc = await resp.json()
                if resp.status == 200:
                    answers.append((started, doc["plan_id"]))
                else:
                    assert resp.status == 503 and doc["error"]["code"] == "plan_being_replaced", doc

    async with Subscriber(worker.bootstrap, worker.settings.topic("plan-invalidations"),
                          worker.settings.partitions) as subscriber:
        selecting = asyncio.ensure_future(select_while_editing())
        token = None
        for item in edits(plan, 100):
            token = await worker.publish_events(item)
            await asyncio.sleep(0.01)
        await worker.select(ATLAS_REQUEST, token)  # everything applied
        stop.set()
        await selecting
        await asyncio.sleep(0.5)  # the last records reach the subscriber

    health = await worker.get("/healthz")
    assert health["early_announcements"]["early_announcements"] >= 1, health["early_announcements"]
    # The race was run: selects arrived while an announced edit was still being applied, and waited.
    assert health["counters"].get("selects.waited_for_early_announcement", 0) >= 1, health["counters"]
    heard = {}
    causes: dict[str, set] = {}
    for seen_at, record in subscriber.seen:
        heard.setdefault(record["plan_id"], seen_at)
        causes.setdefault(record["plan_id"], set()).add((record["cause"]["partition"], record["cause"]["offset"]))
    assert plan["plan_id"] in heard
    stale = [(started - heard[plan_id], plan_id) for started, plan_id in answers
             if plan_id in heard and started > heard[plan_id]]
    assert not stale, f"selects sent after a plan's announcement answered it: {stale[:5]}"
    assert all(len(c) == 1 for c in causes.values()), f"a plan announced under several causes: {causes}"
    for plan_id in heard:
        assert (await worker.get(f"/v1/plans/{plan_id}"))["status"] == "invalidated"


@pytest.mark.timeout(120)
async def test_an_announcement_whose_batch_never_committed_is_sent_again_after_a_restart(broker, tmp_path):
    """The worker dies between its early announcement and the batch's commit (the writer never ran it):
    the next start applies the event again and queues the same invalidation, same cause."""
    settings = Settings(topic_prefix=f"early{uuid.uuid4().hex[:8]}-", token_key_file=token_key_file())
    topics = {name: settings.topic(name) for name in INPUT_TOPICS}
    token = await publish(settings, broker.bootstrap_servers, read_scenario(SCENARIOS / "atlas.jsonl"))
    path = tmp_path / "f.duckdb"
    state = LocalState.open(path)
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    gate = asyncio.Event()  # never set: the writer is stuck until the process "dies"
    loaded = asyncio.Event()
    replica: Replica | None = None

    async def run(fn, *args):
        if loaded.is_set():
            await gate.wait()
        return fn(*args)

    try:
        fast = FastPath(state.store.heads, owns=lambda entity_id: True,
                        send=lambda topic, key, value: producer.send(topic, value, key=key),
                        topic_of=settings.topic,
                        decode=lambda m: decode(m.topic, m.key, m.value, position=f"{m.partition}:{m.offset}"),
                        applied=lambda t, p, o: replica is not None and replica.applied(t, p, o),
                        event_time=lambda: None)
        applier = EventApplier(state, PlanWriter(state, settings.topic, sent_early=fast.acknowledged),
                               early=fast.announced)
        replica = Replica(applier, state.store, broker.bootstrap_servers, topics, auto_rebase=True, run=run,
                          early=fast)
        running = asyncio.ensure_future(replica.run())
        await asyncio.wait_for(replica.wait_covers(decode_token(token)), 30)
        plan = QueryService(state, applier.plans).select(ATLAS_REQUEST)
        loaded.set()
        async with Subscriber(broker.bootstrap_servers, settings.topic("plan-invalidations"),
                              settings.partitions) as subscriber:
            await publish(settings, broker.bootstrap_servers, read_scenario_items(tmp_path, edits(plan, 100, 1)))
            deadline = time.time() + 20
            while not subscriber.seen and time.time() < deadline:
                await asyncio.sleep(0.05)
        assert [r["plan_id"] for _, r in subscriber.seen] == [plan["plan_id"]], "no early announcement"
        early = subscriber.seen[0][1]
        running.cancel()  # dies: the batch holding the edit was never applied
        await asyncio.gather(running, return_exceptions=True)
    finally:
        await producer.stop()
        state.close()

    state = LocalState.open(path)
    try:
        applier = EventApplier(state, PlanWriter(state, settings.topic))
        replica = Replica(applier, state.store, broker.bootstrap_servers, topics, auto_rebase=True)
        running = asyncio.ensure_future(replica.run())
        cause = early["cause"]
        await asyncio.wait_for(replica.wait_applied("source-changes", cause["partition"], cause["offset"]), 30)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        queued = [orjson.loads(v) for _, t, _, v in state.outbox.pending() if t == settings.topic("plan-invalidations")]
        assert [(r["plan_id"], r["cause"]) for r in queued] == [(early["plan_id"], early["cause"])]
    finally:
        state.close()


def read_scenario_items(directory, items: list[tuple[str, dict]]):
    """(topic, key, value) records of (topic, event) pairs, keyed as the loader keys them."""
    path = directory / f"events-{uuid.uuid4().hex[:6]}.jsonl"
    path.write_text("\n".join(orjson.dumps({"topic": t, "event": e}).decode() for t, e in items))
    return read_scenario(path)
