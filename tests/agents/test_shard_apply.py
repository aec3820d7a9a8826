"""Review: resources partitioned by entity, through the applier (dead letters, restore), no broker."""

from __future__ import annotations

import itertools

import orjson
import pytest

from agents.stream.event_apply import EventApplier, RawMessage
from agents.stream.router import Lane
from schemas.routed_batch import RoutedBatch
from agents.plans.plan_writer import PlanWriter
from state.catalog_resources import drop_resources
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS
from tests.events import policy_version, resource

A, B = "ATLAS-IN-01", "BOREAL-UK-02"
_offsets = itertools.count(1000)


def raw(topic: str, event: dict) -> RawMessage:
    return RawMessage(topic, 0, next(_offsets), b"k", orjson.dumps(event))


def restore(y: EventApplier, messages: list[RawMessage], entity: str, reported: int = 0, late: bool = False) -> int:
    """Restore `entity`'s shard at `y` from lane history: the source records routed to its lane, as a router would."""
    from agents.shards.shard_restore import Shards
    from agents.stream.lane_merge import LaneMerge
    from agents.stream.router import Router
    from schemas.codec import decode
    from schemas.plan_partition import plan_partition
    from schemas.routed_batch import pack, unpack
    from state.shard_state import ShardState

    lane = plan_partition(entity, 2)
    source = [m for m in messages if m.topic == "source-changes"]
    merge = LaneMerge(2, {0: max(m.offset for m in source) + 1})
    merge.gain(lane)
    if not late:  # the old owner's report, read before its history: refusals below it were dead-lettered
        merge.report("entity-changes", lane, 0, reported)
    router = Router(2, lambda m: decode(m.topic, m.key, m.value))
    for carrier, m in enumerate(sorted(source, key=lambda m: m.offset)):
        batch = router.route(0, [m], m.offset, m.offset + 1)[Lane("entity-changes", lane)]
        merge.add("entity-changes", lane, carrier, unpack(pack(batch)))
    merge.add("entity-changes", lane, len(source), RoutedBatch(1, 0, 0, ()))
    history = merge.release().history
    shard = ShardState(y.state.store, 2)
    shard.catching = frozenset({lane})
    shards = Shards(shard, y)
    shards.assigned = frozenset({lane})  # gained as its owner
    restored = shards.restore(history)
    shards.caught_up(frozenset({lane}), {lane: {0: reported}})
    return restored


def only(entity: str):
    return lambda e: e is None or e == entity


def scenario() -> list[RawMessage]:
    return [raw(item["topic"], item["event"]) for item in
            map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines())]


@pytest.fixture
def make(tmp_path):
    opened = []

    def build(name: str, mine) -> EventApplier:
        state = LocalState.open(tmp_path / f"{name}.duckdb")
        opened.append(state)
        return EventApplier(state, PlanWriter(state, lambda n: f"x-{n}"), mine=mine)
    yield build
    for s in opened:
        s.close()


def letters(applier: EventApplier, standby: bool | None = None) -> list[tuple]:
    sql = "SELECT src_offset, standby FROM outbox WHERE topic = 'x-dead-letters'"
    if standby is not None:
        sql += f" AND standby = {str(standby).lower()}"
    return applier.state.store.db.execute(sql + " ORDER BY src_offset").fetchall()


def stored(applier: EventApplier, rid: str):
    return applier.state.store.db.execute(
        "SELECT version, entity FROM resources WHERE id = ? AND NOT deleted", [rid]).fetchone()


# credit-committee may assert approved_waiver and committee_record (the scenario's bundle), not facility_record.
def refused(rid: str, **kw):
    return resource(rid, cls="facility_record", **kw)


def test_a_refused_move_between_shards_is_dead_lettered_once(make):
    """A resource moving from A to B with a class its source may not assert is judged by both
    holders (the old row's and the new entity's), and each sends its letter outright."""
    x, y = make("x", only(A)), make("y", only(B))
    first = resource("mover", entity=A, version=1)
    bad = refused("mover", entity=B, version=2)
    for w in (x, y):  # neither is the duty owner of partition 0 (a third worker is), or one of them: alike
        w.apply(scenario(), standby=True)
        w.apply([raw(*first)], standby=True)
        w.apply([raw(*bad)], standby=True)
    assert stored(x, "mover") == (1, A)
    sent = letters(x, standby=False) + letters(y, standby=False)
    assert len(sent) <= 1, f"one refused event, {len(sent)} dead letters published: {sent}"


