"""Principal and entity rows with unchanged TOASTed columns keep the stored values, through Debezium and DuckDB."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import orjson
import pytest

from compiler import dependency_keys as dk
from schemas.cdc_mapping import parse
from schemas.codec import decode
from schemas.debezium import UNAVAILABLE
from schemas.errors import InvalidEvent
from schemas.records import Revocation
from state.local_state import LocalState

MAPPING = parse(orjson.dumps({"tables": {
    "iam.users": {"kind": "principal", "fields": {"id": "user_id", "roles": "roles", "attributes": "attrs",
                                                  "delegation_version": "dv"}, "types": {"attrs": "json"}},
    "crm.companies": {"kind": "entity", "fields": {"id": "company_id", "aliases": "names"}}}}).decode())
T = datetime(2026, 8, 30, 9, 0, tzinfo=timezone.utc)
M = timedelta(minutes=1)
_lsn = iter(range(100, 10_000))


def user(op: str, at: datetime, **row) -> tuple:
    """A Debezium envelope of iam.users (schemas off), decoded as the worker decodes it; with its event time."""
    source = {"connector": "postgresql", "db": "app", "schema": "iam", "table": "users", "lsn": next(_lsn),
              "txId": 1, "ts_ms": int(at.timestamp() * 1000)}
    body = {"user_id": "maya", "roles": ["credit_analyst"], "attrs": '{"unit": "credit"}', "dv": 3} | row
    value = {"op": op, "ts_ms": 1, "source": source, "before": body if op == "d" else None,
             "after": None if op == "d" else body}
    event = decode("source-changes", None, orjson.dumps(value), cdc=MAPPING)
    return event.payload, event.occurred_at


def company(*, names=("Acme Corp",)) -> tuple:
    source = {"connector": "postgresql", "db": "app", "schema": "crm", "table": "companies", "lsn": next(_lsn),
              "txId": 2, "ts_ms": int(T.timestamp() * 1000)}
    value = {"op": "u", "ts_ms": 1, "source": source, "after": {"company_id": "E1", "names": list(names)}}
    event = decode("source-changes", None, orjson.dumps(value), cdc=MAPPING)
    return event.payload, event.occurred_at


@pytest.fixture
def state(tmp_path):
    opened = LocalState.open(tmp_path / "state.duckdb")
    yield opened
    opened.close()


def apply(state: LocalState, *changes: tuple) -> list:
    with state.store.transaction():
        return state.catalog.apply_identities([c for c, _ in changes], [t for _, t in changes])


def stored(state: LocalState, table: str = "principals") -> list[tuple]:
    return state.store.db.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()


def maya(state: LocalState) -> tuple:
    """maya's stored roles, attributes and delegation version (before any revocation is applied to them)."""
    roles, attributes, version = state.store.db.execute(
        "SELECT roles, attributes, delegation_version FROM principals WHERE id = 'maya'").fetchone()
    return roles, orjson.loads(attributes), version


def test_unavailable_roles_keep_the_stored_roles_and_take_the_rest_of_the_row(state):
    apply(state, user("c", T, roles=["credit_analyst", "auditor"]))
    change, at = user("u", T + M, roles=[UNAVAILABLE], attrs='{"unit": "risk"}', dv=4)
    assert change.unavailable == (("roles", "roles"),)
    assert apply(state, (change, at))[0] is not None
    assert maya(state) == (["credit_analyst", "auditor"], {"unit": "risk"}, 4)
    assert UNAVAILABLE not in repr(stored(state))


def test_unavailable_attributes_keep_the_stored_attributes(state):
    apply(state, user("c", T, attrs='{"unit": "credit", "desk": "d1"}'))
    apply(state, user("u", T + M, attrs=UNAVAILABLE, roles=["auditor"], dv=4))
    assert maya(state) == (["auditor"], {"unit": "credit", "desk": "d1"}, 4)
    assert UNAVAILABLE not in repr(stored(state))


def test_an_unavailable_value_with_no_stored_principal_is_dead_lettered_and_stores_nothing(state):
    [result] = apply(state, user("u", T, roles=[UNAVAILABLE]))
    assert isinstance(result, InvalidEvent) and result.error_class == "unavailable_value"
    assert "column roles" in result.message and "REPLICA IDENTITY FULL" in result.message
    assert stored(state) == []
    with pytest.raises(InvalidEvent, match="column roles"):  # one change at a time raises it
        with state.store.transaction():
            state.catalog.apply_source_change(*user("u", T, roles=[UNAVAILABLE]))


