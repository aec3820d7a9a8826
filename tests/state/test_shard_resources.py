"""Review: resources partitioned by entity, at the catalog (pure logic, no broker)."""

from __future__ import annotations

import orjson
import pytest

from schemas.codec import decode
from schemas.errors import InvalidEvent
from state.local_state import LocalState
from tests.events import resource

A, B = "ATLAS-IN-01", "BOREAL-UK-02"


def change(event: tuple[str, dict], **doc):
    topic, body = event
    body = dict(body, **doc)
    return decode(topic, None, orjson.dumps(body)).payload


def only(entity: str):
    return lambda e: e is None or e == entity


@pytest.fixture
def open_state(tmp_path):
    opened = []

    def make(name: str) -> LocalState:
        opened.append(LocalState.open(tmp_path / f"{name}.duckdb"))
        return opened[-1]
    yield make
    for s in opened:
        s.close()


def apply(state: LocalState, changes, mine):
    with state.store.transaction():
        return state.catalog.apply_resources(list(changes), mine)


def stored(state: LocalState, rid: str):
    return state.store.db.execute("SELECT version, entity, deleted FROM resources WHERE id = ?", [rid]).fetchone()


def test_an_older_version_after_a_move_away_is_not_resurrected_in_the_old_shard(open_state):
    """The holder of A removes a row that moved to B, and with it the version fence: an older change
    about A arriving later (a re-sent or re-ordered change, which `ignored_old_versions` exists for)
    is inserted again, so A's shard holds a resource that lives at B (held twice, once stale)."""
    x = open_state("x")
    v1 = change(resource("r1", entity=A, version=1))
    v2 = change(resource("r1", entity=B, version=2))
    apply(x, [v1], only(A))
    apply(x, [v2], only(A))
    assert stored(x, "r1") == (2, B, True)  # moved away: a tombstone at its new entity, the version kept
    late = change(resource("r1", entity=A, version=1, content="re-sent"))
    assert apply(x, [late], only(A)) == [None], "an older version than the one applied must be ignored"
    assert stored(x, "r1") == (2, B, True)
    back = change(resource("r1", entity=A, version=3))
    assert isinstance(apply(x, [back], only(A))[0], list) and stored(x, "r1") == (3, A, False)


def test_a_cdc_move_with_unchanged_toasted_columns_is_refused_by_its_new_holder(open_state):
    """Debezium leaves unchanged TOASTed columns out of an update: a row moved to another shard's entity
    has no stored base at its new holder, which refuses it (`unavailable_value`, dead-lettered there once)
    rather than store a resource with columns it does not know; the old holder keeps only a tombstone.
    docs/cdc.md says to give such tables REPLICA IDENTITY FULL."""
    x, y, alone = open_state("x"), open_state("y"), open_state("alone")
    v1 = change(resource("r1", entity=A, version=1, content="long text"))
    moved = change(resource("r1", entity=B, version=2, content="__debezium_unavailable_value"),
                   unavailable={"content": "content"})
    assert moved.unavailable
    for s, mine in ((x, only(A)), (y, only(B)), (alone, lambda e: True)):
        apply(s, [v1], mine)
    results = {name: apply(s, [moved], mine)[0]
               for name, s, mine in (("x", x, only(A)), ("y", y, only(B)), ("alone", alone, lambda e: True))}
    assert isinstance(results["alone"], list) and stored(alone, "r1") == (2, B, False)
    assert isinstance(results["x"], list) and stored(x, "r1") == (2, B, True)  # its old entity's plans change
    assert isinstance(results["y"], InvalidEvent) and results["y"].error_class == "unavailable_value", results["y"]
    assert stored(y, "r1") is None


@pytest.mark.parametrize("edited", [3, 120, 300])
def test_edits_of_stored_resources_leave_the_rows_a_fresh_insert_would(open_state, edited):
    """A few stored resources are updated in place, more upserted, many deleted and inserted again (see
    `UPDATE_RESOURCES`): each way each row holds every column of its new version, its entity is indexed, and no
    row is lost or doubled; a file that only ever inserted holds the same rows."""
    from state import catalog_resources

    assert [edited > catalog_resources.UPDATE_RESOURCES, edited > catalog_resources.REPLACE_RESOURCES] == \
        {3: [False, False], 120: [True, False], 300: [True, True]}[edited]
    x, fresh = open_state("x"), open_state("fresh")
    first = [change(resource(f"r{i}", entity=A if i % 2 else B, version=1)) for i in range(edited + 2)]
    apply(x, first, lambda e: True)
    again = [change(resource(f"r{i}", entity=B if i % 2 else A, version=2, content=f"edit {i}", tokens=7 + i,
                             supports=("limit_ok",))) for i in range(edited)]
    assert all(keys for keys in apply(x, again, lambda e: True))
    apply(fresh, first[edited:] + again, lambda e: True)
    rows = "SELECT " + catalog_resources.RESOURCE_COLS + ", deleted, log_tick, log_snapshot FROM resources ORDER BY id"
    assert x.store.db.execute(rows).fetchall() == fresh.store.db.execute(rows).fetchall()
    assert x.store.db.execute("SELECT count(*), count(DISTINCT id) FROM resources").fetchone() == (edited + 2,) * 2
    by_entity = "SELECT id FROM resources WHERE entity = ? ORDER BY id"
    assert x.store.db.execute(by_entity, [A]).fetchall() == fresh.store.db.execute(by_entity, [A]).fetchall()