def test_a_restored_shard_keeps_what_its_old_owner_accepted_under_the_policy_of_the_time(make):
    """A resource accepted when it was applied (and kept by its old owner, as policy changes never remove
    stored resources) is kept by the restore, though today's source rules refuse it: its owner reported it.
    Without that report the restore judges it as of today (see the tests below)."""
    alone = make("alone", lambda e: True)
    y = make("y", only(B))  # holds B; gains A later
    history = scenario() + [raw(*resource("waiver-W9", entity=A))]
    tightened = raw(*policy_version(2, "2026-08-30T10:00:00Z",
                                    sources={"credit-committee": ["committee_record"]}))
    for w in (alone, y):
        w.apply(history)
        w.apply([tightened])
    assert stored(alone, "waiver-W9") == (1, A)  # one worker keeps it
    restore(y, history, A, reported=history[-1].offset + 1)
    assert stored(y, "waiver-W9") == (1, A), "the restored shard lost a resource its old owner held"


def test_a_refused_resource_applied_while_its_shard_was_between_owners_is_dead_lettered(make):
    """The restore covers offsets up to this file's, which the lane's old owner may never have applied (it was
    killed -9): a refusal no report of that owner covers is dead-lettered by the restore."""
    y = make("y", only(B))
    y.apply(scenario(), standby=True)
    bad = raw(*refused("waiver-bad", entity=A))  # routed to A's lane: never read here until y gains A
    restore(y, scenario() + [bad], A)
    assert [offset for offset, _ in letters(y, standby=False)] == [bad.offset], \
        "a refused resource change of the gained shard was never dead-lettered"


@pytest.mark.parametrize("late", [False, True], ids=["report read first", "report read after the refusal"])
def test_a_refusal_its_old_owner_reported_is_not_dead_lettered_again(make, late):
    y = make("y", only(B))
    y.apply(scenario(), standby=True)
    bad = raw(*refused("waiver-bad", entity=A))
    restore(y, scenario() + [bad], A, reported=bad.offset + 1, late=late)
    assert letters(y) == []


def test_a_shard_gained_after_a_rebase_gets_the_resources_read_again_from_the_new_topic(make):
    """After a rebase (offsets forgotten, event-id ledger kept: "events read again from the new topics are
    applied by id") a gained shard's records read again from its new lane must be applied: another shard's
    events never reached this worker (routed elsewhere), so none may be taken for applied."""
    from agents.shards.shard_restore import Shards
    from schemas.plan_partition import plan_partition
    from state.shard_state import ShardState

    y = make("y", None)
    shard = ShardState(y.state.store, 2)
    y.mine, y.lane_of = shard.mine, shard.lane_of
    shards = Shards(shard, y)
    y.apply(scenario())
    with y.state.store.transaction():
        shards.move({plan_partition(B, 2)})
    event = resource("waiver-W9", entity=A)
    with y.state.store.transaction():  # the input topics were reset and re-published; offsets rebased
        y.state.store.rebase("new-cluster", ["source-changes"])
    shards.gain(frozenset({plan_partition(A, 2)}))  # the group gives y Atlas's partition too
    # The new lane holds the event; read live once the lane joined.
    y.apply([RawMessage("source-changes", 0, 0, b"waiver-W9", orjson.dumps(event[1]), lane=plan_partition(A, 2))])
    shards.caught_up(frozenset({plan_partition(A, 2)}))
    assert shard.held == {0, 1}
    counters = y.state.store.counters()
    assert stored(y, "waiver-W9") == (1, A), f"the gained shard lacks a resource of the re-read lane: {counters}"


def test_a_shard_gained_after_a_rebase_is_reported_incomplete(make):
    """After a rebase the old lanes' history is gone (the catalog was kept, the old owner dropped its shard):
    a shard gained then is counted and reported incomplete."""
    from agents.shards.shard_restore import Shards
    from schemas.plan_partition import plan_partition
    from state.shard_state import ShardState

    y = make("y", None)
    shard = ShardState(y.state.store, 2)
    y.mine = shard.mine
    shards = Shards(shard, y)
    y.apply(scenario())
    with y.state.store.transaction():
        shards.move({plan_partition(B, 2)})  # Atlas's six resources go to the peer
    with y.state.store.transaction():
        y.state.store.rebase("new-cluster", ["source-changes"])
    shards.gain(frozenset({plan_partition(A, 2)}))  # the peer died: y takes Atlas back
    counters = y.state.store.counters()
    assert shards.incomplete == {plan_partition(A, 2)} and counters.get("shard_restores_incomplete") == 1, counters


