"""A read connection whose query results are read to their end at once, so no query stays open."""

from __future__ import annotations

from typing import Any

import duckdb


class Rows:
    """A query's rows, already read: what `fetchone` and `fetchall` callers of a connection expect."""

    __slots__ = ("_rows", "_next")

    def __init__(self, rows: list[tuple]) -> None:
        self._rows = rows
        self._next = 0

    def fetchone(self) -> tuple | None:
        """The next row, or None past the last."""
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchall(self) -> list[tuple]:
        """The rows not yet fetched."""
        rows, self._next = self._rows[self._next:], len(self._rows)
        return rows


class DrainedConnection:
    """Wraps a DuckDB cursor used from another thread than the writer's.

    A result read only in part (`fetchone` of a one-row count) keeps its query, and its
    transaction, open until the connection's next statement. Meanwhile DuckDB keeps every
    UPDATE committed since, and refuses every checkpoint, the automatic one at the log cap
    included: an idle worker's log grew to 218 MB against a 64 MB cap in the bench.
    """

    def __init__(self, db: duckdb.DuckDBPyConnection) -> None:
        self._db = db

    def execute(self, query: str, parameters: Any = None) -> Rows:
        """Run a statement and read its result whole."""
        result = self._db.execute(query) if parameters is None else self._db.execute(query, parameters)
        return Rows(result.fetchall() if result.description is not None else [])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)
