"""The DuckDB file: schema, transactions, offsets, event ids, the clock and counters."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Iterator

import duckdb

log = logging.getLogger(__name__)

_DDL = """
CREATE TABLE IF NOT EXISTS resources (
  id VARCHAR PRIMARY KEY, version BIGINT NOT NULL, entity VARCHAR, evidence_class VARCHAR,
  tokens BIGINT, title VARCHAR, content VARCHAR, supports VARCHAR[], contradicts VARCHAR[],
  valid_from TIMESTAMPTZ, valid_to TIMESTAMPTZ, superseded_by VARCHAR, provenance_group VARCHAR,
  sensitivity VARCHAR, attributes VARCHAR, deleted BOOLEAN NOT NULL DEFAULT false);
CREATE TABLE IF NOT EXISTS principals (
  id VARCHAR PRIMARY KEY, roles VARCHAR[], attributes VARCHAR, delegation_version BIGINT,
  deleted BOOLEAN NOT NULL DEFAULT false);
CREATE TABLE IF NOT EXISTS revoked (
  principal VARCHAR, kind VARCHAR, value VARCHAR, effective_at TIMESTAMPTZ, issued_by VARCHAR,
  event_id VARCHAR, PRIMARY KEY (principal, kind, value));
CREATE TABLE IF NOT EXISTS entities (id VARCHAR PRIMARY KEY, aliases VARCHAR[], deleted BOOLEAN NOT NULL DEFAULT false);
CREATE TABLE IF NOT EXISTS policy_bundles (
  bundle_id VARCHAR PRIMARY KEY, version BIGINT, effective_at TIMESTAMPTZ, cedar VARCHAR,
  decision_types VARCHAR);
CREATE TABLE IF NOT EXISTS contracts (decision_type VARCHAR PRIMARY KEY, bundle_id VARCHAR, body VARCHAR);
CREATE TABLE IF NOT EXISTS plans (
  plan_id VARCHAR PRIMARY KEY, plan_key VARCHAR, status VARCHAR, live BOOLEAN,
  valid_until TIMESTAMPTZ, request VARCHAR, plan VARCHAR, receipt_id VARCHAR, reason VARCHAR,
  cause VARCHAR, successor_plan_id VARCHAR, compiled_at TIMESTAMPTZ, invalidated_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS plan_heads (plan_key VARCHAR PRIMARY KEY, plan_id VARCHAR, live BOOLEAN,
  valid_until TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS dependency_index (dep_key VARCHAR, plan_key VARCHAR);
CREATE INDEX IF NOT EXISTS dependency_index_key ON dependency_index (dep_key);
CREATE TABLE IF NOT EXISTS receipts (receipt_id VARCHAR PRIMARY KEY, plan_id VARCHAR, receipt VARCHAR);
CREATE SEQUENCE IF NOT EXISTS outbox_seq;
CREATE TABLE IF NOT EXISTS outbox (seq BIGINT DEFAULT nextval('outbox_seq'), topic VARCHAR,
  key BLOB, value BLOB);
CREATE TABLE IF NOT EXISTS offsets (topic VARCHAR, partition INTEGER, next_offset BIGINT,
  PRIMARY KEY (topic, partition));
CREATE TABLE IF NOT EXISTS applied_events (event_id VARCHAR PRIMARY KEY);
CREATE TABLE IF NOT EXISTS clock (id INTEGER PRIMARY KEY, now TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS counters (name VARCHAR PRIMARY KEY, value BIGINT);
"""


class Store:
    """One DuckDB connection to the service's file; every write goes through `transaction()`."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = duckdb.connect(str(self.path))
        self.db.execute("SET TimeZone = 'UTC'")
        self.db.execute(_DDL)
        self._depth = 0

    def close(self) -> None:
        """Checkpoint and close the file."""
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """All-or-nothing writes; nested use joins the outer transaction."""
        if self._depth:
            self._depth += 1
            try:
                yield self.db
            finally:
                self._depth -= 1
            return
        self.db.begin()
        self._depth = 1
        try:
            yield self.db
        except BaseException:
            self.db.rollback()
            raise
        else:
            self.db.commit()
        finally:
            self._depth = 0

    # -- offsets and idempotence -------------------------------------------------------

    def next_offsets(self) -> dict[str, dict[int, int]]:
        """For each input topic and partition, the next offset not yet applied."""
        out: dict[str, dict[int, int]] = {}
        for topic, partition, nxt in self.db.execute("SELECT topic, partition, next_offset FROM offsets").fetchall():
            out.setdefault(topic, {})[partition] = nxt
        return out

    def save_offset(self, topic: str, partition: int, next_offset: int) -> None:
        """Record that everything before `next_offset` of a partition is applied."""
        self.db.execute("INSERT INTO offsets VALUES (?, ?, ?) ON CONFLICT (topic, partition) DO UPDATE "
                        "SET next_offset = greatest(offsets.next_offset, excluded.next_offset)",
                        [topic, partition, next_offset])

    def claim_event(self, event_id: str) -> bool:
        """True the first time an event id is seen; False for a duplicate."""
        row = self.db.execute("INSERT INTO applied_events VALUES (?) ON CONFLICT DO NOTHING RETURNING 1",
                              [event_id]).fetchone()
        return row is not None

    # -- clock -------------------------------------------------------------------------

    def now(self) -> datetime | None:
        """The service's event-time now: the latest clock tick applied."""
        row = self.db.execute("SELECT now FROM clock WHERE id = 1").fetchone()
        return row[0] if row else None

    def advance_clock(self, instant: datetime) -> bool:
        """Move now forward to `instant`; False (and no change) if it would move backwards."""
        current = self.now()
        if current is not None and instant <= current:
            return False
        self.db.execute("INSERT INTO clock VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET now = excluded.now",
                        [instant])
        return True

    # -- counters ----------------------------------------------------------------------

    def bump(self, name: str, by: int = 1) -> None:
        """Add to a named counter."""
        self.db.execute("INSERT INTO counters VALUES (?, ?) ON CONFLICT (name) DO UPDATE "
                        "SET value = counters.value + excluded.value", [name, by])

    def counters(self) -> dict[str, int]:
        """Every counter with its value."""
        return dict(self.db.execute("SELECT name, value FROM counters ORDER BY name").fetchall())
