"""The hand-written Debezium fixtures, published by librdkafka (as Kafka Connect would), invalidate plans."""

from __future__ import annotations

import asyncio
import base64
import uuid

import orjson
import pytest
from confluent_kafka import Producer

from schemas.debezium import UNAVAILABLE
from streams.incarnation import read_cluster_id
from tests.cdc.test_fixtures import FIXTURES, fixture, message
from tests.conftest import ATLAS_REQUEST, freshest, launch, sign_token
from tests.events import policy_version, resource, revoke_role


def waiver_slot(plan: dict) -> str:
    return next(s["state"] for s in plan["slots"] if s["proposition"] == "waiver_valid")


async def produce(worker, *names: str) -> str:
    """Publish fixtures in order on one partition (Debezium keeps a row's changes in order); return the token."""
    return await produce_messages(worker, [message(fixture(name)) for name in names])


async def produce_messages(worker, messages: list[tuple[bytes | None, bytes | None]]) -> str:
    """Publish (key, value) pairs in order on partition 0 of source-changes; return the freshness token."""
    producer = Producer({"bootstrap.servers": worker.bootstrap, "acks": "all"})
    delivered: list[int] = []
    for key, value in messages:
        producer.produce(worker.settings.topic("source-changes"), key=key, value=value, partition=0,
                         on_delivery=lambda err, msg: delivered.append(-1 if err else msg.offset()))
    assert await asyncio.get_running_loop().run_in_executor(None, producer.flush, 30) == 0
    assert len(delivered) == len(messages) and min(delivered) >= 0
    return sign_token({"source-changes": {0: max(delivered) + 1}}, await read_cluster_id(worker.bootstrap))


@pytest.mark.timeout(180)
async def test_debezium_fixtures_invalidate_the_plans_they_touch(broker, tmp_path):
    async with launch(broker, tmp_path, FRESHPLAN_CDC_MAPPING=str(FIXTURES / "mapping.json")) as worker:
        fresh = await worker.load("atlas.jsonl")
        first = await worker.select(ATLAS_REQUEST, fresh)
        assert waiver_slot(first) == "unknown"

        steps = [(("pg_snapshot_read_with_schema",), "supported"),
                 (("pg_update_with_schema",), "unknown"),            # valid_to now in the past
                 (("pg_update_schemaless",), "supported"),
                 (("pg_delete_schemaless", "pg_tombstone_key_schema", "pg_heartbeat_with_schema",
                   "pg_transaction_begin_with_schema", "pg_create_with_schema_nanos",
                   "pg_principal_update_schemaless", "pg_tombstone_schemaless_ambiguous_key", "pg_bad_json",
                   "pg_bad_tokens", "pg_unmapped_table"), "unknown"),
                 (("mysql_create_with_schema",), "supported"),
                 (("mysql_update_schemaless", "mysql_snapshot_read_schemaless", "mysql_delete_with_schema",
                   "mysql_heartbeat_schemaless", "mysql_transaction_end_schemaless", "mysql_bad_decimal_scale",
                   "mysql_tombstone_schemaless_key"), "unknown")]
        plan_id = first["plan_id"]
        for names, expected in steps:
            fresh = await produce(worker, *names)
            plan = await worker.select(ATLAS_REQUEST, fresh)
            assert waiver_slot(plan) == expected, names
            assert plan["plan_id"] != plan_id, f"{names} did not invalidate the plan"
            plan_id = plan["plan_id"]

        counters = (await worker.get("/healthz"))["counters"]
        assert counters.get("cdc_skipped.heartbeat") == 2 and counters.get("cdc_skipped.transaction") == 2
        dead = {k: v for k, v in counters.items() if k.startswith("dead_letters.")}
        # The MySQL table's rows default to credit-committee, whose rules in the Atlas bundle allow waivers and
        # committee records only: its analyst memo is refused at ingest.
        assert dead == {"dead_letters.ambiguous_key": 1, "dead_letters.invalid_value": 2,
                        "dead_letters.schema_violation": 1, "dead_letters.unmapped_table": 1,
                        "dead_letters.class_not_allowed_for_source": 1}
        letters = await worker.records("dead-letters", lambda seen: len(seen) >= 6)
        assert "table kb.documents: column acl: is not valid JSON" in {d["message"] for d in letters}

        # Ordinary freshplan events on source-changes still apply while a mapping file is set.
        fresh = await worker.publish_events(resource("approved-waiver-W2", version=9))
        assert waiver_slot(await worker.select(ATLAS_REQUEST, fresh)) == "supported"


