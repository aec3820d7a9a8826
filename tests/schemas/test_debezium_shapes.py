"""Event time, event ids, versions and message shapes of Debezium records (Postgres captured here; MySQL shapes
as Debezium's documentation gives them: there is no MySQL server on these machines)."""

from __future__ import annotations

import orjson
import pytest

from schemas.cdc_mapping import parse
from schemas.codec import decode
from schemas.debezium import UNKNOWN_EVENT_TIME, from_debezium, position_version
from schemas.errors import InvalidEvent

MAPPING = parse(orjson.dumps({"tables": {
    "crm.documents": {"kind": "resource", "fields": {"id": "doc_id", "entity": "customer_id", "tokens": "n",
                                                     "evidence_class": "cls", "content": "body"}},
    "iam.users": {"kind": "principal",
                  "fields": {"id": "user_id", "roles": "roles", "attributes": "attrs"}}}}).decode())
ROW = {"doc_id": "d1", "customer_id": "E1", "n": 5, "cls": "memo", "body": "text"}


def mysql(**source) -> dict:
    base = {"connector": "mysql", "db": "crm", "table": "documents", "server_id": 1, "file": "mysql-bin.000001",
            "pos": 100, "row": 0, "ts_ms": 1_788_080_400_000}
    return {"before": None, "after": dict(ROW), "op": "u", "ts_ms": 1_788_080_499_000, "source": base | source}


def test_event_time_is_the_source_commit_time_then_the_connector_time_then_unknown():
    doc = dict(mysql(), after={"id": "d1", "version": 1, "entity": "E1", "tokens": 1, "evidence_class": "memo"})
    assert from_debezium(doc)["occurred_at"] == "2026-08-30T09:00:00Z"
    assert from_debezium(doc)["occurred_at_source"] == "source.ts_ms"
    del doc["source"]["ts_ms"]
    assert from_debezium(doc)["occurred_at"] == "2026-08-30T09:01:39Z"
    assert from_debezium(doc)["occurred_at_source"] == "ts_ms"
    del doc["ts_ms"]
    unknown = from_debezium(doc)
    assert (unknown["occurred_at"], unknown["occurred_at_source"]) == (UNKNOWN_EVENT_TIME, "unknown")
    event = decode("source-changes", None, orjson.dumps(mysql()), cdc=MAPPING)
    assert event.payload.record.observed_at == event.occurred_at  # observed_at defaults to the commit time


def test_equal_table_names_in_two_schemas_get_two_event_ids():
    pg = {"connector": "postgresql", "db": "app", "table": "customers", "lsn": 7, "txId": 3, "snapshot": "true"}
    first = from_debezium({"op": "r", "after": {"id": "c1", "version": 1}, "source": dict(pg, schema="inventory")})
    second = from_debezium({"op": "r", "after": {"id": "c1", "version": 1}, "source": dict(pg, schema="archive")})
    assert first["event_id"] != second["event_id"] and "app.archive.customers" in second["event_id"]


def test_mysql_versions_survive_a_binlog_reset_and_share_a_tick_in_log_order():
    before_reset = position_version(mysql(file="mysql-bin.000042", pos=9_000)["source"], "crm.documents")
    after_reset = position_version(mysql(file="mysql-bin.000001", pos=4, ts_ms=1_788_080_401_000)["source"], "t")
    assert after_reset > before_reset
    # One transaction's changes (one GTID, one time), or any of one tick: equal versions, ordered by the log.
    same_tick = [from_debezium(mysql(gtid=f"3E11FA47-71CA-11E1-9E33-C80AA9429562:{n}", pos=p), MAPPING)
                 for n, p in ((5, 900), (5, 1_200), (6, 100))]
    assert len({e["resource"]["version"] for e in same_tick}) == 1 and all(e["log_ordered"] for e in same_tick)
    postgres = {"connector": "postgresql", "db": "crm", "schema": "public", "table": "documents", "lsn": 77}
    assert "log_ordered" not in from_debezium({"op": "u", "after": dict(ROW), "source": postgres},
                                              parse(orjson.dumps({"tables": {"public.documents": {
                                                  "kind": "resource", "fields": {"id": "doc_id"}}}}).decode()))
    with pytest.raises(InvalidEvent, match="map a version column"):
        position_version({"connector": "mysql", "file": "mysql-bin.000001", "pos": 4}, "crm.documents")


def test_after_a_failover_the_new_servers_restarted_position_and_gtid_are_not_judged_older():
    """Debezium's MySQL source block names the server (server_id, and the GTID's source uuid); after a failover
    the new primary's binlog restarts at mysql-bin.000001 and its GTIDs at 1, but its commit times are later."""
    old = mysql(server_id=223344, file="mysql-bin.000042", pos=987_654_321, row=0,
                gtid="3E11FA47-71CA-11E1-9E33-C80AA9429562:4000000")["source"]
    for gtid in ("D6E5F4A3-71CA-11E1-9E33-C80AA9429562:1", None):
        new = mysql(server_id=556677, file="mysql-bin.000001", pos=154, row=0, gtid=gtid,
                    ts_ms=old["ts_ms"] + 1)["source"]
        assert position_version(new, "crm.documents") > position_version(old, "crm.documents"), gtid


@pytest.mark.parametrize("flag, op, snapshot", [
    ("true", "r", True), ("first", "r", True), ("first_in_data_collection", "r", True),
    ("last_in_data_collection", "r", True), ("last", "r", True), (True, "r", True),
    ("true", "c", True),                                       # ReadToInsertEvent made the snapshot row a create
    ("false", "u", False), (False, "c", False), (None, "r", True), (None, "u", False)])