def test_a_restore_from_the_lane_ends_where_applying_everything_does(make):
    """Moves out, back in and in from elsewhere, a delete: the gained shard equals a lone worker's rows."""
    alone, y = make("alone", lambda e: True), make("y", only(B))
    moves = [resource("r1", entity=A, version=1), resource("r1", entity=B, version=2),
             resource("r1", entity=A, version=3), resource("r2", entity=B, version=1),
             resource("r2", entity=A, version=2), resource("r3", entity=A, version=1),
             resource("r4", entity=B, version=1), resource("r5", entity=A, version=1),
             resource("r5", entity=B, version=2)]
    history = scenario() + [raw(*m) for m in moves]
    history.append(raw("source-changes", {"event_id": "del-r3", "schema_version": 1,
                                          "occurred_at": "2026-08-30T10:00:00Z", "kind": "resource", "op": "delete",
                                          "resource": {"id": "r3"}}))
    for w in (alone, y):
        w.apply(history)
    assert stored(y, "r1") is None and stored(y, "r2") is None  # A's: not held by B's holder
    with y.state.store.transaction():
        drop_resources(y.state.store, [A])  # as `Shards.gain` starts: tombstones of moves into A go
    restore(y, history, A)

    def rows(w):
        return w.state.store.db.execute("SELECT id, version, entity FROM resources WHERE NOT deleted AND entity = ? "
                                        "ORDER BY id", [A]).fetchall()
    assert rows(y) == rows(alone) and {r[0] for r in rows(y)} >= {"r1", "r2"}, (rows(y), rows(alone))
    assert stored(y, "r5") == (2, B)  # moved out of the restored shard: only B's row is live


def test_an_event_id_conflict_only_its_holders_can_see_is_sent_by_the_entity_owner_alone(make, tmp_path):
    """Other shards' upserts are not claimed, so a conflict on one is seen only where the entity is held:
    queued on standby there, it waited for a duty owner that never saw it. Now the owner sends it; a worker
    holding only a standby copy of the partition sends nothing."""
    owner, y = make("owner", only(A)), make("y", only(B))
    state = LocalState.open(tmp_path / "copy.duckdb")
    copy = EventApplier(state, PlanWriter(state, lambda n: f"x-{n}"), mine=only(A), owns=only(None))
    try:
        history = scenario()
        first = raw(*resource("waiver-W9", entity=A))
        clash = dict(orjson.loads(first.value), resource=dict(orjson.loads(first.value)["resource"], version=2,
                                                                content="Other content, same event id."))
        history += [first, raw("source-changes", clash)]
        for w in (owner, y, copy):
            w.apply(history[:-2], standby=True)
            w.apply(history[-2:-1], standby=True)
            w.apply(history[-1:], standby=True)
        conflicts = {name: w.state.store.counters().get("dead_letters.event_id_conflict", 0)
                     for name, w in (("owner", owner), ("y", y), ("copy", copy))}
        assert conflicts == {"owner": 1, "y": 0, "copy": 0}, conflicts
        assert len(letters(owner, standby=False)) == 1 and not letters(owner, standby=True)
        assert not letters(copy) and copy.state.store.counters()["dead_letters_left_to_owner"] == 1
    finally:
        state.close()


def test_a_restore_applies_the_move_notices_of_resources_its_lane_held_and_skips_the_rest(make, monkeypatch):
    """A fresh worker restoring A's lane: r7 came and left for B (its notice removes it), r8 only ever lived in
    B's lane, yet each new resource is named in every other lane: its notice there is skipped without an event."""
    import agents.stream.lane_events as lane_events

    y = make("y", only(A))
    moves = [resource("r7", entity=A, version=1), resource("r7", entity=B, version=2),
             resource("r8", entity=B, version=1), resource("r9", entity=A, version=1)]
    history = scenario() + [raw(*m) for m in moves]
    made: list[str] = []
    real = lane_events.moved_away

    def moved_away(m, now):
        made.append((m.value or b"").decode())
        return real(m, now)

    monkeypatch.setattr(lane_events, "moved_away", moved_away)
    restore(y, history, A)
    assert stored(y, "r7") is None and stored(y, "r9") == (1, A) and stored(y, "r8") is None
    assert "r7" in made and "r8" not in made and "r9" not in made, made
