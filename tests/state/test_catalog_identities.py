"""Principal, entity and revocation changes in bulk: the same outcome as applying them one by one."""

from __future__ import annotations

import orjson
import pytest

from schemas.codec import decode
from state.local_state import LocalState
from tests.events import envelope, principal, revoke_role


def _events() -> list[tuple[str, dict]]:
    delete = lambda kind, rid: ("source-changes", envelope(kind=kind, op="delete", **{kind: {"id": rid}}))  # noqa: E731
    entity = lambda eid, *aliases: ("source-changes", envelope(  # noqa: E731
        kind="entity", op="upsert", entity={"id": eid, "aliases": list(aliases)}))
    session = lambda pid, value, version=None: ("revocations", envelope(  # noqa: E731
        principal=pid, revoke="session", value=value, effective_at="2026-08-30T09:00:00Z", issued_by="iam",
        **({"delegation_version": version} if version is not None else {})))
    return [
        revoke_role("early", "credit_analyst"),           # before its principal: as of the first version seen
        principal("early", delegation_version=2),
        principal("p", delegation_version=3, sessions=["s1", "s2"]),
        session("p", "s1"),
        principal("p", delegation_version=2),               # older: ignored
        principal("p", delegation_version=3, sessions=["s1", "s2"], desk="d1"),  # read by no policy: no keys
        principal("p", roles=("credit_analyst", "auditor"), delegation_version=3, sessions=["s1", "s2"]),
        session("p", "s1", 5),                              # a repeat raises the version it applies as of
        delete("principal", "p"),
        delete("principal", "p"),                           # deleted already: ignored
        principal("p", delegation_version=1, sessions=["s1"]),
        entity("E1", "Acme Corp"),
        entity("E1", "Acme", "ACME Holdings"),
        delete("entity", "E1"),
        delete("entity", "E1"),
        entity("E1", "Acme again"),
        delete("entity", "nowhere"),
        session("ghost", "s9"),
    ]


def _payloads():
    return [decode(topic, None, orjson.dumps(event)).payload for topic, event in _events()]


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
        together = bulk.catalog.apply_identities(_payloads())
    one_by_one = []
    for payload in _payloads():
        with single.store.transaction():
            one_by_one.append(single.catalog.apply_identities([payload])[0])
    assert together == one_by_one
    assert together[5] == [] and together[4] is None and together[9] is None and together[16] is None
    assert _tables(bulk) == _tables(single)
    assert bulk.catalog.principal("early").roles == ()
    assert bulk.catalog.principal("p").attributes["sessions"] == []  # s1 revoked as of version 5 >= 1


def test_principals_in_bulk_equal_one_at_a_time(two):
    state, _ = two
    with state.store.transaction():
        state.catalog.apply_identities(_payloads())
    ids = ["early", "p", "ghost", "nobody"]
    assert state.catalog.principals_many(ids) == {
        pid: state.catalog.principal(pid) for pid in ids if state.catalog.principal(pid) is not None}
    assert set(state.catalog.principals_many(ids)) == {"early", "p"}


def test_a_revocation_stored_before_its_principal_applies_as_of_the_first_version_seen_later(two):
    state, _ = two
    first = [revoke_role("late", "credit_analyst"), revoke_role("late", "auditor")]
    with state.store.transaction():
        state.catalog.apply_identities([decode(t, None, orjson.dumps(e)).payload for t, e in first])
    later = [principal("late", delegation_version=4), principal("late", delegation_version=6)]
    with state.store.transaction():
        state.catalog.apply_identities([decode(t, None, orjson.dumps(e)).payload for t, e in later])
    versions = state.store.db.execute("SELECT value, delegation_version FROM revoked WHERE principal = 'late' "
                                      "ORDER BY value").fetchall()
    assert versions == [("auditor", 4), ("credit_analyst", 4)]
