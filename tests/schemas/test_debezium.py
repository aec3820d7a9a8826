"""Debezium event ids carry the connector's whole source position."""

from __future__ import annotations

from schemas.debezium import from_debezium, source_position


def envelope(source: dict, op: str = "c") -> dict:
    return {"before": None, "after": {"id": "r1", "version": 1}, "op": op, "ts_ms": 1, "source": source}


def test_mysql_position_includes_the_binlog_file_and_row():
    first = from_debezium(envelope({"connector": "mysql", "file": "mysql-bin.000001", "pos": 154, "row": 0}))
    second = from_debezium(envelope({"connector": "mysql", "file": "mysql-bin.000002", "pos": 154, "row": 0}))
    other_row = from_debezium(envelope({"connector": "mysql", "file": "mysql-bin.000002", "pos": 154, "row": 1}))
    assert len({first["event_id"], second["event_id"], other_row["event_id"]}) == 3
    assert "mysql-bin.000002:154:1" in other_row["event_id"]


def test_postgres_position_is_lsn_and_transaction():
    assert source_position({"connector": "postgresql", "lsn": 42, "txId": 7, "ts_ms": 3}) == "42:7"
    assert source_position({"lsn": 42}) == "42"


def test_sqlserver_and_unknown_connectors_use_their_own_unique_fields():
    assert source_position({"connector": "sqlserver", "change_lsn": "a", "commit_lsn": "b",
                            "event_serial_no": 2}) == "a:b:2"
    mongo = {"connector": "mongodb", "version": "2.4", "ord": 3, "ts_ms": 9, "db": "x", "collection": "c"}
    assert source_position(mongo) == "collection=c:connector=mongodb:db=x:ord=3:ts_ms=9"
    assert source_position(dict(mongo, version="2.5")) == source_position(mongo)
    assert source_position(dict(mongo, ord=4)) != source_position(mongo)


def test_a_replayed_envelope_keeps_its_id():
    source = {"connector": "mysql", "file": "mysql-bin.000001", "pos": 154, "row": 0}
    assert from_debezium(envelope(source))["event_id"] == from_debezium(dict(envelope(source), ts_ms=99))["event_id"]
