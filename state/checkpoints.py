"""When the state file is checkpointed: in idle moments, and at a hard cap on the write-ahead log."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

import duckdb

log = logging.getLogger(__name__)

DEFAULT_WAL_LIMIT = 64 * 2**20  # DuckDB checkpoints at a commit from this much log on, busy or not
IDLE_SHARE = 16  # an idle writer checkpoints from a sixteenth of that on (4 MB of the default 64)
# DuckDB also refuses a checkpoint while a read transaction that began before the last committed
# UPDATE is still open: a select's snapshot, for a millisecond or two, which a retry a few ms later
# outlasts. (A read left open for good refused every checkpoint: views drain their results, see
# state.drained.)
ATTEMPTS = 4
RETRY_PAUSE = 0.005  # seconds between attempts (the writer holds no transaction meanwhile)
# DuckDB compacts a table with an index (deleted rows out, indexes rebuilt, the table's readers and the writer held
# meanwhile, ~2.4-5 us a row) only if its stored rows, deleted ones included, are within this limit, fixed when the
# file opens (`Store`): a table past it keeps its deleted rows, and one a burst took past it (a take-over re-parking
# 100,000 plans twice) stays past it. `kept_rows` shows where a file stands.
COMPACT_STORED_ROWS = 200_000
_KEYED_TABLES = """
SELECT DISTINCT table_name FROM duckdb_indexes() WHERE database_name = current_database()
UNION SELECT DISTINCT table_name FROM duckdb_constraints()
WHERE database_name = current_database() AND constraint_type IN ('PRIMARY KEY', 'UNIQUE')
"""


class Checkpoints:
    """Moves DuckDB's checkpoints (which stop every writer) out of the apply stream where it can.

    DuckDB 1.5 re-serializes every modified ART index whole at a checkpoint (duckdb#24848), and
    each primary key is one: with 20,000 events applied a checkpoint took ~200 ms whatever the
    log held, growing with the history (0.5 s with 100,000 rows in a keyed table). At DuckDB's
    default 16 MB threshold one fell inside the stream every few seconds, and it was the
    subscriber's worst latency. So the automatic threshold is raised to `wal_limit` (a cap that
    bounds replay after a crash) and the worker checkpoints whenever its writer is idle with a
    sixteenth of that or more in the log.
    """

    def __init__(self, db: duckdb.DuckDBPyConnection, path: Path, wal_limit: int = DEFAULT_WAL_LIMIT) -> None:
        self.db = db
        self.wal = Path(f"{path}.wal")
        self.idle_runs = 0  # checkpoints taken while idle
        self.refused = 0  # idle checkpoints postponed because another connection was writing
        self.passed_busy = 0  # idle checkpoints passed over because input was waiting by the time they ran
        self.last_seconds = 0.0  # how long the last one held the file
        self.last_refusal: str | None = None  # DuckDB's reason for the last postponement (it names no data)
        self.limit(wal_limit)

    def limit(self, wal_limit: int) -> None:
        """Let DuckDB checkpoint at a commit only from this many bytes of log on (a database-wide setting)."""
        # At least 1 MB: a zero or negative FRESHPLAN_WAL_LIMIT_MB would checkpoint at every commit or fail to start.
        self.wal_limit = max(2**20, int(wal_limit))
        self.db.execute(f"SET checkpoint_threshold = '{self.wal_limit}B'")

    def wal_bytes(self) -> int:
        """Bytes in the write-ahead log now (what a checkpoint would fold into the file)."""
        try:
            return self.wal.stat().st_size
        except FileNotFoundError:
            return 0

    def when_idle(self, at_least: int | None = None, still_idle: Callable[[], bool] | None = None) -> bool:
        """Checkpoint if the log holds `at_least` bytes, by default a sixteenth of the limit (on the writer,
        outside any transaction), and `still_idle()` says no input is waiting.

        The job is queued in a quiet second and runs after the writer's jobs waiting then: a stream that
        started meanwhile would stop behind it (100-200 ms at the start of a bench stream), so it asks again."""
        if self.wal_bytes() < (self.wal_limit // IDLE_SHARE if at_least is None else at_least):
            return False
        if still_idle is not None and not still_idle():
            self.passed_busy += 1
            return False
        started = time.perf_counter()
        for attempt in range(ATTEMPTS):
            try:
                self.db.execute("CHECKPOINT")
                break
            except duckdb.TransactionException as exc:
                if attempt + 1 < ATTEMPTS:
                    time.sleep(RETRY_PAUSE)
                    continue
                # Another connection's write transaction is open (or a snapshot older than the last
                # UPDATE): the next idle second tries again. FORCE CHECKPOINT would abort it instead.
                self.refused += 1
                if str(exc) != self.last_refusal:  # once per distinct reason: it repeats every idle second
                    log.info("idle checkpoint postponed, retrying in the next idle second: %s", exc)
                self.last_refusal = str(exc)
                return False
        self.last_seconds = time.perf_counter() - started
        self.idle_runs += 1
        log.debug("checkpointed the state file while idle in %.0f ms", self.last_seconds * 1000)
        return True

    def kept_rows(self) -> dict[str, tuple[int, int]]:
        """Each keyed table's (live rows, rows the file holds with the deleted ones not yet compacted away)."""
        out = {}
        for (table,) in self.db.execute(_KEYED_TABLES).fetchall():
            live = self.db.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
            stored = self.db.execute("SELECT coalesce(max(n), 0) FROM (SELECT column_id, sum(count) AS n FROM "
                                     "pragma_storage_info(?) WHERE segment_type <> 'VALIDITY' GROUP BY column_id)",
                                     [table]).fetchone()[0]
            out[table] = (live, int(stored))
        return out

    def as_dict(self) -> dict:
        """Shape shown in /healthz."""
        return {"wal_bytes": self.wal_bytes(), "wal_limit_bytes": self.wal_limit, "idle_checkpoints": self.idle_runs,
                "idle_checkpoints_postponed": self.refused, "idle_checkpoints_passed_busy": self.passed_busy,
                "last_postponed_because": self.last_refusal,
                "last_idle_checkpoint_seconds": round(self.last_seconds, 3)}
