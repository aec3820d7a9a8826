"""Each hand-written Debezium fixture becomes exactly the freshplan event (or skip, or dead letter) it states."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from schemas.cdc_mapping import parse
from schemas.codec import decode, document
from schemas.errors import InvalidEvent, SkippedEvent

FIXTURES = Path(__file__).parent / "fixtures"
MAPPING = parse((FIXTURES / "mapping.json").read_text())
CASES = sorted(p.stem for p in FIXTURES.glob("*.json") if p.stem != "mapping")


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def message(case: dict) -> tuple[bytes | None, bytes | None]:
    """The Kafka key and value, as the JSON converter would serialise them."""
    return (None if case["key"] is None else orjson.dumps(case["key"]),
            None if case["value"] is None else orjson.dumps(case["value"]))


def test_every_kind_of_fixture_is_there():
    assert len(CASES) >= 20
    for needed in ("pg_snapshot", "pg_update", "pg_delete", "pg_tombstone", "pg_create", "pg_heartbeat",
                   "mysql_create", "mysql_update", "mysql_delete", "mysql_tombstone", "mysql_snapshot",
                   "mysql_heartbeat", "transaction", "with_schema", "schemaless", "nanos", "decimal"):
        assert any(needed in c for c in CASES), needed


@pytest.mark.parametrize("name", CASES)
def test_fixture_becomes_its_event(name):
    case = fixture(name)
    key, value = message(case)
    expect = case["expect"]
    if "skipped" in expect:
        with pytest.raises(SkippedEvent) as skipped:
            decode("source-changes", key, value, position="0:0", cdc=MAPPING)
        assert skipped.value.kind == expect["skipped"]
    elif "dead_letter" in expect:
        with pytest.raises(InvalidEvent) as bad:
            decode("source-changes", key, value, position="0:0", cdc=MAPPING)
        assert bad.value.error_class == expect["dead_letter"]["error_class"]
        if "message" in expect["dead_letter"]:
            assert bad.value.message == expect["dead_letter"]["message"]
    else:
        assert document("source-changes", key, value, position="0:0", cdc=MAPPING) == expect
        event = decode("source-changes", key, value, position="0:0", cdc=MAPPING)
        assert event.event_id == expect["event_id"] and event.payload.record_id == expect[expect["kind"]]["id"]


@pytest.mark.parametrize("name", [c for c in CASES if "dead_letter" in fixture(c)["expect"]])
def test_dead_letters_never_repeat_the_value(name):
    case = fixture(name)
    key, value = message(case)
    with pytest.raises(InvalidEvent) as bad:
        decode("source-changes", key, value, position="0:0", cdc=MAPPING)
    for secret in ("{not json", "many", "two", "approved-waiver-W2"):
        assert secret not in bad.value.message
