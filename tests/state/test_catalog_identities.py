"""Principal, entity and revocation changes in bulk: the same outcome as applying them one by one."""

from __future__ import annotations

import orjson
import pytest

from schemas.codec import decode
from schemas.records import Principal
from state.catalog_identities import _matters
from state.local_state import LocalState
from tests.events import envelope, principal, regrant, revoke_role


def _events() -> list[tuple[str, dict]]:
    delete = lambda kind, rid: ("source-changes", envelope(kind=kind, op="delete", **{kind: {"id": rid}}))  # noqa: E731
    entity = lambda eid, *aliases: ("source-changes", envelope(  # noqa: E731
        kind="entity", op="upsert", entity={"id": eid, "aliases": list(aliases)}))
    session = lambda pid, value, version=None: ("revocations", envelope(  # noqa: E731
        principal=pid, revoke="session", value=value, effective_at="2026-08-30T09:00:00Z", issued_by="iam",
        **({"delegation_version": version} if version is not None else {})))
    return [
        revoke_role("early", "credit_analyst"),           # before its principal: withdraws from records made before
        principal("early", delegation_version=2),
        principal("p", delegation_version=3, sessions=["s1", "s2"]),
        session("p", "s1"),
        principal("p", delegation_version=2),               # older: ignored
        principal("p", delegation_version=3, sessions=["s1", "s2"], desk="d1"),  # read by no policy: no keys
        principal("p", roles=("credit_analyst", "auditor"), delegation_version=3, sessions=["s1", "s2"]),
        session("p", "s1", 5),                              # a repeat raises the version it applies as of
        delete("principal", "p"),
        delete("principal", "p"),                           # deleted already: ignored
        principal("p", delegation_version=1, sessions=["s1"]),  # below the deleted version: ignored
        regrant("p", 4, sessions=["s1"]),                   # higher and made after the delete: back
        entity("E1", "Acme Corp"),
        entity("E1", "Acme", "ACME Holdings"),
        delete("entity", "E1"),
        delete("entity", "E1"),
        entity("E1", "Acme again"),
        delete("entity", "nowhere"),
        session("ghost", "s9"),
    ]


def _decoded():
    return [decode(topic, None, orjson.dumps(event)) for topic, event in _events()]


def _payloads():
    return [e.payload for e in _decoded()]


def _times():
    return [e.occurred_at for e in _decoded()]


def _tables(state: LocalState) -> dict:
    db = state.store.db
    return {table: db.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
            for table in ("principals", "revoked", "entities")}


@pytest.fixture
def two(tmp_path):
    states = [LocalState.open(tmp_path / f"{n}.duckdb") for n in ("bulk", "single")]
    yield states
    for state in states:
        state.close()


def test_a_batch_in_bulk_equals_the_same_changes_one_by_one(two):
    bulk, single = two
    with bulk.store.transaction():
        together = bulk.catalog.apply_identities(_payloads(), _times())
    one_by_one = []
    for payload, at in zip(_payloads(), _times(), strict=True):
        with single.store.transaction():
            one_by_one.append(single.catalog.apply_identities([payload], [at])[0])
    assert together == one_by_one
    assert together[5] == [] and together[4] is None and together[9] is None and together[10] is None
    assert together[17] is None
    assert _tables(bulk) == _tables(single)
    assert bulk.catalog.principal("early").roles == ()
    assert bulk.catalog.principal("p").attributes["sessions"] == []  # s1 revoked: made at or before its time


@pytest.mark.parametrize("events", [
    [principal("q", roles=("a", "b"), delegation_version=1),
     ("source-changes", envelope(kind="principal", op="delete", principal={"id": "q"}))],   # held, then deleted
    [principal("q", roles=("a",), delegation_version=1), principal("q", roles=(), delegation_version=2, desk="x"),
     regrant("q", 3, desk="y")],                                                        # roles emptied, made_at set
    [principal("q", delegation_version=1), principal("r", delegation_version=1),
     principal("q", delegation_version=2, desk="z"), principal("s", delegation_version=1)],  # held and new in one batch
])
def test_rows_the_file_holds_are_updated_to_what_an_upsert_writes(two, events):
    """Each event in a batch of its own (later ones update rows in place) against all in one batch (upserted)."""
    by_one, together = two
    decoded = [decode(topic, None, orjson.dumps(event)) for topic, event in events]
    new = decode(principal("t")[0], None, orjson.dumps(principal("t")[1]))
    for e in decoded:
        with by_one.store.transaction():
            by_one.catalog.apply_identities([e.payload], [e.occurred_at])
    with by_one.store.transaction():  # a batch of held and new rows
        by_one.catalog.apply_identities([decoded[-1].payload, new.payload], [decoded[-1].occurred_at, None])
    with together.store.transaction():
        together.catalog.apply_identities([e.payload for e in decoded] + [new.payload],
                                          [e.occurred_at for e in decoded] + [None])
    assert _tables(by_one) == _tables(together)


