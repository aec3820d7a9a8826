"""The flush an apply batch kicks sends what that batch's job read of the outbox: no writer read queued behind the
next batch, and never a record twice, out of order, or left behind."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from agents.stream.publisher import Publisher
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST, launch, read_from_start


class Producer:
    """Acknowledges every send at once and remembers its key."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.sent.append(key)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class App:
    def __init__(self) -> None:
        self.producer = Producer()


@pytest.fixture
def setup(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    app = App()
    jobs: list[str] = []

    async def run(fn, *args, **kwargs):  # the writer, inline, naming each job
        jobs.append(getattr(fn, "__name__", repr(fn)))
        return fn(*args, **kwargs)

    yield state, app, Publisher(state, app, run, lambda: {}, prefetching=True), jobs
    state.close()


def _queue(state: LocalState, *keys: bytes, standby: bool = False) -> None:
    with state.store.transaction():
        state.outbox.add_many([("out", key, b"v") for key in keys],
                              [("source-changes", 0, i) for i, _ in enumerate(keys)], standby=standby)


@pytest.mark.timeout(10)
async def test_the_flush_sends_what_the_apply_job_read_without_reading_the_outbox_again(setup):
    state, app, publisher, jobs = setup
    _queue(state, b"a", b"b")
    publisher.prefetched.read()  # last thing in the apply job, on the writer thread
    await publisher.publish()
    assert app.producer.sent == [b"a", b"b"]
    assert "due" not in jobs
    assert publisher.prefetched.counts["used"] == 1
    # Nothing queued since: the next apply job reads nothing, and a flush then reads the outbox itself.
    publisher.prefetched.read()
    assert await publisher.publish() == 0 and jobs.count("due") == 1


@pytest.mark.timeout(10)
async def test_a_record_acknowledged_and_forgotten_after_the_read_is_not_sent_again(setup):
    state, app, publisher, jobs = setup
    held = asyncio.get_running_loop().create_future()
    sent: list[bytes] = []

    async def send(topic, key, value, partition, timestamp, headers):
        sent.append(key)
        return held if key == b"a" else asyncio.sleep(0)

    app.producer.send = send
    _queue(state, b"a")
    first = asyncio.ensure_future(publisher.publish())  # a flush already under way: it reads `a` itself
    while not sent:
        await asyncio.sleep(0.01)
    _queue(state, b"b")
    publisher.prefetched.read()  # the next apply job reads `a` (not acknowledged yet) and `b`
    held.set_result(None)
    await first
    with state.store.transaction():  # the apply job after it deletes the acknowledged row
        forgotten = state.outbox.forget_acked()
    state.outbox.acked.deleted(forgotten)
    assert not state.outbox.acked.current()  # so only what the prefetch logged can pass over it
    await publisher.publish()
    assert sent == [b"a", b"b"]


@pytest.mark.timeout(10)
async def test_a_record_queued_after_the_read_goes_out_with_the_same_flush(setup):
    state, app, publisher, jobs = setup
    _queue(state, b"a")
    publisher.prefetched.read()
    _queue(state, b"select")  # a select's compiled plan, queued by a writer job that reads nothing after
    newest = state.outbox.newest()
    await publisher.publish()
    assert app.producer.sent == [b"a", b"select"]
    assert publisher.acknowledged_through >= newest  # the select waiting on its record is told


@pytest.mark.timeout(10)
async def test_a_standby_record_promoted_after_the_read_keeps_its_place(setup):
    state, app, publisher, jobs = setup
    _queue(state, b"older", standby=True)
    _queue(state, b"newer")
    publisher.prefetched.read()
    with state.store.transaction():  # the owner takes its partition on: the older record comes due
        state.outbox.promote("source-changes", 0, 0, 0, drop_earlier=False)
    await publisher.publish()
    assert app.producer.sent == [b"older", b"newer"]
    assert publisher.prefetched.counts["passed_over"] == 1


@pytest.mark.timeout(10)
async def test_a_failed_read_never_fails_the_apply_job(setup, monkeypatch):
    state, app, publisher, jobs = setup
    _queue(state, b"a")

    def broken(*args, **kwargs):
        raise RuntimeError("the file went away")

    monkeypatch.setattr(state.outbox, "due", broken)
    publisher.prefetched.read()
    assert publisher.prefetched.counts["failed"] == 1
    monkeypatch.undo()
    await publisher.publish()
    assert app.producer.sent == [b"a"]


@pytest.mark.timeout(90)
async def test_through_the_broker_a_policy_version_s_announcements_go_out_from_the_apply_job_s_read(
        broker, tmp_path):
    async with launch(broker, tmp_path) as worker:
        loaded = await worker.load("atlas.jsonl")
        plans = {(await worker.select(dict(ATLAS_REQUEST, query=f"prefetch {i}"), loaded))["plan_id"]
                 for i in range(3)}
        bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
        await worker.publish_events(("policy-versions", dict(bundle, event_id="prefetch-v2", version=2)))
        consumer = await read_from_start(worker.bootstrap, worker.settings.topic("plan-invalidations"),
                                         worker.settings.partitions)
        seen: list[str] = []
        try:
            while not plans <= set(seen):
                for messages in (await asyncio.wait_for(consumer.getmany(timeout_ms=200), 60)).values():
                    seen += [doc["plan_id"] for m in messages
                             if (doc := orjson.loads(m.value))["cause"]["event_id"] == "prefetch-v2"]
            await asyncio.sleep(0.5)  # a record sent twice would follow at once
            seen += [orjson.loads(m.value)["plan_id"] for ms in (await consumer.getmany(timeout_ms=500)).values()
                     for m in ms if orjson.loads(m.value)["cause"]["event_id"] == "prefetch-v2"]
        finally:
            await consumer.stop()
        assert sorted(seen) == sorted(plans)  # each announced once
        health = await worker.get("/healthz")
        assert health["outbox_prefetches"]["used"] >= 1 and health["outbox_prefetches"]["failed"] == 0



@pytest.mark.timeout(10)
async def test_a_read_cut_short_is_read_on_past_by_the_flush(setup):
    state, app, publisher, jobs = setup
    publisher.prefetched.read_rows = 3  # as a read stops at READ_ROWS records
    _queue(state, b"a", b"b", b"c", b"d", b"e")
    publisher.prefetched.read()
    await publisher.publish()
    assert app.producer.sent == [b"a", b"b", b"c", b"d", b"e"]
