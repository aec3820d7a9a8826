"""The event-id ledger: which (topic, event id, content hash) triples are new, repeats or conflicts."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from state.row_writes import SMALL_INSERT_ROWS, insert_rows


def claim_any(db: duckdb.DuckDBPyConnection, events: list[tuple[str, str, str]]) -> list[str]:
    """`Store.claim_events` on any file: ids recorded before ids were scoped by topic count for every topic."""
    ids = list({e for _, e, _ in events})
    known: dict[tuple[str, str], str | None] = {}
    legacy: set[str] = set()
    for topic, event_id, digest in db.execute(
            "SELECT topic, event_id, content_hash FROM applied_events WHERE event_id IN (SELECT unnest(?)) "
            "AND topic IN (SELECT unnest(?))", [ids, list({t for t, _, _ in events} | {""})]).fetchall():
        if topic == "":
            legacy.add(event_id)
        else:
            known[(topic, event_id)] = digest
    verdicts: list[str] = []
    new: list[tuple[str, str, str]] = []
    for topic, event_id, digest in events:
        if (topic, event_id) not in known and event_id not in legacy:
            known[(topic, event_id)] = digest
            new.append((topic, event_id, digest))
            verdicts.append("new")
        elif event_id in legacy and (topic, event_id) not in known:
            verdicts.append("duplicate")
        else:
            verdicts.append("duplicate" if known[(topic, event_id)] == digest else "conflict")
    rows = pa.table({"topic": [t for t, _, _ in new], "event_id": [e for _, e, _ in new],
                     "content_hash": [d for _, _, d in new]})
    insert_rows(db, "applied_events", rows, verb="INSERT INTO")
    return verdicts


def claim_scoped(db: duckdb.DuckDBPyConnection, events: list[tuple[str, str, str]]) -> list[str]:
    """`claim_events` in one statement on a file with no legacy ids: insert the new, look up only the rest."""
    first: dict[tuple[str, str], str] = {}
    for topic, event_id, digest in events:
        first.setdefault((topic, event_id), digest)
    insert = "INSERT INTO applied_events {} ON CONFLICT DO NOTHING RETURNING topic, event_id"
    if len(first) <= SMALL_INSERT_ROWS:
        inserted = set(db.execute(insert.format("VALUES " + ", ".join(["(?, ?, ?)"] * len(first))),
                                  [x for (t, e), d in first.items() for x in (t, e, d)]).fetchall())
    else:
        db.register("_rows_applied_events", pa.table({"topic": [t for t, _ in first], "event_id": [
            e for _, e in first], "content_hash": list(first.values())}))
        try:
            inserted = set(db.execute(insert.format("SELECT * FROM _rows_applied_events")).fetchall())
        finally:
            db.unregister("_rows_applied_events")
    known = dict(first)
    seen = [k for k in first if k not in inserted]
    if seen:  # ids applied before: compare their recorded content
        known.update({(t, e): d for t, e, d in db.execute(
            "SELECT topic, event_id, content_hash FROM applied_events WHERE event_id IN (SELECT unnest(?)) "
            "AND topic IN (SELECT unnest(?))", [list({e for _, e in seen}), list({t for t, _ in seen})]).fetchall()
            if (t, e) in known})
    verdicts = []
    for topic, event_id, digest in events:
        if (topic, event_id) in inserted:
            inserted.discard((topic, event_id))
            verdicts.append("new")
        else:
            verdicts.append("duplicate" if known[(topic, event_id)] == digest else "conflict")
    return verdicts
