"""Routed lanes at the applier: a move notice removes the resource from the lane it left; a lane's letters go to its
owner."""

from __future__ import annotations

import itertools

import orjson
import pytest

from agents.plans.plan_writer import PlanWriter
from agents.stream.event_apply import EventApplier, RawMessage
from schemas.routed_batch import SHARED
from state.local_state import LocalState
from tests.events import resource

A, B = "ATLAS-IN-01", "BOREAL-UK-02"
LANES = {A: 0, B: 1}
_offsets = itertools.count(1000)


def lane_of(entity: str | None) -> int:
    return SHARED if entity is None else LANES[entity]


@pytest.fixture
def applier(tmp_path):
    state = LocalState.open(tmp_path / "lanes.duckdb")
    yield EventApplier(state, PlanWriter(state, lambda n: f"x-{n}"), lane_of=lane_of,
                       owns_lane=lambda lane: lane == 0)
    state.close()


def upsert(rid: str, entity: str | None, version: int, lane: int | None) -> RawMessage:
    _, doc = resource(rid, entity=entity, version=version)
    return RawMessage("source-changes", 0, next(_offsets), b"k", orjson.dumps(doc), lane=lane)


def notice(rid: str, lane: int | None) -> RawMessage:
    return RawMessage("source-changes", 0, next(_offsets), None, rid.encode(), lane=lane, notice=True)


def stored(applier: EventApplier, rid: str):
    return applier.state.store.db.execute(
        "SELECT entity FROM resources WHERE id = ? AND NOT deleted", [rid]).fetchone()


def test_a_notice_removes_the_resource_from_the_lane_it_left_and_records_where_its_keys_changed(applier):
    applier.apply([upsert("r1", A, 1, 0)])
    gone = notice("r1", 0)
    applier.apply([gone])
    assert stored(applier, "r1") is None
    keys = {k for (k,) in applier.state.store.db.execute(
        "SELECT dep_key FROM key_changes WHERE topic = 'source-changes' AND change_offset = ?", [gone.offset]
    ).fetchall()}
    assert "resource:r1" in keys


def test_a_notice_for_another_lane_or_an_unknown_resource_changes_nothing(applier):
    applier.apply([upsert("r1", A, 1, 0)])
    applier.apply([notice("r1", 1), notice("r1", SHARED), notice("nobody", 0), notice("", 0)])
    assert stored(applier, "r1") == (A,)


def test_within_one_batch_a_notice_is_judged_after_the_changes_before_it(applier):
    # r1 arrives in lane 0 and leaves it again in the same batch: gone; r2 left lane 0 before it came: kept.
    applier.apply([upsert("r1", A, 1, 0), notice("r1", 0), notice("r2", 0), upsert("r2", A, 1, 0)])
    assert stored(applier, "r1") is None and stored(applier, "r2") == (A,)


def test_a_lane_records_letter_is_sent_by_the_lanes_owner_and_kept_for_it_by_a_standby_copy(applier):
    bad = RawMessage("source-changes", 0, next(_offsets), b"k", b"{not json", lane=0)
    copy = RawMessage("source-changes", 0, next(_offsets), b"k", b"{not json", lane=1)
    applier.apply([bad, copy], standby=True)
    rows = applier.state.store.db.execute(
        "SELECT src_offset, standby, lane FROM outbox WHERE topic = 'x-dead-letters' ORDER BY src_offset").fetchall()
    assert rows == [(bad.offset, False, None), (copy.offset, True, 1)]  # kept until a report covers it


def test_notices_of_resources_the_lane_never_held_are_skipped_without_an_event_each(applier, monkeypatch):
    """A resource new to a router is named in every other lane: a catching-up worker reads mostly such notices."""
    import agents.stream.lane_events as lane_events
    made = []
    real = lane_events.moved_away
    monkeypatch.setattr(lane_events, "moved_away", lambda m, now: made.append(m.value) or real(m, now))
    applier.apply([upsert("held", A, 1, 0), upsert("old", A, 1, 0)])
    applier.apply([notice("old", 0)])
    made.clear()
    # Never stored, stored and live, upserted earlier in this batch, deleted before it (a tombstone).
    applier.apply([*[notice(f"new-{i}", 0) for i in range(50)], upsert("fresh", A, 1, 0), notice("fresh", 0),
                   notice("held", 0), notice("old", 0)])
    assert sorted(made) == [b"fresh", b"held"], made
    assert stored(applier, "held") is None and stored(applier, "fresh") is None
    counts = applier.state.store.counters()
    assert counts.get("ignored_old_versions", 0) == 0, counts

