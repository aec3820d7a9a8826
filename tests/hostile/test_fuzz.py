"""Property-based fuzz of HTTP bodies and input events: no 500, no dead worker, rejected input changes nothing."""

from __future__ import annotations

import asyncio
import itertools
import json
import math

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.conftest import ATLAS_REQUEST, SCENARIOS

pytestmark = pytest.mark.timeout(280)

FIELDS = ["decision_type", "principal", "purpose", "entity", "decision_time", "query", "budget",
          "at_least_as_fresh", "tokens", "calls", "latency_ms", "privacy", "money", "kind", "op", "resource"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40),
                    st.sampled_from(["now", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-01:00",
                                     "2026-08-30T00:00:00Z", "Atlas", "maya", "ft2.e30", "\u0000", "💥"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=8)),
                                                 inner, max_size=5)), max_leaves=25)


def _bodies():
    """Whole bodies: mutations of a valid request, arbitrary JSON, and bytes that are not JSON."""
    mutated = st.builds(lambda base, changes: {**base, **changes}, st.just(ATLAS_REQUEST),
                        st.dictionaries(st.sampled_from(FIELDS[:8]), json_values, max_size=2))
    budgets = st.builds(lambda budget: dict(ATLAS_REQUEST, budget=budget),
                        st.dictionaries(st.sampled_from(["tokens", "calls", "latency_ms", "privacy", "money"]),
                                        scalars, max_size=3))
    as_json = st.one_of(mutated, budgets, json_values).map(lambda doc: json.dumps(doc).encode())  # big ints too
    raw = st.one_of(st.binary(max_size=200), st.sampled_from([b"[" * 5000, b'{"a":' * 3000, b"NaN", b"1e999",
                                                              b'{"budget": {"tokens": 1e400}}']))
    return st.one_of(as_json, raw)


def _broken_events():
    """Input events that must be rejected: a valid shape with one rule broken, plus noise."""
    base = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[6])["event"]  # a resource upsert
    breaks = st.sampled_from([
        lambda e: {k: v for k, v in e.items() if k != "event_id"},
        lambda e: dict(e, schema_version=99),
        lambda e: dict(e, occurred_at="yesterday"),
        lambda e: dict(e, resource=dict(e["resource"], version="two")),
        lambda e: dict(e, resource=dict(e["resource"], tokens=2**64)),
        lambda e: dict(e, resource=dict(e["resource"], valid_to="9999-12-31T23:59:59-01:00")),
        lambda e: dict(e, kind="spaceship"),
    ])
    ids = itertools.count()

    def build(brk, noise) -> bytes:
        resource = dict(base["resource"], attributes=dict(base["resource"]["attributes"], noise=noise))
        return json.dumps(brk(dict(base, event_id=f"fuzz-{next(ids)}", resource=resource))).encode()

    return st.builds(build, breaks, json_values)


async def test_fuzzed_bodies_and_events_never_give_a_500_or_change_state(worker):
    loaded = await worker.load("atlas.jsonl")
    baseline = await worker.select(ATLAS_REQUEST, loaded)
    loop = asyncio.get_running_loop()
    seen: dict[int, int] = {}

    async def post(body: bytes) -> int:
        async with worker.http.post(f"{worker.url}/v1/select", data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
            await resp.read()
            return resp.status

    @settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(_bodies())
    def bodies(body: bytes) -> None:
        status = asyncio.run_coroutine_threadsafe(post(body), loop).result(30)
        seen[status] = seen.get(status, 0) + 1
        assert status < 500, body[:200]

    await asyncio.to_thread(bodies)

    events: list[bytes] = []

    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(_broken_events())
    def collect(event: bytes) -> None:
        events.append(event)

    await asyncio.to_thread(collect)
    before = (await worker.get("/healthz"))["counters"]
    token = await worker.publish([("source-changes", b"facility-F102", e) for e in events])
    after = await worker.select(ATLAS_REQUEST, token)
    counters = (await worker.get("/healthz"))["counters"]
    letters = sum(v for k, v in counters.items() if k.startswith("dead_letters.")) - sum(
        v for k, v in before.items() if k.startswith("dead_letters."))
    print(f"fuzz: {sum(seen.values())} bodies, statuses {dict(sorted(seen.items()))}; {len(events)} broken events,"
          f" {letters} dead-lettered")
    assert letters == len(events) and worker.proc.poll() is None
    assert after["plan_id"] == baseline["plan_id"] and not math.isnan(len(after["admitted"]))
    assert all(status < 500 for status in seen) and seen.get(200) and len(seen) >= 3  # it reached every pass
