"""The revocation guard: unknown means closed, in the watcher and through a running worker."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from agents.invalidation import Invalidator, RawMessage
from agents.lag import LagWatcher
from agents.query import QueryService
from compiler.errors import AttestError
from state.local_state import LocalState
from streams.broker import EmbeddedBroker, free_port
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST


@pytest.fixture
def broker():
    """A broker of this module's own (overrides the session's): one test stops it."""
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture
def unreachable(tmp_path):
    """A service whose guard has never reached a broker."""
    state = LocalState.open(tmp_path / "f.duckdb")
    inv = Invalidator(state, lambda name: name)
    inv.apply([RawMessage(item["topic"], 0, n, None, orjson.dumps(item["event"])) for n, item in
               enumerate(map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines()))])
    guard = LagWatcher(state.store, f"127.0.0.1:{free_port()}", {"revocations": "revocations"}, bound_seconds=1)
    yield state, inv, guard
    state.close()


def test_a_guard_that_never_checked_is_unknown_and_refuses(unreachable):
    state, inv, guard = unreachable
    assert guard.status().state == "unknown"
    query = QueryService(state, inv, guard)
    with pytest.raises(AttestError) as refused:
        query.select(ATLAS_REQUEST)
    assert (refused.value.code, refused.value.status) == ("revocations_unknown", 503)
    assert state.plans.counts() == {}  # nothing compiled, nothing stored
    assert QueryService(state, inv).select(ATLAS_REQUEST)["served_from"] == "compiled"  # no guard: serves


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
