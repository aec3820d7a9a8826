"""Finding 2: a record too large to publish never stops a worker; plans go out compact, the rest dead-lettered."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from tests.conftest import ATLAS_REQUEST, SCENARIOS

pytestmark = pytest.mark.timeout(240)

ADMITTED = ("facility-F102", "workflow-E88", "policy-P3")


def _bloated(size: int) -> list[tuple[str, dict]]:
    """New versions of the three items Atlas admits, each with `size` characters of content."""
    lines = [orjson.loads(line) for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines()]
    out = []
    for item in lines:
        resource = item["event"].get("resource") or {}
        if resource.get("id") in ADMITTED:
            event = dict(item["event"], event_id=f"bloat-{resource['id']}",
                         resource=dict(resource, version=2, content=resource["id"][0] * size))
            out.append(("source-changes", event))
    return out


async def test_a_plan_larger_than_the_broker_accepts_goes_out_compact(worker):
    loaded = await worker.load("atlas.jsonl")
    before = await worker.select(ATLAS_REQUEST, loaded)
    bloated = await worker.publish_events(*_bloated(400_000))  # three valid 400 KB updates
    after = await worker.select(ATLAS_REQUEST, bloated)
    assert after["plan_id"] != before["plan_id"]
    assert sorted(len(item["content"]) for item in after["admitted"]) == [400_000] * 3  # callers get it all

    published = await worker.records("plans", lambda rs: any(r["plan_id"] == after["plan_id"] for r in rs))
    [compact] = [r for r in published if r["plan_id"] == after["plan_id"]]
    assert all(item["content_omitted"] and len(item["content_sha256"]) == 64 and "content" not in item
               for item in compact["admitted"])
    announced = await worker.records("plan-invalidations",
                                     lambda rs: any(r["plan_id"] == before["plan_id"] for r in rs))
    # Announced before its successor was compiled; the successor went out compact on `plans` above.
    assert all(r["successor_plan_id"] is None for r in announced if r["plan_id"] == before["plan_id"])

    # A restart finds an empty outbox, not a record it dies on again.
    worker.stop()
    await worker.restart()
    health = await worker.get("/healthz")
    assert health["outbox"] == 0 and health["counters"]["outbound_compacted"] >= 1
    assert (await worker.select(ATLAS_REQUEST, bloated))["plan_id"] == after["plan_id"]


async def test_a_record_that_cannot_fit_even_compact_is_dead_lettered(worker):
    worker.stop()
    worker.env["FRESHPLAN_MAX_RECORD_BYTES"] = "2500"  # below any plan's compact form
    await worker.restart()
    loaded = await worker.load("atlas.jsonl")
    plan = await worker.select(ATLAS_REQUEST, loaded)
    letters = await worker.records("dead-letters", lambda rs: any(r["error_class"] == "record_too_large"
                                                                   and r["outbound_key"] == plan["plan_id"]
                                                                   for r in rs))
    [letter] = [r for r in letters if r.get("outbound_key") == plan["plan_id"]]
    assert letter["topic"].endswith("plans") and letter["original"] == "" and letter["original_size"] + 512 > 2500
    for _ in range(50):
        health = await worker.get("/healthz")
        if health["outbox"] == 0:
            break
        await asyncio.sleep(0.1)
    assert health["outbox"] == 0 and health["counters"]["dead_letters.record_too_large"] >= 1
    assert worker.proc.poll() is None


async def test_a_plan_dependencies_record_too_large_with_its_receipt_is_published_whole_without_it(worker):
    # Atlas: plans and receipts records fit 5,000 bytes; the plan-dependencies record carrying the receipt
    # does not, even compact. Without its receipt it fits, and a worker taking the plan over can restore it.
    worker.stop()
    worker.env["FRESHPLAN_MAX_RECORD_BYTES"] = "5000"
    await worker.restart()
    loaded = await worker.load("atlas.jsonl")
    plan = await worker.select(ATLAS_REQUEST, loaded)
    internal = await worker.records("plan-dependencies", lambda rs: any(r.get("plan_id") == plan["plan_id"]
                                                                         for r in rs), timeout=20)
    [record] = [r for r in internal if r.get("plan_id") == plan["plan_id"]]
    assert "receipt" not in record and not any(item.get("content_omitted") for item in record["admitted"])
    health = await worker.get("/healthz")
    assert health["counters"].get("dead_letters.record_too_large", 0) == 0


async def test_an_input_key_near_the_limit_gets_one_dead_letter_under_a_hashed_key_and_the_outbox_drains(worker):
    """Its dead letter once carried the key twice: too large in turn, refused, re-lettered, for ever."""
    loaded = await worker.load("atlas.jsonl")
    await worker.select(ATLAS_REQUEST, loaded)
    key = b"k" * 999_600  # an input key the broker accepts; a letter keyed and naming it so would not fit
    token = await worker.publish([("source-changes", key, b"{")])
    await worker.select(ATLAS_REQUEST, token)  # applied
    letters = await worker.records("dead-letters", lambda rs: any(r.get("offset", -1) >= 0 for r in rs))
    # Routed, the record (its key) is larger than a routed batch may be: cut, and dead-lettered for its size.
    [letter] = [r for r in letters if r["error_class"] == "oversized"]
    assert letter["original_size"] == 1 and letter["original_truncated"] is False, letter
    assert "FRESHPLAN_MAX_RECORD_BYTES" in letter["message"], letter
    health = await worker.get("/healthz")
    for _ in range(50):  # drained, and it stays drained: nothing re-queues itself
        if health["outbox"] == 0:
            break
        await asyncio.sleep(0.1)
        health = await worker.get("/healthz")
    assert health["outbox"] == 0
    await asyncio.sleep(1.5)  # a flush timer's round: a looping publisher would keep counting
    again = await worker.get("/healthz")
    assert again["outbox"] == 0 and not again["counters"].get("dead_letters.record_too_large")
    assert not again["counters"].get("outbound_dropped")
    log = worker.log_path.read_text()
    assert log.count("k" * 200) == 0  # the key is never logged whole