def test_principals_in_bulk_equal_one_at_a_time(two):
    state, _ = two
    with state.store.transaction():
        state.catalog.apply_identities(_payloads(), _times())
    ids = ["early", "p", "ghost", "nobody"]
    assert state.catalog.principals_many(ids) == {
        pid: state.catalog.principal(pid) for pid in ids if state.catalog.principal(pid) is not None}
    assert set(state.catalog.principals_many(ids)) == {"early", "p"}


_READS = 'permit(principal, action, resource) when {{ {} }};'


@pytest.mark.parametrize("before, after, condition, matters", [
    ({"desk": "d1"}, {"desk": "d2"}, 'principal.unit == "x"', False),                 # read by no policy
    ({"unit": "x"}, {"unit": "y"}, 'principal.business_unit == "x"', False),         # another name
    ({"unit": "x"}, {"unit": "y"}, 'principal.unit == "x"', True),
    ({"unit": "x"}, {"unit": "y"}, 'principal.units == "x" && principal.sub_unit == "y"', False),  # inside words
    ({"level!": 1}, {"level!": 2}, 'principal["level!"] == 1', True),               # no word boundary
    ({"é": 1}, {"é": 2}, 'principal["é"] == 1', True),
    ({"unit": "x"}, {"unit": "y"}, 'principal["\\u{75}nit"] == "x"', True),          # spelt by escapes
    ({"a\"b": 1}, {"a\"b": 2}, 'principal["a\\"b"] == 1', True),
    ({"unit": 1}, {"unit": True}, 'principal.unit == true', True),                  # 1 == True in Python only
    ({"unit": 1}, {"unit": 1.0}, 'principal.unit == 1', True),
    ({"x": None}, {}, 'principal.x == 1', False),                                    # Cedar drops nulls
    ({"phone": "1"}, {"phone": 2**63}, 'principal.unit == "x"', True),              # Cedar cannot hold it
])
def test_an_attribute_change_matters_when_a_policy_reads_it_by_any_spelling(before, after, condition, matters):
    old = [["analyst"], orjson.dumps(before).decode(), 3, False]
    new = Principal("p", roles=("analyst",), attributes=after, delegation_version=3)
    assert _matters(old, new, lambda: [_READS.format(condition)]) is matters


def test_whether_an_attribute_matters_follows_the_stored_policies_as_they_change():
    old = [["analyst"], orjson.dumps({"unit": "x"}).decode(), 3, False]
    new = Principal("p", roles=("analyst",), attributes={"unit": "y"}, delegation_version=3)
    texts = [_READS.format('principal.desk == "d"')]
    assert _matters(old, new, lambda: texts) is False
    texts = texts + [_READS.format('principal.unit == "x"')]  # a new bundle version reads it
    assert _matters(old, new, lambda: texts) is True
    assert _matters(old, new, lambda: texts[:1]) is False


def test_an_attribute_nested_deeper_than_cedar_parses_matters_though_no_policy_reads_it():
    deep: object = "x"
    for _ in range(125):
        deep = {"n": deep}
    old = [["analyst"], orjson.dumps({"phone": "1"}).decode(), 3, False]
    new = Principal("p", roles=("analyst",), attributes={"phone": deep}, delegation_version=3)
    assert _matters(old, new, lambda: [_READS.format('principal.unit == "x"')]) is True


def test_rows_remembered_between_batches_answer_as_the_file_does_even_after_a_rollback(two):
    """The writer remembers the principal, revocation and horizon rows it read or wrote (no read for a principal
    met before): batch after batch it must decide exactly as a writer that reads the file every time."""
    remembering, reading = two
    outcomes = {id(remembering): [], id(reading): []}
    for payload, at in zip(_payloads(), _times(), strict=True):
        for state in (remembering, reading):
            if state is reading:
                state.store.forget()
            with state.store.transaction():
                outcomes[id(state)].append(state.catalog.apply_identities([payload], [at])[0])
    assert outcomes[id(remembering)] == outcomes[id(reading)]
    assert _tables(remembering) == _tables(reading)

    raised = decode(*principal("p", delegation_version=9, sessions=["s1"])[:1], None,
                    orjson.dumps(principal("p", delegation_version=9, sessions=["s1"])[1]))
    with pytest.raises(RuntimeError), remembering.store.transaction():
        remembering.catalog.apply_identities([raised.payload], [raised.occurred_at])
        raise RuntimeError("the batch fails after its identities were applied: everything rolls back")
    lower = decode("source-changes", None, orjson.dumps(regrant("p", 5, sessions=["s2"])[1]))
    for state in (remembering, reading):
        with state.store.transaction():
            outcomes[id(state)] = state.catalog.apply_identities([lower.payload], [lower.occurred_at])
    assert outcomes[id(remembering)] == outcomes[id(reading)] != [None], "version 9 was never stored"
    assert _tables(remembering) == _tables(reading)


