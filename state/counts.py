"""Counters: increments staged with the writer's transaction and written to the file about once a second."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Callable, Mapping

import pyarrow as pa

FLUSH_SECONDS = 1.0  # the longest committed increments wait in memory while the writer commits transactions


class Counts:
    """What the writer committed to its counters but has not written yet; shared by the file's views.

    Writing the counter rows costs a statement in every transaction that bumps one (about 1 ms of
    a one-event apply batch's 8, and of every backlog job, in DuckDB 1.5), so committed
    increments wait here and go out with the writer's first transaction a second or more after
    the last write, and at a clean stop. Readers add them to the rows under the lock the writer
    commits under, so an increment is never counted twice or missed. A kill -9 loses at most the
    last second's increments: counters are operational figures (Prometheus reads a lower value
    as a restart), and nothing is decided by them.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held by a reader over its read, and by the writer over a commit
        self.pending: Counter[str] = Counter()  # committed, not yet in the file
        self.written_at = time.monotonic()

    def due(self) -> bool:
        """Whether the writer's transaction should write what is pending."""
        return bool(self.pending) and time.monotonic() - self.written_at >= FLUSH_SECONDS

    def commit(self, commit: Callable[[], None], staged: Mapping[str, int],
               write: Callable[[Mapping[str, int]], None] | None) -> None:
        """Commit a transaction with its `staged` increments; with `write` (the writer's), write what is pending
        in it first when that is due."""
        written = None
        if write is not None and self.due():
            written = dict(self.pending)
            write(self.pending + Counter(staged))
        with self.lock:
            commit()
            self.committed(staged, written)

    def flush(self, write: Callable[[Mapping[str, int]], None]) -> None:
        """Write what is pending outside any transaction (at a clean stop)."""
        with self.lock:
            if self.pending:
                write(self.pending)
                self.pending.clear()

    def committed(self, staged: Mapping[str, int], written: Mapping[str, int] | None) -> None:
        """After a commit (under `lock`): `staged` joins what is pending, or `written` left it for the file."""
        if written is None:
            self.pending.update(staged)
            return
        self.pending.subtract(written)
        for name in [n for n, v in self.pending.items() if not v]:
            del self.pending[name]
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
