"""Revocations and principal upserts reach one state whatever order and batching they are read in."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.records import Principal, Revocation, SourceChange
from state.local_state import LocalState

T = datetime(2026, 8, 30, 9, 0, tzinfo=timezone.utc)
ROLES = ("credit_analyst", "auditor", "approver")
PIDS = ("maya", "omar")


@st.composite
def histories(draw):
    """Upserts (distinct versions per principal) and revocations, each with an event time, in one order."""
    events = []
    for pid in PIDS:
        versions = draw(st.lists(st.integers(1, 9), unique=True, max_size=4))
        for version in versions:
            roles = tuple(draw(st.lists(st.sampled_from(ROLES), unique=True, max_size=3)))
            at = T + timedelta(minutes=draw(st.integers(-5, 5)))
            events.append((SourceChange("principal", "upsert", pid, Principal(pid, roles, {}, version)), at))
    for _ in range(draw(st.integers(0, 5))):
        pid, role = draw(st.sampled_from(PIDS)), draw(st.sampled_from(ROLES))
        effective = T + timedelta(minutes=draw(st.integers(-5, 5)))
        as_of = draw(st.one_of(st.none(), st.integers(1, 9)))
        events.append((Revocation(pid, "role", role, effective, "iam", as_of), effective))
    order = draw(st.permutations(range(len(events))))
    cuts = sorted(draw(st.lists(st.integers(0, len(events)), max_size=3)))
    return events, [events[i] for i in order], cuts


def _applied(path, events, cuts) -> dict:
    state = LocalState.open(path)
    try:
        bounds = [0, *cuts, len(events)]
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            if hi > lo:
                with state.store.transaction():
                    state.catalog.apply_identities([e for e, _ in events[lo:hi]], [t for _, t in events[lo:hi]])
        return {pid: p.roles for pid, p in state.catalog.principals_many(list(PIDS)).items()}
    finally:
        state.close()


def _expected(events) -> dict:
    """The rule stated once, without the store: the highest version's roles less what withdraws from it."""
    out = {}
    for pid in PIDS:
        records = [(e.record.delegation_version, e.record.roles, t) for e, t in events
                   if isinstance(e, SourceChange) and e.record_id == pid]
        if not records:
            continue
        version, roles, made = max(records)
        gone = set()
        for e, _ in events:
            if isinstance(e, Revocation) and e.principal == pid:
                latest = max(r.effective_at for r, _ in events if isinstance(r, Revocation)
                             and (r.principal, r.value) == (pid, e.value))
                named = [r.delegation_version for r, _ in events if isinstance(r, Revocation)
                         and (r.principal, r.value) == (pid, e.value) and r.delegation_version is not None]
                if made <= latest or (named and version <= max(named)):
                    gone.add(e.value)
        out[pid] = tuple(r for r in roles if r not in gone)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(histories())
def test_any_interleaving_and_batching_reaches_the_same_principals(tmp_path_factory, history):
    events, shuffled, cuts = history
    root = tmp_path_factory.mktemp("order")
    in_order = _applied(root / "a.duckdb", events, [])
    assert _applied(root / "b.duckdb", shuffled, cuts) == in_order
    assert in_order == _expected(events)


@pytest.mark.parametrize("first", ["revocation", "upsert"])
def test_the_issue_case_holds_in_both_orders(tmp_path, first):
    """Version 4 made at 09:00 still lists the role; the role is revoked at 09:05 with no version."""
    upsert = (SourceChange("principal", "upsert", "maya", Principal("maya", ("credit_analyst",), {}, 4)),
              T)
    revoke = (Revocation("maya", "role", "credit_analyst", T + timedelta(minutes=5), "iam"), T + timedelta(minutes=5))
    base = (SourceChange("principal", "upsert", "maya", Principal("maya", ("credit_analyst",), {}, 3)),
            T - timedelta(hours=1))
    events = [base, revoke, upsert] if first == "revocation" else [base, upsert, revoke]
    assert _applied(tmp_path / "s.duckdb", events, [1, 2]) == {"maya": ()}
