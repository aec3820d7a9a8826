"""The apply path's cost per batch: coalesced recompilations and a constant number of DuckDB statements."""

from __future__ import annotations

import itertools

import duckdb
import orjson
import pytest

import agents.plans.plan_writer as plan_writer_module
from agents.plans.backlog import recompile_queued
import state.store as store_module
from agents.stream.event_apply import EventApplier
from agents.stream.raw_message import RawMessage
from agents.plans.plan_writer import PlanWriter
from agents.web.query import QueryService
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from tests.events import envelope, principal, resource, revoke_role, tick

_offsets = itertools.count()


def raw(topic: str, event: dict) -> RawMessage:
    return RawMessage(topic, 0, next(_offsets), b"k", orjson.dumps(event))


class CountingConnection:
    """A DuckDB connection that counts the statements run through it."""

    def __init__(self, db: duckdb.DuckDBPyConnection) -> None:
        self._db = db
        self.statements = 0

    def execute(self, *args, **kwargs):
        self.statements += 1
        return self._db.execute(*args, **kwargs)

    def executemany(self, *args, **kwargs):
        self.statements += 1
        return self._db.executemany(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._db, name)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    connections: list[CountingConnection] = []
    real = duckdb.connect

    def connect(*args, **kwargs):
        connections.append(CountingConnection(real(*args, **kwargs)))
        return connections[-1]

    monkeypatch.setattr(store_module.duckdb, "connect", connect)
    state = LocalState.open(tmp_path / "f.duckdb")
    inv = EventApplier(state, PlanWriter(state, lambda name: f"x-{name}"))
    inv.apply([raw(item["topic"], item["event"]) for item in
               map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines())])
    yield state, inv, QueryService(state, inv.plans), connections[0]
    state.close()


def compiled_docs(monkeypatch) -> list[dict]:
    """Every request handed to the batch compiler from now on."""
    seen: list[dict] = []
    real = plan_writer_module.compile_many

    def counting(docs, view, now, *shared):
        seen.extend(docs)
        return real(docs, view, now, *shared)

    monkeypatch.setattr(plan_writer_module, "compile_many", counting)
    return seen


def test_a_hot_entity_changing_100_times_in_one_batch_costs_one_recompile(setup, monkeypatch):
    state, inv, query, _ = setup
    plan = query.select(ATLAS_REQUEST)
    docs = compiled_docs(monkeypatch)
    before = state.store.counters().get("compilations", 0)
    batch = [raw(*resource("approved-waiver-W2", version=v, content=f"Waiver W2, revision {v}."))
             for v in range(1, 101)]
    inv.apply(batch)
    assert docs == []  # announced first: the backlog compiles the successor
    while recompile_queued(inv.plans, 16):
        pass
    assert len(docs) == 1 and docs[0]["entity"] == ATLAS_REQUEST["entity"]
    assert state.store.counters()["compilations"] - before == 1
    announced = [orjson.loads(v) for _, t, _, v in state.outbox.pending() if t == "x-plan-invalidations"]
    assert [a["plan_id"] for a in announced] == [plan["plan_id"]]
    assert announced[0]["cause"]["offset"] == batch[0].offset  # the first change is named as the cause
    assert query.select(ATLAS_REQUEST)["plan_id"] == query.plan_status(plan["plan_id"])["successor_plan_id"]


def _mixed(n: int, start: int) -> list[tuple[str, dict]]:
    """n events of every kind the bench streams: resources, principals, revocations, ticks."""
    out = []
    for i in range(start, start + n):
        out.append(resource(f"note-{i % 7}", version=i, cls="case_note", supports=(), valid_to=None,
                            content=f"Note {i}.", provenance_group="relationship-management"))
        out.append(principal(f"bench-user-{i % 5}", delegation_version=1, desk=f"d{i}"))
        out.append(revoke_role(f"bench-gone-{i % 3}", f"role-{i}"))
        out.append(tick(f"2026-08-30T10:{i // 60 % 60:02d}:{i % 60:02d}Z"))
    out.append(("source-changes", envelope(kind="entity", op="upsert", entity={"id": f"BENCH-{start}",
                                                                                "aliases": [f"b{start}"]})))
    return out


def test_a_batch_costs_a_constant_number_of_statements(setup):
    state, inv, query, db = setup
    query.select(ATLAS_REQUEST)
    # First sight of these ids, then updates (the policy texts are read once); the writer remembers the
    # principals it met, so both measured batches name only principals met here.
    for start in (1000, 1500):
        inv.apply([raw(*e) for e in _mixed(40, start)])

    def statements(events) -> int:
        start = db.statements
        inv.apply([raw(*e) for e in events])
        return db.statements - start

    small, large = statements(_mixed(2, 2000)), statements(_mixed(40, 3000))
    assert large == small, f"{small} statements for 9 events, {large} for 161"


def test_the_last_applied_event_of_each_topic_is_kept_for_operators(setup):
    _, inv, _, _ = setup
    batch = [raw(*resource("approved-waiver-W2", version=v, content=f"Waiver W2, revision {v}."))
             for v in range(200, 203)]
    inv.apply(batch)
    last = inv.last_event["source-changes"]
    assert (last["offset"], last["partition"]) == (batch[-1].offset, 0)
    assert last["event_id"] == orjson.loads(batch[-1].value)["event_id"] and last["applied_at"].endswith("Z")


def test_a_batch_says_whether_it_held_records_on_standby_for_the_partitions_owner(setup):
    state, inv, query, _ = setup
    query.select(ATLAS_REQUEST)
    inv.apply([raw(*resource("approved-waiver-W2"))], standby=True)  # plans' records are never on standby
    assert not inv.held_on_standby and state.outbox.standby_size() == 0 and state.outbox.size() > 0
    broken = RawMessage("source-changes", 0, next(_offsets), b"k", b"not json")
    inv.apply([broken], standby=True)  # its dead letter waits for the owner of its input partition
    assert inv.held_on_standby and state.outbox.standby_size() == 1
    inv.apply([RawMessage("source-changes", 0, next(_offsets), b"k", b"not json")])
    assert not inv.held_on_standby and state.outbox.standby_size() == 1


ONE_EVENT_STATEMENTS = 6
"""What a one-event batch of a resource no plan reads may cost (bench/batch_cost.py, issue 29): its offsets,
the event id's lookup and claim, the row, its key changes and the counters. No index lookup (the writer knows
the keys have no edges), no upserts where the writer knows the rows exist, nothing for empty work."""


def test_a_one_event_batch_runs_a_handful_of_statements(setup):
    state, inv, _, db = setup

    def edit(version: int) -> int:
        start = db.statements
        inv.apply([raw(*resource("bc-0", entity="BENCH-NO-PLANS", version=version, content=f"Edit {version}."))])
        return db.statements - start

    for version in range(1, 4):  # the first edits fill the writer's memo (a new row, its keys, their edges)
        edit(version)
    assert edit(4) <= ONE_EVENT_STATEMENTS
    assert state.store.counters()["applied.source-changes"] > 0
    assert state.store.db.execute("SELECT content FROM resources WHERE id = 'bc-0'").fetchone() == ("Edit 4.",)
    (offset,) = state.key_changes.last_change("resource:bc-0").values()
    assert offset == state.store.next_offsets()["source-changes"][0] - 1