def test_an_older_row_with_an_unavailable_value_is_ignored_as_a_whole_row_is(state):
    apply(state, user("c", T + M, roles=["auditor"], dv=5))
    before = stored(state)
    assert apply(state, user("u", T, roles=[UNAVAILABLE], dv=4)) == [None]  # a lower version
    assert apply(state, user("u", T, attrs=UNAVAILABLE, dv=5)) == [None]    # equal version, made earlier
    assert stored(state) == before


def _principals_after(tmp_path, name: str, changes: list[tuple]) -> list[tuple]:
    other = LocalState.open(tmp_path / f"{name}.duckdb")
    try:
        apply(other, *changes)
        return stored(other)
    finally:
        other.close()


def test_over_a_delete_a_refused_row_raises_the_tombstone_version_as_a_whole_row_does(state, tmp_path):
    """Only a refused row's version and time are read, so its missing roles change nothing."""
    apply(state, user("c", T, dv=3), user("d", T + 5 * M))
    assert apply(state, user("u", T + M, roles=[UNAVAILABLE], dv=7)) == [None]  # made before the delete
    whole = _principals_after(tmp_path, "whole", [user("c", T, dv=3), user("d", T + 5 * M), user("u", T + M, dv=7)])
    assert stored(state) == whole and whole[0][3] == 7 and whole[0][4] is True
    # Made after the delete and higher: it would bring maya back, with nothing to fill its roles from.
    [result] = apply(state, user("u", T + 9 * M, roles=[UNAVAILABLE], dv=8))
    assert isinstance(result, InvalidEvent) and result.error_class == "unavailable_value"
    assert stored(state) == whole


def test_a_kept_role_is_revoked_or_regranted_by_the_row_time_as_a_whole_row_is(tmp_path):
    """The row is the whole row the source holds: its time, not the stored record's, meets the revocation rule."""
    revoke = (Revocation("maya", "role", "credit_analyst", T + 5 * M, "iam"), T + 5 * M)
    for made, granted in ((T + 2 * M, False), (T + 9 * M, True)):
        case = LocalState.open(tmp_path / f"case-{made.minute}.duckdb")
        try:
            apply(case, user("c", T), revoke)
            assert case.catalog.principal("maya").roles == ()
            apply(case, user("u", made, roles=[UNAVAILABLE], dv=4))
            assert ("credit_analyst" in case.catalog.principal("maya").roles) is granted
            whole = _principals_after(tmp_path, f"whole-{made.minute}", [user("c", T), revoke, user("u", made, dv=4)])
            assert stored(case) == whole
        finally:
            case.close()


def test_an_unavailable_delegation_version_keeps_the_stored_one_and_needs_a_live_record(state):
    apply(state, user("c", T, dv=6))
    apply(state, user("u", T + M, dv=UNAVAILABLE, roles=["auditor"]))
    assert maya(state) == (["auditor"], {"unit": "credit"}, 6)
    apply(state, user("d", T + 2 * M))
    before = stored(state)
    [result] = apply(state, user("u", T + M, dv=UNAVAILABLE))  # its version is unknown: not even refusable
    assert isinstance(result, InvalidEvent) and result.error_class == "unavailable_value"
    assert stored(state) == before


def test_in_bulk_as_one_by_one(state, tmp_path):
    changes = [user("u", T, roles=[UNAVAILABLE]), user("c", T + M), user("u", T + 2 * M, roles=[UNAVAILABLE], dv=4),
               company(), company(names=[UNAVAILABLE])]
    together = apply(state, *changes)
    single = LocalState.open(tmp_path / "single.duckdb")
    try:
        one_by_one = [apply(single, change)[0] for change in changes]
        assert [type(r) for r in together] == [type(r) for r in one_by_one]
        assert [r for r in together if not isinstance(r, InvalidEvent)] == [
            r for r in one_by_one if not isinstance(r, InvalidEvent)]
        assert stored(state) == stored(single) and stored(state, "entities") == stored(single, "entities")
    finally:
        single.close()


def test_unavailable_aliases_keep_the_stored_aliases(state):
    [result] = apply(state, company(names=[UNAVAILABLE]))
    assert isinstance(result, InvalidEvent) and "column names" in result.message
    assert stored(state, "entities") == []
    apply(state, company(names=["Acme Corp", "ACME"]))
    keys = apply(state, company(names=[UNAVAILABLE]))[0]
    assert stored(state, "entities") == [("E1", ["Acme Corp", "ACME"], False)]
    assert dk.alias("acme corp") in keys and dk.alias(UNAVAILABLE) not in keys
    assert list(state.catalog.entity_matches("acme")) == ["E1"]
