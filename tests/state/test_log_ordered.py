"""MySQL changes without a version column share a commit-time tick: the log orders them, and plan ids still move on."""

from __future__ import annotations

import itertools

import orjson

from schemas.cdc_mapping import parse
from schemas.codec import decode
from state.local_state import LocalState

MAPPING = parse(orjson.dumps({"tables": {"crm.documents": {"kind": "resource", "fields": {
    "id": "doc_id", "entity": "customer_id", "tokens": "n", "evidence_class": "cls", "content": "body"}}}}).decode())
TICK = 1_788_080_400_000  # a MySQL 5.7 event's ts_ms: whole seconds
_pos = itertools.count(100, 100)


def change(body: str, ts_ms: int = TICK, gtid: str = "3E11FA47-71CA-11E1-9E33-C80AA9429562:5") -> bytes:
    return orjson.dumps({"before": None, "op": "u", "ts_ms": ts_ms + 5,
                         "after": {"doc_id": "d1", "customer_id": "E1", "n": 5, "cls": "memo", "body": body},
                         "source": {"connector": "mysql", "db": "crm", "table": "documents", "server_id": 1,
                                    "file": "mysql-bin.000001", "pos": next(_pos), "row": 0, "ts_ms": ts_ms,
                                    "gtid": gtid}})


def stored(state: LocalState) -> tuple[int, str]:
    return state.store.db.execute("SELECT version, content FROM resources WHERE id = 'd1'").fetchone()


def apply(state: LocalState, value: bytes):
    event = decode("source-changes", b"d1", value, position="0:0", cdc=MAPPING)
    with state.store.transaction():
        return state.catalog.apply_source_change(event.payload, event.occurred_at)


def test_changes_of_one_tick_apply_in_log_order_each_one_version_above(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        assert apply(state, change("first")) is not None
        first, _ = stored(state)
        assert apply(state, change("second")) is not None          # one transaction: same GTID, same time
        assert stored(state) == (first + 1, "second")
        assert apply(state, change("third", gtid="3E11FA47-71CA-11E1-9E33-C80AA9429562:6")) is not None
        assert stored(state) == (first + 2, "third")
        assert apply(state, change("older", ts_ms=TICK - 1000)) is None  # an earlier second is older
        assert apply(state, change("later", ts_ms=TICK + 1000)) is not None
        later, content = stored(state)
        assert later > first + 2 and content == "later"
    finally:
        state.close()


def test_an_equal_version_that_is_not_log_ordered_changes_nothing(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        event = {"event_id": "e1", "schema_version": 1, "occurred_at": "2026-08-30T09:00:00Z", "kind": "resource",
                 "op": "upsert", "resource": {"id": "d1", "version": 7, "entity": "E1", "tokens": 5,
                                              "evidence_class": "memo", "content": "first"}}
        assert apply_plain(state, event) is not None
        assert apply_plain(state, dict(event, event_id="e2", resource=dict(event["resource"], content="x"))) is None
        assert stored(state) == (7, "first")
    finally:
        state.close()


def apply_plain(state: LocalState, event: dict):
    decoded = decode("source-changes", b"d1", orjson.dumps(event))
    with state.store.transaction():
        return state.catalog.apply_source_change(decoded.payload, decoded.occurred_at)