@pytest.mark.timeout(60)
async def test_run_refuses_a_mapping_file_naming_an_unknown_field(broker, tmp_path):
    bad = tmp_path / "mapping.json"
    bad.write_text(orjson.dumps({"tables": {"kb.documents": {"kind": "resource",
                                                             "fields": {"id": "doc_id", "colour": "c"}}}}).decode())
    async with launch(broker, tmp_path / "w", wait=False, FRESHPLAN_CDC_MAPPING=str(bad)) as worker:
        code = await asyncio.get_running_loop().run_in_executor(None, worker.proc.wait, 30)
    assert code == 2
    log = worker.log_path.read_text()
    assert "colour" in log and str(bad) in log and "unknown resource fields" in log


def _row(table: str, lsn: int, key: dict, after: dict) -> tuple[bytes, bytes]:
    """A Postgres update (schemas off, REPLICA IDENTITY DEFAULT: no `before`), committed 2026-08-30 09:10."""
    schema, name = table.split(".")
    source = {"connector": "postgresql", "name": "dbserver1", "db": "appdb", "schema": schema, "table": name,
              "txId": lsn // 10, "lsn": lsn, "snapshot": "false", "ts_ms": 1_788_080_400_000 + 10 * 60_000}
    return orjson.dumps(key), orjson.dumps({"before": None, "after": after, "op": "u", "source": source,
                                            "ts_ms": 1_788_080_400_000 + 10 * 60_001})


@pytest.mark.timeout(180)
async def test_unchanged_toasted_principal_and_entity_columns_keep_the_stored_values(broker, tmp_path):
    """maya's roles left out by Debezium are her stored roles: made after the revocation, they re-grant."""
    mapping = orjson.loads((FIXTURES / "mapping.json").read_bytes())
    mapping["tables"]["crm.companies"] = {"kind": "entity", "fields": {"id": "company_id", "aliases": "names"}}
    (tmp_path / "mapping.json").write_bytes(orjson.dumps(mapping))
    async with launch(broker, tmp_path / "w", FRESHPLAN_CDC_MAPPING=str(tmp_path / "mapping.json")) as worker:
        # The catalogue's token too: one for the CDC topic alone let the select beat the policy version.
        loaded = await worker.load("atlas.jsonl")
        fresh = freshest(loaded, await produce(worker, "pg_snapshot_read_with_schema"))
        assert waiver_slot(await worker.select(ATLAS_REQUEST, fresh)) == "supported"
        fresh = await worker.publish_events(revoke_role("maya", "credit_analyst"))  # effective 09:00
        assert waiver_slot(await worker.select(ATLAS_REQUEST, fresh)) != "supported"

        fresh = await produce_messages(worker, [
            _row("iam.users", 24030000, {"user_id": "maya"}, {"user_id": "maya", "roles": [UNAVAILABLE],
                 "attrs": '{"unit": "corporate-credit"}', "delegation_version": 4}),
            _row("crm.companies", 24030010, {"company_id": "ATLAS-IN-01"},
                 {"company_id": "ATLAS-IN-01", "names": [UNAVAILABLE]}),
            _row("iam.users", 24030020, {"user_id": "ghost"}, {"user_id": "ghost", "roles": [UNAVAILABLE],
                 "attrs": "{}", "delegation_version": 1}),
            _row("crm.companies", 24030030, {"company_id": "NOBODY"},
                 {"company_id": "NOBODY", "names": [UNAVAILABLE]})])
        # Her stored role, in a record made at 09:10, re-grants; "Atlas" is still the entity's alias.
        assert waiver_slot(await worker.select(ATLAS_REQUEST, fresh)) == "supported"

        letters = await worker.records("dead-letters", lambda seen: len(seen) >= 2)
        assert sorted(d["error_class"] for d in letters) == ["unavailable_value"] * 2
        assert {d["message"].split(":")[0] for d in letters} == {"column roles", "column names"}
        assert all("REPLICA IDENTITY FULL" in d["message"] for d in letters)
        counters = (await worker.get("/healthz"))["counters"]
        assert {k: v for k, v in counters.items() if k.startswith("dead_letters.")} == {
            "dead_letters.unavailable_value": 2}


@pytest.mark.timeout(120)
async def test_a_second_mysql_change_of_one_tick_is_applied_not_ignored(broker, tmp_path):
    """One transaction updates the waiver twice: both changes carry its commit time; the later one must win."""
    async with launch(broker, tmp_path, FRESHPLAN_CDC_MAPPING=str(FIXTURES / "mapping.json")) as worker:
        await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
        created = fixture("mysql_create_with_schema")
        first = await worker.select(ATLAS_REQUEST, await produce_messages(worker, [message(created)]))
        assert waiver_slot(first) == "supported"
        value = created["value"]
        payload = dict(value["payload"], op="u", before=value["payload"]["after"],
                       after=dict(value["payload"]["after"], valid_to=20694),            # expired the day before
                       source=dict(value["payload"]["source"], pos=value["payload"]["source"]["pos"] + 400))
        again = dict(created, value=dict(value, payload=payload))
        plan = await worker.select(ATLAS_REQUEST, await produce_messages(worker, [message(again)]))
        assert waiver_slot(plan) == "unknown" and plan["plan_id"] != first["plan_id"]


@pytest.mark.timeout(120)
async def test_a_mysql_change_committed_during_the_snapshot_replaces_the_snapshot_row(broker, tmp_path):
    """The waiver was expired after the snapshot's consistent point but 40 s before its table was read: newer."""
    async with launch(broker, tmp_path, FRESHPLAN_CDC_MAPPING=str(FIXTURES / "mapping.json")) as worker:
        await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
        created = fixture("mysql_create_with_schema")
        value = created["value"]
        streamed = value["payload"]["source"]
        read = dict(value["payload"], op="r", source=dict(streamed, snapshot="true", server_id=0, thread=None,
                                                          pos=streamed["pos"] - 400))  # the consistent point
        snapshot = dict(created, value=dict(value, payload=read))
        first = await worker.select(ATLAS_REQUEST, await produce_messages(worker, [message(snapshot)]))
        assert waiver_slot(first) == "supported"
        expired = dict(value["payload"], op="u", before=read["after"],
                       after=dict(read["after"], valid_to=20694),                         # expired the day before
                       source=dict(streamed, ts_ms=streamed["ts_ms"] - 40_000))           # committed before the read
        change = dict(created, value=dict(value, payload=expired))
        plan = await worker.select(ATLAS_REQUEST, await produce_messages(worker, [message(change)]))
        assert waiver_slot(plan) == "unknown" and plan["plan_id"] != first["plan_id"]


@pytest.mark.timeout(180)
async def test_mysql_boolean_and_binary_uuid_columns_become_cedar_attributes(broker, tmp_path):
    """TINYINT(1) arrives as 0/1 and BINARY(16) as base64: mapped as attributes, a Cedar policy reads both."""
    mapping = orjson.loads((FIXTURES / "mapping.json").read_bytes())
    table = mapping["tables"]["crm.documents"]
    table["fields"].update({"attributes.archived": "archived", "attributes.case_ref": "case_ref"})
    table["types"].update({"archived": "boolean", "case_ref": "uuid"})
    (tmp_path / "mapping.json").write_bytes(orjson.dumps(mapping))
    blocked = "6f1c2a4e-9b3d-4c5e-8a7f-0123456789ab"
    topic, bundle = policy_version(2, "2026-01-01T00:00:00Z")
    bundle["cedar"] += ("forbid(principal, action == Action::\"use\", resource)\n"
                        f"when {{ (resource has archived && resource.archived) || "
                        f"(resource has case_ref && resource.case_ref == \"{blocked}\") }};\n")
    update = fixture("mysql_update_schemaless")

    def row(n: int, archived: int, case_ref: bytes) -> tuple[bytes | None, bytes | None]:
        value = update["value"]
        after = dict(value["after"], archived=archived, case_ref=base64.b64encode(case_ref).decode())
        source = dict(value["source"], ts_ms=value["source"]["ts_ms"] + n * 1000, pos=value["source"]["pos"] + n)
        return message(dict(update, value=dict(value, after=after, source=source)))

    allowed = uuid.uuid4().bytes
    async with launch(broker, tmp_path / "w", FRESHPLAN_CDC_MAPPING=str(tmp_path / "mapping.json")) as worker:
        loaded = freshest(await worker.load("atlas.jsonl"), await worker.publish_events((topic, bundle)))
        states = []
        for n, archived, case_ref in ((1, 0, allowed), (2, 1, allowed), (3, 0, allowed),
                                      (4, 0, uuid.UUID(blocked).bytes)):
            fresh = freshest(loaded, await produce_messages(worker, [row(n, archived, case_ref)]))
            plan = await worker.select(ATLAS_REQUEST, fresh)
            states.append(waiver_slot(plan))
        assert states == ["supported", "unknown", "supported", "unknown"]
        counters = (await worker.get("/healthz"))["counters"]
        assert not {k for k in counters if k.startswith("dead_letters.")}, counters
