"""Bring DuckDB files written by earlier versions up to the store's current schema."""

from __future__ import annotations

import duckdb
import orjson

from state import event_generations


def migrate(db: duckdb.DuckDBPyConnection) -> None:
    """Bring files written by earlier versions up to the current schema, all of it or none (one transaction)."""
    db.execute("BEGIN TRANSACTION")
    try:
        _migrate(db)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _migrate(db: duckdb.DuckDBPyConnection) -> None:
    columns = {r[0] for r in db.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'outbox'").fetchall()}
    if "standby" not in columns:
        # Outboxes before scale-out hold only records due for publication.
        db.execute("ALTER TABLE outbox ADD COLUMN src_topic VARCHAR; "
                   "ALTER TABLE outbox ADD COLUMN src_partition INTEGER; "
                   "ALTER TABLE outbox ADD COLUMN src_offset BIGINT; "
                   "ALTER TABLE outbox ADD COLUMN standby BOOLEAN; ALTER TABLE outbox ADD COLUMN lane INTEGER; "
                   "ALTER TABLE outbox ADD COLUMN to_partition INTEGER; UPDATE outbox SET standby = false")
    else:
        if "lane" not in columns:
            db.execute("ALTER TABLE outbox ADD COLUMN lane INTEGER")  # letters kept for an entity lane's owner
        if "to_partition" not in columns:
            # Records placed on a partition of their own choosing (`plan-dependencies`: the entity's).
            db.execute("ALTER TABLE outbox ADD COLUMN to_partition INTEGER")
    _event_ids(db)
    _queue_order(db)
    event_generations.ensure(db)
    _policy_versions(db)
    _offset_marks(db)
    _principal_times(db)


def _event_ids(db: duckdb.DuckDBPyConnection) -> None:
    """Give the event-id ledger its one-column key (see `event_ids.event_key`).

    Ids were once global: they are kept as ids of every topic (topic '') with no known content.
    Later files keyed them by (topic, event id), which DuckDB can only look up by scanning.
    """
    columns = {r[0] for r in db.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'applied_events'").fetchall()}
    if "event_key" in columns:
        return
    topic, digest = ("topic", "content_hash") if "topic" in columns else ("''", "NULL")
    db.execute("ALTER TABLE applied_events RENAME TO applied_events_before; "
               "CREATE TABLE applied_events (event_key VARCHAR PRIMARY KEY, topic VARCHAR, event_id VARCHAR, "
               "content_hash VARCHAR); "
               f"INSERT INTO applied_events SELECT {topic} || chr(31) || event_id, {topic}, event_id, {digest} "
               "FROM applied_events_before; "
               "DROP TABLE applied_events_before")


def _queue_order(db: duckdb.DuckDBPyConnection) -> None:
    """Give the recompile queue its arrival order (`seq`); entries queued before keep the order they were read in."""
    columns = {r[0] for r in db.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'recompile_queue'").fetchall()}
    if "seq" in columns:
        return
    db.execute("ALTER TABLE recompile_queue RENAME TO recompile_queue_before; "
               "CREATE TABLE recompile_queue (plan_key VARCHAR PRIMARY KEY, src_topic VARCHAR, src_partition INTEGER, "
               "src_offset BIGINT, seq BIGINT DEFAULT nextval('recompile_queue_seq')); "
               "INSERT INTO recompile_queue (plan_key, src_topic, src_partition, src_offset) "
               "SELECT plan_key, src_topic, src_partition, src_offset FROM recompile_queue_before "
               "ORDER BY src_offset, plan_key; "
               "DROP TABLE recompile_queue_before")


def _policy_versions(db: duckdb.DuckDBPyConnection) -> None:
    """Files that kept only each bundle's latest version: that version becomes its first kept one.

    Versions kept before bundles could opt out of source trust get `source_trust` NULL (on).

    Revocations recorded before they carried a delegation version apply as of the
    principal's version at migration (fail closed: at least as long as before).
    """
    columns = {r[0] for r in db.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'revoked'").fetchall()}
    if "delegation_version" not in columns:
        db.execute("ALTER TABLE revoked ADD COLUMN delegation_version BIGINT; "
                   "UPDATE revoked SET delegation_version = p.delegation_version FROM principals p "
                   "WHERE p.id = revoked.principal")
    kept = {r[0] for r in db.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'policy_versions'").fetchall()}
    if "source_trust" not in kept:
        # NULL: kept before bundles could opt out, so the default (trust on) governs them.
        db.execute("ALTER TABLE policy_versions ADD COLUMN source_trust BOOLEAN")
    missing = db.execute(
        "SELECT bundle_id, version, effective_at, cedar FROM policy_bundles b WHERE NOT EXISTS ("
        "SELECT 1 FROM policy_versions v WHERE v.bundle_id = b.bundle_id AND v.version = b.version)").fetchall()
    for bundle_id, version, effective_at, cedar in missing:
        rules = dict(db.execute("SELECT provenance_group, classes FROM source_rules WHERE bundle_id = ?",
                                [bundle_id]).fetchall())
        db.execute("INSERT INTO policy_versions VALUES (?, ?, ?, ?, ?, NULL)",
                   [bundle_id, version, effective_at, cedar, orjson.dumps(rules).decode()])
        db.execute("INSERT INTO contract_versions SELECT bundle_id, ?, decision_type, body FROM contracts "
                   "WHERE bundle_id = ?", [version, bundle_id])


def _offset_marks(db: duckdb.DuckDBPyConnection) -> None:
    """Marks once had a table of their own: they move beside their offsets, written in the same statement."""
    columns = {r[0] for r in db.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'offsets'").fetchall()}
    if "mark" in columns:
        return
    db.execute("ALTER TABLE offsets ADD COLUMN record_offset BIGINT; ALTER TABLE offsets ADD COLUMN mark VARCHAR")
    if db.execute("SELECT 1 FROM duckdb_tables() WHERE table_name = 'offset_marks'").fetchone():
        db.execute("UPDATE offsets SET record_offset = m.record_offset, mark = m.mark FROM offset_marks m "
                   "WHERE offsets.topic = m.topic AND offsets.partition = m.partition; DROP TABLE offset_marks")


def _principal_times(db: duckdb.DuckDBPyConnection) -> None:
    """Principal records gain their event time; the migration changes no one's access.

    Each stored revocation already applies as of a version (the event's, or the one stored when
    it was read): a record of a principal with revocations is dated just after the latest of them,
    so the time rule adds nothing and what it holds today it holds after the upgrade (no plan
    becomes stale). Other records are of unknown time: a later revocation withdraws from them.
    """
    columns = {r[0] for r in db.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'principals'").fetchall()}
    if "made_at" in columns:
        return
    db.execute("ALTER TABLE principals ADD COLUMN made_at TIMESTAMPTZ; "
               "INSERT OR REPLACE INTO revocation_horizons SELECT principal, max(effective_at) FROM revoked "
               "GROUP BY principal; "
               "UPDATE principals SET made_at = h.effective_at + INTERVAL 1 MICROSECOND "
               "FROM revocation_horizons h WHERE h.principal = principals.id")
