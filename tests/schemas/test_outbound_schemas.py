"""Every record a worker publishes matches the JSON Schema shipped for its topic."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST, launch
from tests.events import envelope, resource, tick
from tests.schema_check import OUTBOUND, validators

pytestmark = pytest.mark.timeout(240)

LIVE = dict(ATLAS_REQUEST, decision_time="now")
OTHER = dict(ATLAS_REQUEST, budget={"tokens": 1500})
BUNDLE = {k: v for k, v in orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"].items()
          if k not in ("event_id", "schema_version", "occurred_at")}
ADMITTED = ("facility-F102", "workflow-E88", "policy-P3")


async def _read_all(worker, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every (key, value) on a topic now, tombstones included."""
    consumer = AIOKafkaConsumer(bootstrap_servers=worker.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(worker.settings.topic(topic), p) for p in range(worker.settings.partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        seen: list[tuple[bytes | None, bytes | None]] = []
        while any([await consumer.position(tp) < end for tp, end in ends.items()]):
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                seen.extend((m.key, m.value) for m in messages)
        return seen
    finally:
        await consumer.stop()


def _bloated(size: int) -> list[tuple[str, dict]]:
    lines = [orjson.loads(line) for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines()]
    return [("source-changes", dict(item["event"], event_id=f"bloat-{r['id']}",
                                    resource=dict(r, version=2, content=r["id"][0] * size)))
            for item in lines if (r := item["event"].get("resource") or {}).get("id") in ADMITTED]


async def _produce_every_kind(worker) -> None:
    """Plans, receipts, invalidations of several reasons (one redacted), dead letters, a compact plan, evictions."""
    loaded = await worker.load("atlas.jsonl")
    plan = await worker.select(ATLAS_REQUEST, loaded)
    await worker.select(OTHER, loaded)
    await worker.select(LIVE, loaded)
    # Deleting the resource maya may not see: a redacted cause, and its full cause on `receipts`.
    fresh = await worker.publish_events(("source-changes", envelope(kind="resource", op="delete",
                                                                    resource={"id": "investigation-X9"})))
    await worker.select(ATLAS_REQUEST, fresh)
    fresh = await worker.publish_events(*_bloated(25_000))           # plans over the 60 kB limit: compact
    compact = await worker.select(ATLAS_REQUEST, fresh)
    published = await worker.records("plans", lambda rs: any(r["plan_id"] == compact["plan_id"] for r in rs))
    assert any(item.get("content_omitted") for r in published if r["plan_id"] == compact["plan_id"]
               for item in r["admitted"])
    fresh = await worker.publish_events(("policy-versions", envelope(**dict(BUNDLE, version=2))))
    await worker.select(ATLAS_REQUEST, fresh)
    fresh = await worker.publish_events(resource("approved-waiver-W2", valid_to="2026-09-01T00:00:00Z"))
    live = await worker.select(LIVE, fresh)
    assert live["valid_until"]
    topic, waiver = resource("w-bad")
    await worker.publish([
        ("source-changes", b"w1", b"{\"event_id\": "),
        ("source-changes", b"w2", orjson.dumps(dict(waiver, resource=dict(waiver["resource"], tokens="x")))),
        ("source-changes", b"w4", orjson.dumps(dict(waiver, schema_version=7))),
        ("policy-versions", b"credit", orjson.dumps(envelope(**dict(BUNDLE, version=3, cedar="permit(")))),
        ("policy-versions", b"rogue", orjson.dumps(envelope(**dict(BUNDLE, bundle_id="rogue", version=1)))),
        ("clock", None, orjson.dumps(tick("2026-01-01T00:00:00Z")[1])),
        ("clock", None, orjson.dumps(tick("2206-01-01T00:00:00Z")[1])),
    ])
    await worker.publish_events(tick(live["valid_until"]))            # the live plan's horizon
    await worker.records("plan-invalidations", lambda rs: "time_passed" in {r["reason"] for r in rs})
    await worker.publish_events(tick("2026-10-09T09:00:00Z"))        # 40 days on: unused plans are evicted
    await worker.records("plan-invalidations", lambda rs: "evicted" in {r["reason"] for r in rs})
    await worker.records("dead-letters", lambda rs: len(rs) >= 8)
    assert plan["withheld"] == 1
    # Below any plan's compact form: the next plan is dead-lettered `record_too_large`.
    worker.stop()
    worker.env["FRESHPLAN_MAX_RECORD_BYTES"] = "2500"
    await worker.restart()
    await worker.select(dict(ATLAS_REQUEST, budget={"tokens": 900}))
    await worker.records("dead-letters", lambda rs: any(r["error_class"] == "record_too_large" for r in rs))


async def test_every_outbound_record_matches_its_shipped_schema(broker, tmp_path):
    async with launch(broker, tmp_path, FRESHPLAN_MAX_RECORD_BYTES="60000", FRESHPLAN_RETENTION_INTERVAL="0.2",
                      FRESHPLAN_PLAN_RETENTION="P30D") as worker:
        await asyncio.wait_for(_produce_every_kind(worker), 180)
        check = validators(documented=True)
        seen: dict[str, list[dict]] = {}
        problems = []
        for topic in OUTBOUND:
            for key, value in await _read_all(worker, topic):
                if value is None:   # an eviction's tombstone: only `plans` is compacted by key
                    assert topic == "plans" and key
                    continue
                doc = orjson.loads(value)
                seen.setdefault(topic, []).append(doc)
                kind = doc.get("reason") or doc.get("error_class") or doc.get("kind", "")
                problems += [f"{topic} {kind}: {'/'.join(map(str, e.absolute_path))}: {e.message}"
                             for e in check[topic].iter_errors(doc)]
    assert problems == []
    reasons = {r["reason"] for r in seen["plan-invalidations"]}
    assert {"source_changed", "time_passed", "evicted"} <= reasons
    assert reasons & {"policy_changed", "contract_changed"}  # whichever of the bundle's keys reached it first
    assert any(r["cause"]["dependency_key"] == "resource:withheld" for r in seen["plan-invalidations"])
    assert {r.get("kind", "compilation") for r in seen["receipts"]} == {"compilation", "invalidation"}
    assert {"malformed_json", "schema_violation", "unknown_schema_version", "invalid_policy", "decision_type_conflict",
            "clock_regression", "clock_jump", "record_too_large"} <= {r["error_class"] for r in seen["dead-letters"]}
    assert any(item.get("content_omitted") for r in seen["plans"] for item in r["admitted"])
    assert seen["clock"]  # the test's own ticks: the worker's wall clock is off here


def test_the_validators_refuse_what_the_schemas_forbid():
    check = validators()
    assert not check["plan-invalidations"].is_valid({"schema_version": 1, "plan_id": "p", "plan_key": "k",
                                                     "reason": "felt_like_it", "cause": {},
                                                     "invalidated_at": "x", "successor_plan_id": None})
    assert not check["clock"].is_valid({"event_id": "e", "schema_version": 1, "occurred_at": "yesterday",
                                        "now": "2026-08-30T00:00:00Z"})
    assert not check["receipts"].is_valid({"schema_version": 1, "receipt_id": "r", "kind": "invalidation",
                                           "plan_id": "p"})
    tick = {"event_id": "e", "schema_version": 1, "occurred_at": "2026-08-30T00:00:00Z", "now": "2026-08-30T00:00:00Z"}
    assert check["clock"].is_valid(dict(tick, extra=1)) and check["clock"].is_valid(tick)
    assert not validators(documented=True)["clock"].is_valid(dict(tick, extra=1))


def test_every_dead_letter_class_the_code_raises_is_in_the_dead_letters_schema():
    import re

    from tests.conftest import ROOT

    raised = set()
    for package in ("schemas", "compiler", "state", "agents", "streams"):
        for path in (ROOT / package).rglob("*.py"):
            raised |= set(re.findall(r'InvalidEvent\(\s*"([a-z_]+)"', path.read_text()))
    schema = orjson.loads((ROOT / "schemas" / "json" / "dead-letters.schema.json").read_bytes())
    allowed = set(schema["properties"]["error_class"]["enum"])
    assert raised and raised <= allowed, sorted(raised - allowed)
