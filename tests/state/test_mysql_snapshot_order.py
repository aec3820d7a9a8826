"""MySQL snapshot rows against streamed changes of the same row, without a version column, on real DuckDB.

Debezium reads a MySQL snapshot in one consistent-snapshot transaction opened at a binlog position
(the rows' `file`/`pos`); a row's `source.ts_ms` is when the read of its table began, later than
that position. A change committed in between was not read, streams afterwards, and is newer.
"""

from __future__ import annotations

import itertools

import orjson

from schemas.cdc_mapping import parse
from schemas.codec import decode
from state.local_state import LocalState

MAPPING = parse(orjson.dumps({"tables": {"crm.documents": {"kind": "resource", "fields": {
    "id": "doc_id", "entity": "customer_id", "tokens": "n", "evidence_class": "cls", "content": "body"}}}}).decode())
POINT = 1_788_080_400_000  # when the snapshot's binlog position was read (no record carries this)
READ = POINT + 40_000  # source.ts_ms of the snapshot row: its table's read began 40 s later
_row = itertools.count()


def snapshot(body: str, ts_ms: int = READ, file: str = "mysql-bin.000004", pos: int = 157) -> bytes:
    """A snapshot row as Debezium 2.x writes it: the consistent point's file/pos, server_id 0, no GTID."""
    return _envelope("r", body, {"snapshot": "true", "ts_ms": ts_ms, "file": file, "pos": pos, "server_id": 0,
                                 "gtid": None, "row": 0})


def streamed(body: str, ts_ms: int, file: str = "mysql-bin.000004", pos: int = 900) -> bytes:
    return _envelope("u", body, {"snapshot": "false", "ts_ms": ts_ms, "file": file, "pos": pos,
                                 "server_id": 223344, "gtid": f"3E11FA47-71CA-11E1-9E33-C80AA9429562:{next(_row)}",
                                 "row": 0})


def _envelope(op: str, body: str, source: dict) -> bytes:
    return orjson.dumps({"before": None, "op": op, "ts_ms": READ + 60_000,
                         "after": {"doc_id": "d1", "customer_id": "E1", "n": 5, "cls": "memo", "body": body},
                         "source": {"connector": "mysql", "db": "crm", "table": "documents"} | source})


def apply(state: LocalState, value: bytes):
    event = decode("source-changes", b"d1", value, position="0:0", cdc=MAPPING)
    with state.store.transaction():
        return state.catalog.apply_source_change(event.payload, event.occurred_at)


def stored(state: LocalState) -> tuple[int, str]:
    return state.store.db.execute("SELECT version, content FROM resources WHERE id = 'd1'").fetchone()


def test_changes_committed_during_the_snapshot_and_streamed_after_it_win(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        assert apply(state, snapshot("as of the snapshot")) is not None
        read, _ = stored(state)
        # Committed 10 s after the consistent point, 30 s before the row's read time: the snapshot missed it.
        assert apply(state, streamed("during the snapshot", POINT + 10_000, pos=900)) is not None
        during, content = stored(state)
        assert content == "during the snapshot" and during > read  # versions still rise: plan ids move on
        # A later change of the same gap is newer than the first, by its commit time.
        assert apply(state, streamed("later in the snapshot", POINT + 20_000, pos=1_400)) is not None
        later, content = stored(state)
        assert content == "later in the snapshot" and later > during
        # After a binlog rotation, still at or after the point.
        assert apply(state, streamed("next file", POINT + 25_000, file="mysql-bin.000005", pos=4)) is not None
        assert stored(state)[1] == "next file"
    finally:
        state.close()


def test_an_older_streamed_change_replayed_after_the_snapshot_does_not_win(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        apply(state, snapshot("as of the snapshot", ts_ms=POINT))  # its table was read first (MySQL 5.7: seconds)
        # Committed before the point (the snapshot read it): in the same second, then a second earlier.
        assert apply(state, streamed("before the point", POINT, pos=120)) is None
        assert apply(state, streamed("a second before", POINT - 1_000, file="mysql-bin.000003", pos=9_000)) is None
        assert stored(state)[1] == "as of the snapshot"
        assert apply(state, streamed("after the point", POINT, pos=157)) is not None  # at the point: not read
        assert apply(state, streamed("later", POINT + 2_000, pos=700)) is not None
        # A change older than the stored one, after the point or before it, is older.
        assert apply(state, streamed("replayed", POINT + 1_000, pos=400)) is None
        assert apply(state, streamed("replayed before", POINT - 1_000, pos=100)) is None
        assert stored(state)[1] == "later"
    finally:
        state.close()


def test_a_re_snapshot_after_a_binlog_reset_repairs_the_row(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        apply(state, snapshot("first snapshot", file="mysql-bin.000057", pos=4_000))
        apply(state, streamed("streamed", READ + 5_000, file="mysql-bin.000057", pos=9_000))
        # The binlog was reset (positions restart) and the row changed while nothing was captured:
        # a new snapshot an hour later reads the table at mysql-bin.000002:157 and must replace the row.
        assert apply(state, snapshot("re-snapshot", ts_ms=READ + 3_600_000, file="mysql-bin.000002")) is not None
        assert stored(state)[1] == "re-snapshot"
        # And a snapshot over a stored snapshot row (another reset): the later read wins at a lower position.
        assert apply(state, snapshot("third", ts_ms=READ + 7_200_000, file="mysql-bin.000001")) is not None
        assert stored(state)[1] == "third"
        # The replayed first snapshot row (read before all of it) does not come back.
        assert apply(state, snapshot("first snapshot", file="mysql-bin.000057", pos=4_000)) is None
        assert stored(state)[1] == "third"
    finally:
        state.close()


def test_another_binlog_name_leaves_commit_times_to_judge(tmp_path):
    """A failover to a server whose binlog has another name: its positions say nothing about the point."""
    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        apply(state, snapshot("as of the snapshot"))
        assert apply(state, streamed("other server, earlier", POINT + 10_000, file="binlog.000009", pos=900)) is None
        assert apply(state, streamed("other server, later", READ + 1_000, file="binlog.000009", pos=950)) is not None
        assert stored(state)[1] == "other server, later"
    finally:
        state.close()


def test_a_file_from_before_log_ticks_keeps_ordering_its_rows(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    apply(state, streamed("first", POINT))
    version, _ = stored(state)
    # As a file from before the columns (its index is recreated on open, so it may go too).
    state.store.db.execute("DROP INDEX resources_entity; ALTER TABLE resources DROP COLUMN log_tick; "
                           "ALTER TABLE resources DROP COLUMN log_snapshot")
    state.close()
    state = LocalState.open(tmp_path / "f.duckdb")
    try:
        assert apply(state, streamed("older", POINT - 1_000)) is None
        assert apply(state, streamed("same tick", POINT)) is not None  # the tick is its version's
        assert stored(state) == (version + 1, "same tick")
    finally:
        state.close()
