"""Debezium envelopes (create, update, snapshot read, delete, tombstone) through the broker."""

from __future__ import annotations

import orjson

from tests.conftest import ATLAS_REQUEST
from tests.events import resource


def envelope(op: str, before: dict | None, after: dict | None, lsn: int) -> bytes:
    return orjson.dumps({"schema": {"type": "struct"}, "payload": {
        "before": before, "after": after, "op": op, "ts_ms": 1788000000000 + lsn,
        "source": {"connector": "postgresql", "table": "documents", "lsn": lsn}}})


def waiver_slot(plan: dict) -> str:
    return next(s["state"] for s in plan["slots"] if s["proposition"] == "waiver_valid")


async def test_debezium_changes_drive_plans(worker):
    fresh = await worker.load("atlas.jsonl")
    assert waiver_slot(await worker.select(ATLAS_REQUEST, fresh)) == "unknown"
    row = resource("approved-waiver-W2")[1]["resource"]
    key = b"approved-waiver-W2"

    fresh = await worker.publish([("source-changes", key, envelope("r", None, row, 10))])   # snapshot read
    assert waiver_slot(await worker.select(ATLAS_REQUEST, fresh)) == "supported"
    expired = dict(row, version=2, valid_to="2026-08-29T12:00:00Z")
    fresh = await worker.publish([("source-changes", key, envelope("u", row, expired, 11))])
    assert waiver_slot(await worker.select(ATLAS_REQUEST, fresh)) == "unknown"         # update: expired
    fresh = await worker.publish([("source-changes", key, envelope("c", None, dict(row, version=3), 12))])
    assert waiver_slot(await worker.select(ATLAS_REQUEST, fresh)) == "supported"       # create again
    fresh = await worker.publish([("source-changes", key, envelope("d", dict(row, version=3), None, 13))])
    assert waiver_slot(await worker.select(ATLAS_REQUEST, fresh)) == "unknown"         # delete
    fresh = await worker.publish([("source-changes", key, envelope("c", None, dict(row, version=4), 14)),
                                  ("source-changes", key, None)])                       # create, then tombstone
    assert waiver_slot(await worker.select(ATLAS_REQUEST, fresh)) == "unknown"
    health = await worker.get("/healthz")
    assert not any(name.startswith("dead_letters.") for name in health["counters"])
