"""Finding 3 of issue 10 through the broker: event ids are scoped by topic and checked for content."""

from __future__ import annotations

import orjson

from tests.conftest import ATLAS_REQUEST
from tests.events import resource, revoke_role


def mysql_envelope(row: dict, binlog: str, pos: int) -> bytes:
    return orjson.dumps({"before": None, "after": row, "op": "c", "ts_ms": 1788000000000,
                         "source": {"connector": "mysql", "table": "documents", "file": binlog, "pos": pos,
                                    "row": 0, "ts_ms": 1788000000000}})


def waiver_state(plan: dict) -> str:
    return next(s["state"] for s in plan["slots"] if s["proposition"] == "waiver_valid")


async def test_a_revocation_reusing_a_source_event_id_is_applied(worker):
    fresh = await worker.load("atlas.jsonl")
    before = await worker.select(ATLAS_REQUEST, fresh)
    assert before["admitted"]
    topic, change = resource("approved-waiver-W2")
    _, revocation = revoke_role("maya", "credit_analyst")
    fresh = await worker.publish_events((topic, dict(change, event_id="2002")),
                                        ("revocations", dict(revocation, event_id="2002")))
    after = await worker.select(ATLAS_REQUEST, fresh)
    assert after["admitted"] == [] and after["withheld"] > 0     # the revocation was not taken for a repeat

    # The same id on revocations again: identical content is a duplicate, other content a conflict.
    fresh = await worker.publish_events(("revocations", dict(revocation, event_id="2002")),
                                        ("revocations", dict(revocation, event_id="2002", value="other_role")))
    letters = await worker.records("dead-letters", lambda rs: len(rs) >= 1)
    assert [r["error_class"] for r in letters] == ["event_id_conflict"]
    assert "other_role" not in letters[0]["message"]
    await worker.select(ATLAS_REQUEST, fresh)
    counters = (await worker.get("/healthz"))["counters"]
    assert counters["duplicate_events"] == 1 and counters["dead_letters.event_id_conflict"] == 1


async def test_debezium_binlog_positions_in_different_files_are_different_changes(worker):
    fresh = await worker.load("atlas.jsonl")
    row = resource("approved-waiver-W2")[1]["resource"]
    key = b"approved-waiver-W2"
    fresh = await worker.publish([("source-changes", key, mysql_envelope(row, "mysql-bin.000001", 154))])
    assert waiver_state(await worker.select(ATLAS_REQUEST, fresh)) == "supported"
    expired = dict(row, version=2, valid_to="2026-08-29T12:00:00Z")
    fresh = await worker.publish([("source-changes", key, mysql_envelope(expired, "mysql-bin.000002", 154))])
    assert waiver_state(await worker.select(ATLAS_REQUEST, fresh)) == "unknown"
    health = await worker.get("/healthz")
    assert "duplicate_events" not in health["counters"]


async def test_a_revocation_reusing_another_revocations_id_still_revokes(worker):
    fresh = await worker.load("atlas.jsonl")
    assert (await worker.select(ATLAS_REQUEST, fresh))["admitted"]
    _, omar = revoke_role("omar", "credit_analyst")
    _, maya = revoke_role("maya", "credit_analyst")
    fresh = await worker.publish_events(("revocations", dict(omar, event_id="r-shared")),
                                        ("revocations", dict(maya, event_id="r-shared")))
    after = await worker.select(ATLAS_REQUEST, fresh)
    assert after["admitted"] == [] and after["withheld"] > 0     # the conflict did not drop maya's withdrawal
    letters = await worker.records("dead-letters", lambda rs: len(rs) >= 1)
    assert [r["error_class"] for r in letters] == ["event_id_conflict"]
    assert "applied anyway" in letters[0]["message"]
    counters = (await worker.get("/healthz"))["counters"]
    assert counters["conflicting_revocations_applied"] == 1