def test_mysql_snapshot_rows_name_the_binlog_position_they_were_read_at(flag, op, snapshot):
    """A snapshot row's file/pos is its snapshot's consistent point, its ts_ms when its table's read began."""
    source = {"server_id": 0, "gtid": None, "file": "mysql-bin.000004", "pos": 157, "snapshot": flag}
    if flag is None:
        del source["snapshot"]  # an unwrapped row whose SMT left source.snapshot out
    event = from_debezium(dict(mysql(**source), op=op), MAPPING)
    assert event["log_ordered"] is True and event["log_position"] == "mysql-bin.000004:157"
    assert event.get("log_snapshot", False) is snapshot
    record = decode("source-changes", None, orjson.dumps(event)).payload.record
    assert (record.log_position, record.log_snapshot) == ("mysql-bin.000004:157", snapshot)
    incremental = from_debezium(dict(mysql(snapshot="incremental"), op="r"), MAPPING)
    assert not {"log_ordered", "log_position", "log_snapshot"} & set(incremental)


def test_incremental_snapshot_rows_get_stable_ids_and_never_pass_streamed_changes():
    source = {"connector": "postgresql", "db": "app", "schema": "crm", "table": "documents", "snapshot": "incremental",
              "ts_ms": 1_788_080_400_000, "lsn": None, "txId": None}
    read = {"op": "r", "after": dict(ROW), "source": source, "ts_ms": 1}
    again = dict(read, ts_ms=2, source=dict(source, ts_ms=1_788_080_500_000))
    first, second = from_debezium(read, MAPPING), from_debezium(again, MAPPING)
    assert first["event_id"] == second["event_id"] and first["resource"]["version"] == 0
    changed = from_debezium(dict(read, after=dict(ROW, body="new")), MAPPING)
    assert changed["event_id"] != first["event_id"]


@pytest.mark.parametrize("value, error_class", [
    ({"op": "t", "ts_ms": 1, "source": {"connector": "postgresql", "schema": "crm", "table": "documents"},
      "before": None, "after": None}, "truncate_not_applied"),
    ({"op": "m", "ts_ms": 1, "source": {"connector": "postgresql", "lsn": 5},
      "message": {"prefix": "p", "content": "aGk="}}, "logical_message"),
    ({"source": {"connector": "mysql", "file": "mysql-bin.000003", "pos": 1}, "databaseName": "crm",
      "ddl": "ALTER TABLE documents ADD COLUMN x int", "tableChanges": []}, "schema_change"),
    ({"doc_id": "d1", "customer_id": "E1", "n": 5, "cls": "memo"}, "unwrapped_without_metadata"),
    ({"doc_id": "d1", "__op": "c", "__deleted": "false"}, "unwrapped_without_metadata"),
    ({"op": "x", "source": {"connector": "postgresql"}, "after": {}}, "unknown_debezium_op"),
])
def test_every_shape_gets_a_reason_that_names_it(value, error_class):
    with pytest.raises(InvalidEvent) as bad:
        decode("source-changes", None, orjson.dumps(value), cdc=MAPPING)
    assert bad.value.error_class == error_class


def test_unwrapped_rows_map_and_a_deleted_row_deletes():
    flat = dict(ROW, __op="u", __table="documents", __db="crm", __file="mysql-bin.000002", __pos=7,
                __source_ts_ms=1_788_080_400_000, __deleted="false")
    event = decode("source-changes", None, orjson.dumps(flat), cdc=MAPPING)
    assert event.payload.op == "upsert" and event.payload.record.content == "text"
    gone = decode("source-changes", None, orjson.dumps(dict(flat, __op="d", __deleted="true")), cdc=MAPPING)
    assert gone.payload.op == "delete" and gone.payload.record_id == "d1"


def test_an_unavailable_attribute_column_keeps_the_stored_attributes_whole():
    mapping = parse(orjson.dumps({"tables": {"crm.documents": {"kind": "resource", "fields": {
        "id": "doc_id", "entity": "customer_id", "tokens": "n", "evidence_class": "cls", "attributes": "acl",
        "attributes.note": "note"}, "types": {"acl": "json"}}}}).decode())
    doc = mysql()
    doc["after"].update(acl='{"allowed_roles": ["a"]}', note="__debezium_unavailable_value")
    out = from_debezium(doc, mapping)
    assert out["unavailable"] == {"attributes": "note"} and "note" not in out["resource"]["attributes"]


def test_unavailable_toast_values_are_not_sent_for_resources_and_principals():
    doc = mysql()
    doc["after"]["body"] = "__debezium_unavailable_value"
    out = from_debezium(doc, MAPPING)
    assert "content" not in out["resource"] and out["unavailable"] == {"content": "body"}
    user = {"op": "u", "ts_ms": 1, "after": {"user_id": "maya", "roles": ["__debezium_unavailable_value"],
                                             "attrs": "__debezium_unavailable_value"},
            "source": {"connector": "postgresql", "schema": "iam", "table": "users", "lsn": 9, "txId": 1}}
    out = from_debezium(user, MAPPING)
    assert out["principal"] == {"id": "maya"} and out["unavailable"] == {"attributes": "attrs", "roles": "roles"}
    change = decode("source-changes", None, orjson.dumps(user), cdc=MAPPING).payload
    assert change.unavailable == (("attributes", "attrs"), ("roles", "roles"))
    assert "__debezium_unavailable_value" not in repr(change.record)
