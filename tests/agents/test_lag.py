"""The guard's verdicts: unknown means closed; revocations and policy versions both fail closed; resets and
pauses refuse."""

from __future__ import annotations

import asyncio
import time
import uuid

import orjson
import pytest

from agents.stream.event_apply import EventApplier
from agents.stream.raw_message import RawMessage
from agents.plans.plan_writer import PlanWriter
from agents.stream.lag import LagWatcher
from agents.web.query import QueryService
from compiler.errors import AttestError
from state.local_state import LocalState
from state.store import Store
from streams.broker import EmbeddedBroker, free_port
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST

TOPICS = {t: t for t in ("source-changes", "policy-versions", "revocations", "clock")}


@pytest.fixture
def broker():
    """A broker of this module's own (overrides the session's): one test stops it."""
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture
def unreachable(tmp_path):
    """A service whose guard has never reached a broker."""
    state = LocalState.open(tmp_path / "f.duckdb")
    inv = EventApplier(state, PlanWriter(state, lambda name: name))
    inv.apply([RawMessage(item["topic"], 0, n, None, orjson.dumps(item["event"])) for n, item in
               enumerate(map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines()))])
    guard = LagWatcher(state.store, f"127.0.0.1:{free_port()}", {"revocations": "revocations"}, bound_seconds=1)
    yield state, inv, guard
    state.close()


def test_a_guard_that_never_checked_is_unknown_and_refuses(unreachable):
    state, inv, guard = unreachable
    assert guard.status().state == "unknown"
    query = QueryService(state, inv.plans, guard)
    with pytest.raises(AttestError) as refused:
        query.select(ATLAS_REQUEST)
    assert (refused.value.code, refused.value.status) == ("revocations_unknown", 503)
    assert state.plans.counts() == {}  # nothing compiled, nothing stored
    assert QueryService(state, inv.plans).select(ATLAS_REQUEST)["served_from"] == "compiled"  # no guard: serves


def test_a_guard_whose_last_check_is_old_is_unknown_again(unreachable):
    state, inv, guard = unreachable
    guard.ends, guard._lag = {"revocations": {0: 0}}, 0
    guard._checked_at = time.monotonic()
    assert guard.check().state == "ok"
    guard._checked_at = time.monotonic() - 10  # the broker stopped answering
    assert guard.status().state == "unknown"
    with pytest.raises(AttestError) as refused:
        guard.check()
    assert refused.value.code == "revocations_unknown"


async def test_a_worker_that_loses_its_broker_refuses_even_a_cached_plan(worker, broker):
    fresh = await worker.load("atlas.jsonl")
    plan = await worker.select(ATLAS_REQUEST, fresh)
    assert (await worker.select(ATLAS_REQUEST))["served_from"] == "cache"
    broker.stop()
    for _ in range(300):
        if (await worker.get("/healthz"))["revocations"]["state"] == "unknown":
            break
        await asyncio.sleep(0.1)
    refused = await worker.select(ATLAS_REQUEST, expect=503)
    assert refused["error"]["code"] == "revocations_unknown"
    assert (await worker.get(f"/v1/plans/{plan['plan_id']}"))["status"] == "fresh"  # kept, just not served
    worker.kill()  # its shutdown would wait for the missing broker


@pytest.fixture
def guard(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    watcher = LagWatcher(store, "unused:9092", TOPICS, bound_seconds=1.0)
    watcher._checked_at = time.monotonic()
    yield watcher
    store.close()


def _refusal(guard) -> str:
    with pytest.raises(AttestError) as caught:
        guard.check()
    assert caught.value.status == 503
    return caught.value.code


def test_unknown_until_checked(guard):
    guard._checked_at = None
    assert _refusal(guard) == "revocations_unknown"


def test_policy_versions_behind_the_bound_refuse(guard):
    guard.ends = {"policy-versions": {0: 2}}
    guard._started_at = guard._caught_up["policy-versions"] = time.monotonic() - 5
    assert _refusal(guard) == "policy_versions_behind"
    with guard.store.transaction():
        guard.store.save_offsets({("policy-versions", 0): 2})
    assert guard.check().state == "ok"


def test_revocations_behind_the_bound_refuse(guard):
    guard.ends = {"revocations": {1: 1}}
    guard._started_at = time.monotonic() - 5
    assert _refusal(guard) == "revocations_behind"


def test_a_reset_outranks_everything(guard):
    guard.paused.add("revocations")
    guard.blocked["source-changes"] = "cluster_changed"
    assert _refusal(guard) == "input_reset"


def test_paused_guarded_topics_refuse_and_others_degrade(guard):
    guard.paused.update({"clock", "source-changes"})
    assert guard.check().state == "ok" and guard.degraded() == ["source-changes", "clock"]
    guard.paused.add("policy-versions")
    assert _refusal(guard) == "input_paused"


@pytest.mark.timeout(60)
async def test_between_refreshes_the_watcher_fetches_nothing_and_each_refresh_still_sees_the_end(broker, tmp_path):
    """Through the broker: its partitions are paused once judged (an idle worker fetched every 50 ms) and resumed
    for the next refresh, which learns the records published meanwhile."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"lag-pause-{uuid.uuid4().hex[:8]}-revocations"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=20)
    await producer.start()
    store = Store(tmp_path / "s.duckdb")
    watcher = LagWatcher(store, broker.bootstrap_servers, {"revocations": topic}, bound_seconds=60.0)
    try:
        for published, more in ((3, 3), (5, 2)):
            # One batch: Tansu's ListOffsets counts batches, so only a fetch (resumed) learns where the records end.
            await asyncio.gather(*[await producer.send(topic, b"{}") for _ in range(more)])
            await watcher.refresh()
            for _ in range(20):  # a refresh may end before the broker answers the fetch it began
                if watcher.lags() == {"revocations": {0: published}}:
                    break
                await watcher.refresh()
            assert watcher.lags() == {"revocations": {0: published}}
            consumer = watcher._consumer
            assert consumer.assignment() and consumer.paused() == consumer.assignment()
    finally:
        await watcher.stop()
        await producer.stop()
        store.close()