def _rows_kept(state: LocalState) -> int:
    """Rows the resources table holds, deleted ones included (DuckDB's estimate counts them until a checkpoint
    compacts its row groups, which it does for small tables like these)."""
    return state.store.db.execute("SELECT estimated_size FROM duckdb_tables() WHERE table_name = 'resources'"
                                  ).fetchone()[0]


@pytest.mark.parametrize("edited", [1, 40, 300, 600])
def test_edits_that_keep_the_lists_update_rows_in_place(open_state, edited):
    """Edits that leave `supports` and `contradicts` as stored do not set them, so DuckDB updates the rows in place
    (setting a list column deletes the row and inserts it again, and the deleted row stays in the file): up to
    `IN_PLACE_RESOURCES` rows no deleted row is left; beyond, a catch-up batch is deleted and inserted. Either
    way the rows equal those of a file that only ever inserted; a later edit of the lists still lands."""
    from state import catalog_resources

    x, fresh = open_state("x"), open_state("fresh")
    first = [change(resource(f"r{i}", entity=A, version=1, supports=("p", "q"))) for i in range(edited)]
    apply(x, first, lambda e: True)
    kept = _rows_kept(x)
    again = [change(resource(f"r{i}", entity=A, version=2, content=f"edit {i}", tokens=7 + i, supports=("p", "q")))
             for i in range(edited)]
    assert all(keys for keys in apply(x, again, lambda e: True))
    apply(fresh, again, lambda e: True)
    rows = "SELECT " + catalog_resources.RESOURCE_COLS + ", deleted, log_tick, log_snapshot FROM resources ORDER BY id"
    assert x.store.db.execute(rows).fetchall() == fresh.store.db.execute(rows).fetchall()
    if edited <= catalog_resources.IN_PLACE_RESOURCES:
        assert _rows_kept(x) == kept, "an edit that keeps the lists left a deleted row in the file"
    lists = [change(resource(f"r{i}", entity=A, version=3, supports=("q",), contradicts=["p"])) for i in range(edited)]
    apply(x, lists, lambda e: True)
    assert x.store.db.execute("SELECT DISTINCT supports, contradicts, version FROM resources").fetchall() == \
        [(["q"], ["p"], 3)]


@pytest.mark.parametrize("count", [1, 100, 300])
def test_an_upsert_deleted_in_its_own_batch_leaves_the_row_the_writer_remembers(open_state, tmp_path, count):
    """Review: the writer remembered the upsert a later delete of the same batch discarded, while the file kept the
    older row (or none, for a new resource). The next batch judged lists from that memory: an edit repeating the
    discarded lists left the older lists stored, and an edit of a resource created and deleted in one batch updated
    no row and was lost. Such an upsert is now written and then made a tombstone, as the writer remembers it."""
    ids = [f"r{i}" for i in range(count)]
    x = open_state("x")
    apply(x, [change(resource(i, version=1, supports=("a",))) for i in ids], only(A))
    apply(x, [c for i in ids for c in (change(resource(i, version=2, supports=("b",))),
                                       change(("source-changes", {**resource(i)[1], "op": "delete"})))], only(A))
    apply(x, [change(resource(i, version=3, supports=("b",), content="again")) for i in ids], only(A))
    assert x.store.db.execute("SELECT DISTINCT version, supports, content, deleted FROM resources").fetchall() == \
        [(3, ["b"], "again", False)]

    new = [f"n{i}" for i in range(count)]
    apply(x, [c for i in new for c in (change(resource(i, version=1)),
                                       change(("source-changes", {**resource(i)[1], "op": "delete"})))], only(A))
    assert x.store.db.execute("SELECT count(*) FROM resources WHERE id LIKE 'n%' AND deleted AND version = 1"
                              ).fetchone() == (count,), "a tombstone holds the deleted version as a fence"
    apply(x, [change(resource(i, version=2)) for i in new], only(A))
    assert x.store.db.execute("SELECT count(*) FROM resources WHERE id LIKE 'n%' AND NOT deleted AND version = 2"
                              ).fetchone() == (count,), "an edit of a resource created and deleted in a batch was lost"


@pytest.mark.parametrize("stored_first", [False, True])
def test_a_column_left_out_is_not_filled_from_an_upsert_deleted_earlier_in_the_batch(open_state, stored_first):
    """Review: an upsert deleted later in its batch is kept to be written as a tombstone; an upsert after the delete
    that left a column out (Debezium's unchanged TOASTed value) took that column from the deleted record. As when the
    changes come in batches of their own, nothing live is left to fill it from: dead-lettered, the tombstone kept."""
    from dataclasses import replace as with_fields

    x = open_state("x")
    if stored_first:
        apply(x, [change(resource("r", version=1, content="first"))], only(A))
    left_out = change(resource("r", version=3, content="__unavailable"))
    left_out = with_fields(left_out, unavailable=(("content", "content"),))
    out = apply(x, [change(resource("r", version=2, content="secret")),
                    change(("source-changes", {**resource("r")[1], "op": "delete"})), left_out], only(A))
    assert isinstance(out[2], InvalidEvent) and out[2].error_class == "unavailable_value"
    assert x.store.db.execute("SELECT version, content, deleted FROM resources").fetchall() == [(2, "secret", True)]
