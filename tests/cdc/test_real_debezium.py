"""A real Postgres through Debezium's Embedded Engine into a worker on the embedded broker: what users run."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest

from agents.cli import cdc_local
from streams.incarnation import read_cluster_id
from tests.conftest import ATLAS_REQUEST, launch, sign_token

pytestmark = pytest.mark.skipif(cdc_local.missing() is not None, reason=str(cdc_local.missing()))

ACL = '{"allowed_roles": ["credit_analyst"], "allowed_purposes": ["annual_credit_review"]}'
# Every column type the issue names: timestamptz, timestamp, date, numeric, jsonb, text[], uuid, boolean.
TABLE = """CREATE TABLE {s}.documents (
  doc_id text PRIMARY KEY, rev int NOT NULL, customer_id text NOT NULL, title text, body text,
  token_count numeric(12, 0) NOT NULL, doc_class text NOT NULL, claims text[], refutes text[],
  valid_from timestamp, valid_to timestamptz, reviewed date, source_system text, sensitivity text,
  acl jsonb, external_ref uuid, archived boolean NOT NULL DEFAULT false)"""
COLUMNS = {"id": "doc_id", "version": "rev", "entity": "customer_id", "title": "title", "content": "body",
           "tokens": "token_count", "evidence_class": "doc_class", "supports": "claims", "contradicts": "refutes",
           "valid_from": "valid_from", "valid_to": "valid_to", "observed_at": "reviewed",
           "provenance_group": "source_system", "sensitivity": "sensitivity", "attributes": "acl",
           "attributes.external_ref": "external_ref", "attributes.archived": "archived"}
SCHEMALESS_TYPES = {"valid_from": "timestamp_micros", "valid_to": "iso", "reviewed": "date_days", "acl": "json",
                    "token_count": "decimal:0", "external_ref": "uuid", "archived": "boolean"}


def insert(schema: str, doc_id: str, *, tokens: int = 100, body: str = "'Waiver W2 approved by the committee.'") -> str:
    return (f"INSERT INTO {schema}.documents (doc_id, rev, customer_id, title, body, token_count, doc_class, claims, "
            f"refutes, valid_from, valid_to, reviewed, source_system, sensitivity, acl, external_ref, archived) VALUES "
            f"('{doc_id}', 1, 'ATLAS-IN-01', 'Waiver', {body}, {tokens}, 'approved_waiver', "
            f"'{{waiver_valid}}', '{{}}', '2026-08-29 00:00', '2026-09-30 23:59:59+00', '2026-08-29', "
            f"'credit-committee', 'internal', '{ACL}', '{uuid.uuid4()}', false)")


def long_text() -> str:
    """A body Postgres stores out of line (TOAST): large and incompressible."""
    return "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 200))"


@pytest.fixture(scope="module")
def pg():
    """One Postgres server for the module; each test captures tables of its own schemas."""
    server = cdc_local.LocalPostgres().start()
    yield server
    server.stop()


def waiver(plan: dict) -> str:
    return next(s["state"] for s in plan["slots"] if s["proposition"] == "waiver_valid")


async def token(engine: cdc_local.Debezium, worker) -> str:
    """The freshness token covering everything Debezium has had acknowledged so far."""
    name = worker.settings.topic("source-changes")
    ends = {p: o for (t, p), o in engine.ends.items() if t == name}
    return sign_token({"source-changes": ends}, await read_cluster_id(worker.bootstrap))


async def sent(engine: cdc_local.Debezium, check, what: str) -> None:
    await asyncio.get_running_loop().run_in_executor(None, lambda: engine.wait_for(check, 60, what))


def rows_of(engine: cdc_local.Debezium, table: str) -> list[dict]:
    """Row-change payloads Debezium sent for one table (unwrapped from the JSON converter's schema block)."""
    out = []
    for _, _, value in engine.sent:
        doc = orjson.loads(value) if value else None
        body = doc.get("payload", doc) if isinstance(doc, dict) and set(doc) == {"schema", "payload"} else doc
        source = body.get("source") or {} if isinstance(body, dict) else {}
        if isinstance(body, dict) and f"{source.get('schema')}.{source.get('table')}" == table:
            out.append(body)
    return out


async def start(pg, worker, name: str, tables: str, offsets, **options) -> cdc_local.Debezium:
    props = cdc_local.connector_properties(pg, name, tables, offsets, worker.settings.topic("source-changes"),
                                           **options)
    return await asyncio.get_running_loop().run_in_executor(
        None, lambda: cdc_local.Debezium(props, worker.bootstrap).start())


async def stop(engine: cdc_local.Debezium) -> None:
    await asyncio.get_running_loop().run_in_executor(None, engine.stop)


@pytest.mark.timeout(240)
async def test_postgres_changes_through_debezium_keep_plans_fresh(pg, broker, tmp_path):
    tag = uuid.uuid4().hex[:6]
    a, b = f"kb_{tag}", f"archive_{tag}"
    pg.execute(f"CREATE SCHEMA {a}; CREATE SCHEMA {b}; " + TABLE.format(s=a) + "; " + TABLE.format(s=b)
               + f"; ALTER TABLE {b}.documents REPLICA IDENTITY FULL; CREATE TABLE {a}.scratch (id int PRIMARY KEY)")
    # One row id in two schemas: neither snapshot row may be taken for the other (equal table names, one
    # snapshot position).
    pg.execute(insert(a, "approved-waiver-W2", body=long_text()))
    # (They are one resource here, so the archived copy is older: rev 0.)
    pg.execute(insert(b, "approved-waiver-W2").replace("'approved-waiver-W2', 1,", "'approved-waiver-W2', 0,"))
    pg.execute(insert(b, "boreal-note-1").replace("'ATLAS-IN-01'", "'BOREAL-02'"))
    mapping = tmp_path / "mapping.json"
    mapping.write_text(orjson.dumps({"tables": {
        f"{a}.documents": {"kind": "resource", "fields": COLUMNS},
        f"{b}.documents": {"kind": "resource", "fields": COLUMNS},
        f"{a}.scratch": {"kind": "entity", "fields": {"id": "id"}}}}).decode())
    async with launch(broker, tmp_path / "w", FRESHPLAN_CDC_MAPPING=str(mapping)) as worker:
        fresh = await worker.load("atlas.jsonl")
        assert waiver(await worker.select(ATLAS_REQUEST, fresh)) == "unknown"
        name = f"dbz{tag}"
        offsets = tmp_path / "offsets.dat"
        engine = await start(pg, worker, name, f"{a}.documents,{b}.documents,{a}.scratch", offsets)
        try:
            await sent(engine, lambda s: len([r for r in s if r[2] and b'"op":"r"' in r[2]]) >= 2, "snapshot rows")
            first = await worker.select(ATLAS_REQUEST, await token(engine, worker))
            assert waiver(first) == "supported"
            [admitted] = [i for i in first["admitted"] if i["resource_id"] == "approved-waiver-W2"]
            body = pg.execute(f"SELECT body FROM {a}.documents")[0][0]
            assert admitted["content"] == body and admitted["tokens"] == 100 and len(body) > 6000

            # The body is unchanged and TOASTed: Debezium sends its placeholder, the stored body stays.
            pg.execute(f"UPDATE {a}.documents SET rev = 2, title = 'Waiver (renewed)'")
            await sent(engine, lambda s: len(rows_of(engine, f"{a}.documents")) >= 2, "the update")
            update = rows_of(engine, f"{a}.documents")[-1]
            assert update["after"]["body"] == "__debezium_unavailable_value" and update["before"] is None
            plan = await worker.select(ATLAS_REQUEST, await token(engine, worker))
            assert plan["plan_id"] != first["plan_id"]
            [admitted] = [i for i in plan["admitted"] if i["resource_id"] == "approved-waiver-W2"]
            assert admitted["content"] == body and admitted["version"] == 2

            # REPLICA IDENTITY FULL sends every column, and the old row as `before`.
            pg.execute(f"UPDATE {b}.documents SET rev = 2, body = {long_text()} WHERE doc_id = 'boreal-note-1'")
            pg.execute(f"UPDATE {b}.documents SET rev = 3 WHERE doc_id = 'boreal-note-1'")
            await sent(engine, lambda s: len(rows_of(engine, f"{b}.documents")) >= 4, "the FULL updates")
            full = rows_of(engine, f"{b}.documents")[-1]
            assert full["before"]["rev"] == 2 and full["after"]["body"] != "__debezium_unavailable_value"

            # An expiry update makes the waiver stale; the connector is then stopped and restarted.
            pg.execute(f"UPDATE {a}.documents SET rev = 3, valid_to = '2026-08-29 12:00+00'")
            await sent(engine, lambda s: len(rows_of(engine, f"{a}.documents")) >= 3, "the expiry")
            assert waiver(await worker.select(ATLAS_REQUEST, await token(engine, worker))) == "unknown"
            counters = (await worker.get("/healthz"))["counters"]
            applied = counters["applied.source-changes"]
        finally:
            await stop(engine)

        # While the connector is down the table changes; on restart it resumes from its offsets.
        pg.execute(f"UPDATE {a}.documents SET rev = 4, valid_to = '2026-09-30 23:59:59+00'")
        pg.execute(f"DELETE FROM {b}.documents WHERE doc_id = 'boreal-note-1'")
        pg.execute(f"TRUNCATE {a}.scratch")
        pg.execute("SELECT pg_logical_emit_message(true, 'freshplan', 'hello')")
        engine = await start(pg, worker, name, f"{a}.documents,{b}.documents,{a}.scratch", offsets)
        try:
            await sent(engine, lambda s: any(v is None for _, _, v in s) and any(b'"op":"m"' in (v or b"") for _, _, v
                                                                                 in s), "the changes made while down")
            assert not any(b'"op":"r"' in (v or b"") for _, _, v in engine.sent), "the restart snapshotted again"
            plan = await worker.select(ATLAS_REQUEST, await token(engine, worker))
            counters = (await worker.get("/healthz"))["counters"]
            assert waiver(plan) == "supported"
        finally:
            await stop(engine)
    # The update and the delete (its envelope; the tombstone finds it deleted), each applied once.
    assert counters["applied.source-changes"] - applied == 2
    assert counters.get("cdc_skipped.heartbeat", 0) >= 1 and counters.get("cdc_skipped.transaction", 0) >= 4
    dead = {k: v for k, v in counters.items() if k.startswith("dead_letters.")}
    assert dead == {"dead_letters.truncate_not_applied": 1, "dead_letters.logical_message": 1}, dead


@pytest.mark.timeout(240)
async def test_unwrapped_schemaless_rows_apply_and_deleted_rows_delete(pg, broker, tmp_path):
    tag = uuid.uuid4().hex[:6]
    a = f"flat_{tag}"
    pg.execute(f"CREATE SCHEMA {a}; " + TABLE.format(s=a))
    mapping = tmp_path / "mapping.json"
    mapping.write_text(orjson.dumps({"tables": {f"{a}.documents": {
        "kind": "resource", "fields": COLUMNS, "types": SCHEMALESS_TYPES}}}).decode())
    async with launch(broker, tmp_path / "w", FRESHPLAN_CDC_MAPPING=str(mapping)) as worker:
        fresh = await worker.load("atlas.jsonl")
        assert waiver(await worker.select(ATLAS_REQUEST, fresh)) == "unknown"
        engine = await start(pg, worker, f"flat{tag}", f"{a}.documents", tmp_path / "offsets.dat",
                             schemas=False, unwrap=True)
        try:
            await sent(engine, lambda s: any(b'"ts_ms"' in (v or b"") for _, _, v in s), "a heartbeat")
            pg.execute(insert(a, "approved-waiver-W2"))
            await sent(engine, lambda s: any(b'"__op":"c"' in (v or b"") for _, _, v in s), "the insert")
            row = next(orjson.loads(v) for _, _, v in engine.sent if v and b'"__op":"c"' in v)
            assert "schema" not in row and row["__table"] == "documents" and row["__deleted"] == "false"
            plan = await worker.select(ATLAS_REQUEST, await token(engine, worker))
            assert waiver(plan) == "supported"
            [item] = [i for i in plan["admitted"] if i["resource_id"] == "approved-waiver-W2"]
            assert item["tokens"] == 100 and item["version"] == 1

            pg.execute(f"DELETE FROM {a}.documents")
            await sent(engine, lambda s: any(b'"__deleted":"true"' in (v or b"") for _, _, v in s), "the delete")
            assert waiver(await worker.select(ATLAS_REQUEST, await token(engine, worker))) == "unknown"
            counters = (await worker.get("/healthz"))["counters"]
        finally:
            await stop(engine)
    assert not {k for k in counters if k.startswith("dead_letters.")}, counters
    assert counters["applied.source-changes"] >= 2
