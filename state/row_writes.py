"""Many rows written or updated in one DuckDB statement, in the form cheapest for their number."""

from __future__ import annotations

import re

import duckdb
import pyarrow as pa

SMALL_INSERT_ROWS = 32  # up to this many rows are written as parameters, more through an Arrow scan
VALUES_ROWS = 6  # up to this many rows, one `?` per value; more as one typed list per column, unnested
UNNEST_CELLS = 1200
"""Up to this many values (rows x columns), rows are given as typed lists and unnested; more go through an
Arrow scan. Median ms to insert rows in a transaction (2026-12-07, DuckDB 1.5.6), `?` per value / unnested
lists / Arrow scan: 6 columns, 20 rows 0.91 / 0.60 / 1.47, 64 rows 2.52 / 1.09 / 1.83, 200 rows 6.71 / 1.80 /
2.31; 14 columns with a 1.5 KB text, 16 rows 2.52 / 1.73 / 3.11, 64 rows 4.85 / 1.97 / 2.42, 150 rows 17.1 /
3.71 / 3.46. Registering a scan costs about 1.5 ms whatever the rows; a value in a list about a microsecond."""


def insert_rows(db: duckdb.DuckDBPyConnection, table: str, rows: pa.Table, *, verb: str = "INSERT OR REPLACE INTO",
                on_conflict: str = "", columns: bool = False) -> None:
    """Write many rows in one statement (the hot paths batch through here); `columns`: name them."""
    if rows.num_rows == 0:
        return
    target = f"{table} ({', '.join(rows.column_names)})" if columns else table
    values = None
    if rows.num_rows * rows.num_columns <= UNNEST_CELLS:
        values = [rows.column(i).to_pylist() for i in range(rows.num_columns)]
        if rows.num_rows <= VALUES_ROWS:
            insert_values(db, target, list(zip(*values, strict=True)), verb=verb, on_conflict=on_conflict)
            return
        listed = [_unnested(field.type) for field in rows.schema]
        if all(item is not None for item in listed) and any(item != "NULL" for item in listed):
            db.execute(f"{verb} {target} SELECT {', '.join(listed)} {on_conflict}",  # type: ignore[arg-type]
                       [v for v, item in zip(values, listed, strict=True) if item != "NULL"])
            return
    if values is not None and rows.num_rows <= SMALL_INSERT_ROWS:
        insert_values(db, target, list(zip(*values, strict=True)), verb=verb, on_conflict=on_conflict)
        return
    name = f"_rows_{table}"
    db.register(name, rows)
    try:
        db.execute(f"{verb} {target} SELECT * FROM {name} {on_conflict}")
    finally:
        db.unregister(name)


def insert_values(db: duckdb.DuckDBPyConnection, table: str, rows: list[tuple], *,
                  verb: str = "INSERT OR REPLACE INTO", on_conflict: str = "") -> None:
    """Write a few rows given as tuples in the table's column order (or `table (columns)`), as one statement."""
    if rows:
        row = f"({', '.join('?' * len(rows[0]))})"
        db.execute(f"{verb} {table} VALUES {', '.join([row] * len(rows))} {on_conflict}",
                   [v for values in rows for v in values])


def update_rows(db: duckdb.DuckDBPyConnection, table: str, keys: tuple[str, ...], values: tuple[str, ...],
                rows: list[tuple], assign: str) -> int:
    """Update rows (key values, then values) matched on `keys` in one statement; `assign` names values as `{v}`.

    One row is a plain keyed update (a point update of a resource: 0.8 ms against 2.1 ms for a
    join in DuckDB 1.x). More are joined to the columns given as lists and unnested: its cost
    hardly grows with the rows, where a `CASE` per value over the rows' keys grew with them
    (12 offsets: 6.3 against 2.8 ms). A key given twice takes its first row's values. Returns the rows updated.
    """
    if not rows:
        return 0
    width = len(keys)
    parts = re.split(r"\{(\w+)\}", assign)
    if len(rows) == 1:
        at = {name: rows[0][width + i] for i, name in enumerate(values)}
        text, params = parts[0], []
        for name, tail in zip(parts[1::2], parts[2::2], strict=True):
            text += "?" + tail
            params.append(at[name])
        match = " AND ".join(f"{k} = ?" for k in keys)
        return db.execute(f"UPDATE {table} SET {text} WHERE {match}", params + list(rows[0][:width])).fetchone()[0]
    first: dict[tuple, tuple] = {}
    for row in rows:
        first.setdefault(tuple(row[:width]), row)
    columns = list(zip(*first.values(), strict=True))
    column = {name: f"_v.v{i}" for i, name in enumerate(values)}
    text = parts[0] + "".join(column[name] + tail for name, tail in zip(parts[1::2], parts[2::2], strict=True))
    listed = ", ".join([f"unnest(?) AS k{i}" for i in range(width)]
                       + [f"unnest(?) AS v{i}" for i in range(len(values))])
    match = " AND ".join(f"{table}.{k} = _v.k{i}" for i, k in enumerate(keys))
    return db.execute(f"UPDATE {table} SET {text} FROM (SELECT {listed}) AS _v WHERE {match}",
                      [list(c) for c in columns]).fetchone()[0]


# Floats are left to the Arrow scan: DuckDB's Python client reads a NaN inside a list parameter as NULL.
_SCALARS = {pa.string(): "VARCHAR", pa.large_string(): "VARCHAR", pa.bool_(): "BOOLEAN", pa.int8(): "TINYINT",
            pa.int16(): "SMALLINT", pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.binary(): "BLOB",
            pa.large_binary(): "BLOB"}


def _duckdb_type(t: pa.DataType) -> str | None:
    """The DuckDB type Arrow's `t` is scanned as; None for one not mapped here."""
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ" if t.tz else "TIMESTAMP"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _duckdb_type(t.value_type)
        return None if inner is None else f"{inner}[]"
    return _SCALARS.get(t)


def _unnested(t: pa.DataType) -> str | None:
    """A column of an insert given as one list parameter: `unnest(?::T[])`, or `NULL` for a column of nulls only
    (its list has no type; the column's own applies); None when the type is not mapped (the caller scans Arrow)."""
    if pa.types.is_null(t):
        return "NULL"
    duck = _duckdb_type(t)
    return None if duck is None else f"unnest(?::{duck}[])"
