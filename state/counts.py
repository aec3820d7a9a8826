"""Counters: increments staged with the writer's transaction and written to the file about once a second."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Callable, Mapping

import duckdb
import pyarrow as pa

FLUSH_SECONDS = 1.0  # how long committed increments wait in memory before the writer's timer writes them


class Counts:
    """What the writer committed to its counters but has not written yet; shared by the file's views.

    Writing the counter rows costs a statement in every transaction that bumps one (about 1 ms of
    a one-event apply batch's 8, and of every backlog job, in DuckDB 1.5), so committed
    increments wait here, and the writer writes them in a transaction of their own once a second
    or more has passed (a timer asks every second) and at a clean stop. A failure of that write
    can therefore undo nothing else. Readers add them to the rows under a lock the writer holds
    while it moves them, so an increment is never counted twice or missed. A kill -9 loses the
    increments of about the last two seconds: counters are operational figures (Prometheus reads
    a lower value as a restart), and nothing is decided by them.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held by a reader over its read, by the writer while it moves increments
        self.pending: Counter[str] = Counter()  # committed, not yet in the file
        self.written_at = time.monotonic()

    def due(self) -> bool:
        """Whether what is pending has waited long enough to be written."""
        return bool(self.pending) and time.monotonic() - self.written_at >= FLUSH_SECONDS

    def committed(self, staged: Mapping[str, int]) -> None:
        """After the writer's transaction committed: its `staged` increments are pending."""
        if staged:
            with self.lock:
                self.pending.update(staged)

    def write(self, db: duckdb.DuckDBPyConnection, write: Callable[[Mapping[str, int]], None]) -> None:
        """Write what is pending with `write` in a transaction of its own on the writer's `db`: the increments
        leave memory as the file gets them, under the lock; a failure rolls back and keeps them pending."""
        with self.lock:
            written = dict(self.pending)
        if not written:
            return
        db.begin()
        try:
            write(written)
            with self.lock:
                db.commit()
                self.pending.subtract(written)
                for name in [n for n, v in self.pending.items() if not v]:
                    del self.pending[name]
        except BaseException:
            db.rollback()
            raise
        self.written_at = time.monotonic()

    def read(self, rows: Callable[[], list[tuple[str, int]]], staged: Mapping[str, int]) -> dict[str, int]:
        """The file's counter rows plus what is pending (and `staged`: the reader's own open transaction)."""
        with self.lock:
            values = Counter(dict(rows()))
            values.update(self.pending)
        values.update(staged)
        return dict(sorted(values.items()))


def write_counts(counts: Mapping[str, int], names: set[str] | None, update_rows: Callable[..., int],
                 insert_rows: Callable[..., None]) -> None:
    """Add to many counters in one statement (two when some are new); `names`: the counters known to exist."""
    counts = {k: v for k, v in counts.items() if v}
    if not counts:
        return
    known = names if names is not None else set()
    new = {k: v for k, v in counts.items() if k not in known}
    if len(new) < len(counts):
        # The usual write bumps counters that exist: an update costs half an upsert.
        update_rows("counters", ("name",), ("value",), [(k, v) for k, v in counts.items() if k not in new],
                    "value = value + {value}")
    if new:
        insert_rows("counters", pa.table({"name": list(new), "value": list(new.values())}), verb="INSERT INTO",
                    on_conflict="ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value")
        if names is not None:
            names.update(new)
