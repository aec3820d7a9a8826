"""Many rows in one statement: each form of an insert, and of an update, writes the same rows."""

from __future__ import annotations

from datetime import datetime, timezone

import duckdb
import pyarrow as pa
import pytest

from state import row_writes
from state.row_writes import insert_rows, update_rows

ASSIGN = ("version = greatest(version, {version}), title = CAST({title} AS VARCHAR), "
          "tags = CAST({tags} AS VARCHAR[]), seen = CASE WHEN CAST({version} AS BIGINT) > 5 THEN "
          "CAST({seen} AS TIMESTAMPTZ) ELSE seen END")
AT = datetime(2026, 12, 6, 4, 0, tzinfo=timezone.utc)


@pytest.fixture
def db():
    db = duckdb.connect(":memory:")
    db.execute("CREATE TABLE rows (scope VARCHAR, id INTEGER, version BIGINT, title VARCHAR, tags VARCHAR[], "
               "seen TIMESTAMPTZ, PRIMARY KEY (scope, id))")
    db.execute("INSERT INTO rows SELECT s, i, 3, 'old', ['a'], NULL FROM (VALUES ('x'), ('y')) v(s), range(6) r(i)")
    yield db
    db.close()


def _rows(db) -> dict:
    return {(s, i): (v, t, g, w) for s, i, v, t, g, w in db.execute("SELECT * FROM rows").fetchall()}


@pytest.mark.parametrize("count", [1, 2, 5])
def test_each_form_sets_only_the_matched_rows(db, count):
    before = _rows(db)
    changed = [("x", i, 4 + 2 * i, None if i % 2 else f"t{i}", [] if i else ["b", "c"], AT) for i in range(count)]
    update_rows(db, "rows", ("scope", "id"), ("version", "title", "tags", "seen"), changed, ASSIGN)
    after = _rows(db)
    for scope, i, version, title, tags, seen in changed:
        assert after[(scope, i)] == (version, title, tags, seen if version > 5 else None)
    assert {k: v for k, v in after.items() if k[0] == "y" or k[1] >= count} == \
        {k: v for k, v in before.items() if k[0] == "y" or k[1] >= count}


def test_the_assignment_can_keep_the_stored_value(db):
    update_rows(db, "rows", ("scope", "id"), ("version", "title", "tags", "seen"),
                [("x", 0, 1, "a", ["a"], AT), ("y", 1, 9, "b", ["b"], AT)], ASSIGN)
    after = _rows(db)
    assert after[("x", 0)][0] == 3  # greatest() kept the stored version
    assert after[("y", 1)] == (9, "b", ["b"], AT)


def test_a_key_given_twice_takes_its_first_row(db):
    update_rows(db, "rows", ("scope", "id"), ("version", "title", "tags", "seen"),
                [("x", 2, 7, "first", ["f"], AT), ("x", 2, 8, "second", ["s"], AT), ("x", 3, 6, "other", [], AT)],
                ASSIGN)
    after = _rows(db)
    assert after[("x", 2)] == (7, "first", ["f"], AT)
    assert after[("x", 3)] == (6, "other", [], AT)


def test_no_rows_runs_nothing(db):
    before = _rows(db)
    update_rows(db, "rows", ("scope", "id"), ("version",), [], "version = {version}")
    assert _rows(db) == before


def test_a_key_not_stored_is_left_out(db):
    before = _rows(db)
    update_rows(db, "rows", ("scope", "id"), ("version", "title", "tags", "seen"),
                [("z", 0, 9, "z", [], AT), ("x", 9, 9, "z", [], AT)], ASSIGN)
    assert _rows(db) == before


def _inserted(rows: pa.Table, **kwargs) -> list[tuple]:
    db = duckdb.connect(":memory:")
    db.execute("SET TimeZone = 'UTC'")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name VARCHAR, tags VARCHAR[], seen TIMESTAMPTZ, flag BOOLEAN, "
               "body BLOB, gone VARCHAR)")
    db.execute("INSERT INTO t VALUES (0, 'stored', [], NULL, false, NULL, 'kept')")
    insert_rows(db, "t", rows, **kwargs)
    return db.execute("SELECT * FROM t ORDER BY id").fetchall()


@pytest.mark.parametrize("count", [1, 6, 7, 40, 400])  # parameters, parameters, unnested lists (2), Arrow scan
def test_each_form_of_an_insert_writes_the_same_rows(count):
    ids = list(range(count))
    rows = pa.table({"id": pa.array(ids, pa.int32()), "name": [None if i % 3 else f"n{i}" for i in ids],
                     "tags": pa.array([[] if i % 2 else ["a", f"t{i}"] for i in ids], pa.list_(pa.string())),
                     "seen": pa.array([AT if i % 2 else None for i in ids], pa.timestamp("us", tz="UTC")),
                     "flag": [i % 2 == 0 for i in ids], "body": pa.array([b"\x00\xff" * i for i in ids], pa.binary()),
                     "gone": pa.nulls(count)})  # a column of nulls only: its list would have no type
    expected = [(i, None if i % 3 else f"n{i}", [] if i % 2 else ["a", f"t{i}"], AT if i % 2 else None, i % 2 == 0,
                 b"\x00\xff" * i, None) for i in ids]
    assert _inserted(rows, verb="INSERT OR REPLACE INTO") == expected
    assert _inserted(rows, verb="INSERT INTO", columns=True,
                     on_conflict="ON CONFLICT (id) DO UPDATE SET gone = 'again'")[0][6] == "again"


def test_an_insert_whose_column_has_no_list_type_falls_back_to_an_arrow_scan(monkeypatch):
    monkeypatch.setattr(row_writes, "_SCALARS", {})  # no type is mapped: nothing may be unnested
    rows = pa.table({"id": pa.array(range(1, 21), pa.int32()), "name": [f"n{i}" for i in range(1, 21)]})
    db = duckdb.connect(":memory:")
    db.execute("CREATE TABLE t (id INTEGER, name VARCHAR)")
    insert_rows(db, "t", rows, verb="INSERT INTO")
    assert db.execute("SELECT count(*), min(name), max(id) FROM t").fetchone() == (20, "n1", 20)


class _Statements:
    """A connection that remembers the text of each statement it runs."""

    def __init__(self, db) -> None:
        self._db, self.run = db, []

    def execute(self, sql, *args):
        self.run.append(sql)
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


@pytest.mark.parametrize("count, form", [(6, "VALUES (?"), (7, "unnest(?::"), (40, "unnest(?::"), (700, "FROM _rows_")])
def test_each_size_of_insert_takes_its_form(count, form):
    db = _Statements(duckdb.connect(":memory:"))
    db.execute("CREATE TABLE t (id INTEGER, name VARCHAR)")
    insert_rows(db, "t", pa.table({"id": pa.array(range(count), pa.int32()), "name": [f"n{i}" for i in range(count)]}),
                verb="INSERT INTO")
    assert form in db.run[-1] and db.execute("SELECT count(*) FROM t").fetchone() == (count,)


def test_a_float_column_keeps_its_nan_whatever_the_rows():
    for count in (3, 7, 40, 200):
        db = duckdb.connect(":memory:")
        db.execute("CREATE TABLE t (id INTEGER, x DOUBLE)")
        insert_rows(db, "t", pa.table({"id": pa.array(range(count), pa.int32()), "x": [float("nan")] * count}),
                    verb="INSERT INTO")
        assert db.execute("SELECT count(*) FILTER (WHERE isnan(x)), count(*) FILTER (WHERE x IS NULL) FROM t"
                          ).fetchone() == (count, 0), count