def test_the_writer_remembers_the_revocations_a_batch_named_not_every_row_of_their_principals(tmp_path):
    """A principal may hold thousands of revocations: remembering all of them for each principal met would hold
    most of the table in memory (the review: 1.6 GB at the bound of 20,000 principals of 200 rows each)."""
    from datetime import datetime, timezone

    from schemas.records import Revocation
    from state.catalog_identities import REVOKED_ROWS

    state = LocalState.open(tmp_path / "s.duckdb")
    try:
        state.store.db.execute("INSERT INTO revoked SELECT 'u' || (i // 100), 'session', 's' || i, "
                               "TIMESTAMPTZ '2026-01-01', 'iam', NULL, NULL FROM range(5000) t(i)")
        at = datetime(2026, 2, 1, tzinfo=timezone.utc)
        again = [Revocation(f"u{i}", "session", f"s{i * 100}", at, "iam") for i in range(50)]  # stored already
        with state.store.transaction():
            state.catalog.apply_identities(again + [Revocation("u0", "session", "new", at, "iam")], [at] * 51)
        assert len(state.store.cached(REVOKED_ROWS, dict)) == 51
        assert state.store.db.execute("SELECT count(*) FROM revoked").fetchone() == (5001,)
        assert state.store.db.execute("SELECT effective_at FROM revoked WHERE value = 's100'").fetchone() == (at,)
    finally:
        state.close()


def test_a_change_of_one_principal_drops_only_that_principal_from_what_the_compiler_remembers(tmp_path):
    """The compiler's remembered principals (roles less revocations) are dropped one by one as they change: a
    stream of principal records would otherwise send every compile back to the file for every principal."""
    state = LocalState.open(tmp_path / "s.duckdb")
    try:
        events = [decode(t, None, orjson.dumps(e)) for t, e in (principal("a", roles=("credit_analyst", "auditor")),
                                                                 principal("b"))]
        with state.store.transaction():
            state.catalog.apply_identities([e.payload for e in events], [e.occurred_at for e in events])
        assert set(state.catalog.principals_many(["a", "b"])) == {"a", "b"}
        withdrawal = decode(*revoke_role("a", "auditor")[:1], None, orjson.dumps(revoke_role("a", "auditor")[1]))
        with state.store.transaction():
            state.catalog.apply_identities([withdrawal.payload], [withdrawal.occurred_at])
        remembered = state.store.cached("catalog.principals", dict)
        assert "a" not in remembered and "b" in remembered
        assert state.catalog.principal("a").roles == ("credit_analyst",)
    finally:
        state.close()


def test_a_held_row_the_update_did_not_find_is_upserted(two, monkeypatch):
    """Should the file not hold a row the writer thinks it does, the batch's rows are upserted, not lost."""
    first, second = two
    for state in two:
        with state.store.transaction():
            state.catalog.apply_identities([decode("source-changes", None, orjson.dumps(principal("q")[1])).payload],
                                           [None])
    monkeypatch.setattr(type(first.store), "update_rows", lambda *args, **kwargs: 0)  # finds nothing
    change = decode("source-changes", None, orjson.dumps(principal("q", delegation_version=4, desk="d")[1]))
    for state in two:
        with state.store.transaction():
            state.catalog.apply_identities([change.payload], [None])
    assert _tables(first) == _tables(second) and first.catalog.principal("q").delegation_version == 4


def test_principal_edits_that_keep_the_roles_update_rows_in_place(two):
    """An edit that keeps a held principal's roles does not set them, so DuckDB updates the row in place (setting a
    list column deletes the row and inserts it again, and the deleted row stays in the file); one that changes
    them still lands, and both files hold what all-in-one-batch upserts write."""
    by_one, together = two
    events = [principal(p, roles=("a", "b"), delegation_version=1) for p in ("q", "r")] + [
        principal("q", roles=("a", "b"), delegation_version=2, desk="x"),
        principal("r", roles=("a", "b"), delegation_version=2, desk="y")]
    size = "SELECT estimated_size FROM duckdb_tables() WHERE table_name = 'principals'"
    decoded = [decode(topic, None, orjson.dumps(event)) for topic, event in events]
    with by_one.store.transaction():
        by_one.catalog.apply_identities([e.payload for e in decoded[:2]], [None, None])
    held = by_one.store.db.execute(size).fetchone()[0]
    with by_one.store.transaction():
        by_one.catalog.apply_identities([e.payload for e in decoded[2:]], [None, None])
    assert by_one.store.db.execute(size).fetchone()[0] == held, "an edit keeping the roles left a deleted row"
    with together.store.transaction():
        together.catalog.apply_identities([e.payload for e in decoded], [None] * 4)
    assert _tables(by_one) == _tables(together)
    regranted = decode("source-changes", None, orjson.dumps(principal("q", roles=("c",), delegation_version=3)[1]))
    for state in two:
        with state.store.transaction():
            state.catalog.apply_identities([regranted.payload], [None])
    assert by_one.catalog.principal("q").roles == ("c",) and _tables(by_one) == _tables(together)
