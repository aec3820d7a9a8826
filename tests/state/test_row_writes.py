"""Updating many rows in one statement: the keyed form for one row and the joined form for more write the same."""

from __future__ import annotations

from datetime import datetime, timezone

import duckdb
import pytest

from state.row_writes import update_rows

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
