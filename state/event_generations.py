"""Generations of the event-id ledger: claims go to the newest table, a whole old one is dropped when it has aged."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import duckdb

CURRENT = "applied_events"
"""The generation new ids are claimed in; each older one is `applied_events_<generation>`."""
OLDER_MEMO = "event_ids.older"
LEGACY_MEMO = "event_ids.legacy"
"""Store memo keys of the older tables and of whether any holds ids from before topics scoped them."""

# DuckDB deletes a ledger row for ~40 us (100,000 of 2,000,000 took 4 s, removing each from the
# primary key at commit), far too long for the writer; dropping a table costs the same at any size.
# So ids live in generations: one opens every `span`, and a closed one goes whole once its last
# claim is `span` old. An id is kept from one span to two after its first claim; lookups read
# the current and at most one older table after each pass.
_DDL = """
CREATE TABLE IF NOT EXISTS event_id_generations (generation INTEGER PRIMARY KEY, opened_at TIMESTAMPTZ);
INSERT INTO event_id_generations SELECT 0, NULL WHERE NOT EXISTS (SELECT 1 FROM event_id_generations);
"""
LEDGER_COLUMNS = "(event_key VARCHAR PRIMARY KEY, topic VARCHAR, event_id VARCHAR, content_hash VARCHAR)"
MIN_SPAN = timedelta(hours=1)  # shorter would rename and create tables at every pass, and forget ids within seconds


@dataclass(frozen=True)
class Pruned:
    """What one pass over the generations did."""

    generations_dropped: int = 0
    """Old generation tables dropped."""
    ids_dropped: int = 0
    """Event ids they held: re-sent now, those events are applied again."""
    opened: bool = False
    """Whether a new current generation was opened."""


def ensure(db: duckdb.DuckDBPyConnection) -> None:
    """Record generations (a file without them: its `applied_events`, ids included, becomes generation 0)."""
    db.execute(_DDL)


def table(generation: int, current: int) -> str:
    """The table of a generation, given the current one."""
    return CURRENT if generation == current else f"{CURRENT}_{generation}"


def older_tables(db: duckdb.DuckDBPyConnection) -> list[str]:
    """Tables of the closed generations still kept, newest first."""
    generations = [g for (g,) in db.execute(
        "SELECT generation FROM event_id_generations ORDER BY generation DESC").fetchall()]
    return [table(g, generations[0]) for g in generations[1:]]


def has_legacy(db: duckdb.DuckDBPyConnection, older: list[str]) -> bool:
    """Whether any kept generation holds ids recorded before ids were scoped by topic (topic '')."""
    union = " UNION ALL ".join(f"SELECT 1 FROM {t} WHERE topic = ''" for t in [CURRENT, *older])
    return db.execute(f"SELECT count(*) > 0 FROM ({union})").fetchone()[0]


def lookup_sql(tables: list[str], columns: str) -> str:
    """One statement reading `columns` of the given keys (one list parameter per table) from every table."""
    return " UNION ALL ".join(f"SELECT {columns} FROM {t} WHERE event_key IN (SELECT unnest(?::VARCHAR[]))"
                              for t in tables)


def prune(db: duckdb.DuckDBPyConnection, now: datetime, span: timedelta) -> Pruned:
    """Drop closed generations whose last claim is `span` before `now`; open a new one when the current is `span` old.

    `span` is at least `MIN_SPAN`. A generation with no opening time (the first, or one migrated)
    counts from `now`. Runs in the caller's transaction; the caller forgets `OLDER_MEMO` and
    `LEGACY_MEMO` when it changed.
    """
    span = max(span, MIN_SPAN)
    db.execute("UPDATE event_id_generations SET opened_at = ? WHERE opened_at IS NULL", [now])
    rows = db.execute("SELECT generation, opened_at FROM event_id_generations ORDER BY generation").fetchall()
    current, opened_at = rows[-1]
    dropped, ids = [], 0
    # A generation closed when the next opened: nothing in it is newer than that.
    for (generation, _), (_, closed_at) in zip(rows[:-1], rows[1:], strict=True):
        if closed_at <= now - span:
            name = table(generation, current)
            ids += db.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
            db.execute(f"DROP TABLE {name}")
            dropped.append(generation)
    if dropped:
        db.execute("DELETE FROM event_id_generations WHERE generation IN (SELECT unnest(?::INTEGER[]))", [dropped])
    opened = opened_at <= now - span
    if opened:
        db.execute(f"ALTER TABLE {CURRENT} RENAME TO {CURRENT}_{current}")
        db.execute(f"CREATE TABLE {CURRENT} {LEDGER_COLUMNS}")
        db.execute("INSERT INTO event_id_generations VALUES (?, ?)", [current + 1, now])
    return Pruned(len(dropped), ids, opened)


def sizes(db: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Generations kept (for /healthz)."""
    return {"event_id_generations": db.execute("SELECT count(*) FROM event_id_generations").fetchone()[0]}
