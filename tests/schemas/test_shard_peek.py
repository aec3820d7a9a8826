"""A glance at a source change: only native records it can judge are named, everything else needs a decode."""

from __future__ import annotations

import orjson

from schemas.shard_peek import Peek, peek
from tests.events import resource


def test_a_native_resource_upsert_names_its_id_and_entity():
    _, body = resource("r1", entity="ATLAS-IN-01")
    assert peek(orjson.dumps(body)) == Peek("resource", "r1", "ATLAS-IN-01", 1)


def test_deletes_and_identities_name_no_entity():
    delete = {"kind": "resource", "op": "delete", "resource": {"id": "r1"}}
    assert peek(orjson.dumps(delete)) == Peek("resource", None, None)
    assert peek(orjson.dumps({"kind": "principal", "op": "upsert", "principal": {"id": "maya"}})).kind == "principal"


def test_cdc_envelopes_tombstones_and_garbage_need_a_full_decode():
    debezium = {"schema": {}, "payload": {"before": None, "after": {"id": "r1"}, "op": "c", "source": {}}}
    for value in (orjson.dumps(debezium), None, b"", b"not json", b"[1]", b'{"kind": "resource", "op": "upsert"}',
                  orjson.dumps({"kind": "resource", "op": "upsert", "resource": {"id": "r1", "entity": 7}})):
        assert peek(value) is None, value
