"""Merging routed lanes back into source order: release only past every lane's mark, once, resumable, restorable."""

from __future__ import annotations

import random

import orjson
import pytest

from agents.stream.lane_merge import LaneMerge
from agents.stream.raw_message import RawMessage
from agents.stream.router import Lane, Router
from schemas.codec import decode
from schemas.plan_partition import plan_partition
from schemas.routed_batch import NOTICE, RECORD, Frame, RoutedBatch, pack, unpack
from tests.events import envelope, principal, resource

P = 3


def _rec(offset: int) -> Frame:
    return Frame(RECORD, offset, None, b"k", b"v%d" % offset)


def test_a_record_waits_until_every_merged_lane_has_passed_it_then_comes_out_in_source_order():
    merge = LaneMerge(P, {}, held=[1])
    merge.add("entity-changes", 1, 0, RoutedBatch(0, 0, 4, (_rec(1), _rec(3))))
    assert merge.release().messages == []  # the shared lane of partition 0 has not passed offset 0 yet
    merge.add("shared-changes", 0, 0, RoutedBatch(0, 0, 2, (_rec(0),)))
    out = merge.release()
    assert [(m.offset, m.lane) for m in out.messages] == [(0, None), (1, 1)]
    assert out.positions[("source-changes", 0)] == 2
    merge.add("shared-changes", 0, 1, RoutedBatch(0, 2, 4, (_rec(2),)))
    out = merge.release()
    assert [(m.offset, m.lane) for m in out.messages] == [(2, None), (3, 1)]
    assert out.positions[("source-changes", 0)] == 4
    assert out.positions[("entity-changes", 1)] == 1 and out.positions[("shared-changes", 0)] == 2


def test_a_batch_read_twice_and_a_record_routed_to_several_lanes_are_released_once():
    merge = LaneMerge(P, {}, held=[0, 2])
    delete = _rec(0)
    for q in (0, 2):
        merge.add("entity-changes", q, 0, RoutedBatch(1, 0, 1, (delete,)))
    merge.add("shared-changes", 1, 0, RoutedBatch(1, 0, 1, (delete,)))
    assert [m.offset for m in merge.release().messages] == [0]
    merge.add("shared-changes", 1, 1, RoutedBatch(1, 0, 1, (delete,)))  # routed again by a new router
    assert merge.release().messages == []


def test_a_restarted_reader_resumes_each_lane_at_its_oldest_batch_not_released_and_loses_nothing():
    merge = LaneMerge(P, {}, held=[2])
    merge.add("entity-changes", 2, 0, RoutedBatch(0, 0, 2, (_rec(1),)))
    merge.add("entity-changes", 2, 1, RoutedBatch(0, 2, 5, (_rec(4),)))
    merge.add("shared-changes", 0, 0, RoutedBatch(0, 0, 3, (_rec(0),)))
    out = merge.release()
    assert [m.offset for m in out.messages] == [0, 1]
    assert out.positions[("entity-changes", 2)] == 1  # the batch holding offset 4 is still open
    again = LaneMerge(P, {0: out.positions[("source-changes", 0)]},
                      resume={k: v for k, v in out.positions.items() if k[0] != "source-changes"}, held=[2])
    again.add("entity-changes", 2, 1, RoutedBatch(0, 2, 5, (_rec(4),)))
    again.add("shared-changes", 0, 1, RoutedBatch(0, 3, 5, ()))
    assert [m.offset for m in again.release().messages] == [4]


def test_a_gained_lane_replays_its_history_below_what_was_applied_then_joins_the_merge():
    merge = LaneMerge(P, {0: 3, 1: 2}, held=[])
    merge.gain(1)
    assert merge.restoring() == {1}
    merge.add("entity-changes", 1, 0, RoutedBatch(0, 0, 4, (_rec(1), _rec(3))))
    out = merge.release()
    assert [m.offset for m in out.history] == [1] and out.messages == []
    assert out.caught_up == frozenset()  # source partition 1: applied up to 2, and no mark of it read on the lane
    merge.add("entity-changes", 1, 1, RoutedBatch(1, 0, 2, ()))
    merge.add("shared-changes", 0, 0, RoutedBatch(0, 3, 4, ()))
    out = merge.release()
    assert out.caught_up == {1}
    assert [m.offset for m in out.messages] == [3]


def _source(rng: random.Random, n: int) -> list[tuple[bytes, bytes]]:
    entities = [f"E{i}" for i in range(6)]
    events = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.2:
            _, doc = principal(f"p{rng.randrange(4)}")
        elif roll < 0.3:
            doc = envelope(kind="resource", op="delete", resource={"id": f"r{rng.randrange(8)}"})
        else:
            _, doc = resource(f"r{rng.randrange(8)}", entity=rng.choice(entities), version=i + 1)
        events.append((b"k%d" % i, orjson.dumps(doc)))
    return events


@pytest.mark.parametrize("seed", range(12))
def test_whatever_the_delivery_order_a_worker_applies_exactly_its_lanes_records_in_source_order(seed):
    rng = random.Random(seed)
    source = {p: _source(rng, 40) for p in range(P)}
    held = set(rng.sample(range(P), 2))
    decode_ = lambda m: decode(m.topic, m.key, m.value)  # noqa: E731
    lanes: dict[Lane, list[bytes]] = {}
    router = Router(P, decode_)
    for p, records in source.items():
        at = 0
        while at < len(records):
            size = rng.randint(1, 7)
            span = [RawMessage("source-changes", p, o, *records[o]) for o in range(at, min(at + size, len(records)))]
            for lane, batch in router.route(p, span, at, at + len(span)).items():
                lanes.setdefault(lane, []).append(pack(batch))
            if rng.random() < 0.2:  # a router restarted: the span again, with what it forgot of lanes
                router = Router(P, decode_)
                for lane, batch in router.route(p, span, at, at + len(span)).items():
                    lanes.setdefault(lane, []).append(pack(batch))
            at += len(span)
    wanted = {lane: records for lane, records in lanes.items()
              if lane.topic == "shared-changes" or lane.partition in held}
    cursors = {lane: 0 for lane in wanted}
    merge, applied = LaneMerge(P, {}, held=held), []
    while any(cursors[lane] < len(wanted[lane]) for lane in wanted):
        lane = rng.choice([lane for lane in wanted if cursors[lane] < len(wanted[lane])])
        merge.add(lane.topic, lane.partition, cursors[lane], unpack(wanted[lane][cursors[lane]]))
        cursors[lane] += 1
        if rng.random() < 0.5:
            applied.extend(merge.release().messages)
    out = merge.release()
    applied.extend(out.messages)
    assert out.positions == {**{("source-changes", p): len(source[p]) for p in range(P)},
                             **{(lane.topic, lane.partition): len(records) for lane, records in wanted.items()}}
    records = [(m.partition, m.offset) for m in applied if not m.notice]
    assert len(records) == len(set(records))
    for p in range(P):
        mine = [o for (q, o) in records if q == p]
        assert mine == sorted(mine)
        required, deletes = [], []
        for o, (_, value) in enumerate(source[p]):
            doc = orjson.loads(value)
            if doc["op"] == "delete":  # where the router knew the resource's lane, only that lane has it
                deletes.append(o)
            elif doc["kind"] != "resource" or plan_partition(doc["resource"]["entity"], P) in held:
                required.append(o)
        assert set(required) <= set(mine) <= set(required) | set(deletes)


def held_truth(records: list[tuple[bytes, bytes]], held: set[int]) -> dict[str, str]:
    """Resource id -> entity the source leaves, for the resources about entities of the `held` partitions."""
    truth: dict[str, str] = {}
    for _, value in records:
        doc = orjson.loads(value)
        if doc["kind"] == "resource":
            if doc["op"] == "delete":
                truth.pop(doc["resource"]["id"], None)
            else:
                truth[doc["resource"]["id"]] = doc["resource"]["entity"]
    return {rid: e for rid, e in truth.items() if plan_partition(e, P) in held}


def apply_released(stored: dict[str, str], messages: list[RawMessage], held: set[int]) -> None:
    """What a worker holding `held` keeps of released records: an upsert stores, a delete removes, a notice
    removes the resource if it is held in the lane it names."""
    for m in messages:
        if m.notice:
            rid = m.value.decode()
            if rid in stored and plan_partition(stored[rid], P) == m.lane:
                del stored[rid]
            continue
        doc = orjson.loads(m.value)
        if doc["kind"] != "resource":
            continue
        if doc["op"] == "delete":
            stored.pop(doc["resource"]["id"], None)
        elif plan_partition(doc["resource"]["entity"], P) in held:
            stored[doc["resource"]["id"]] = doc["resource"]["entity"]


@pytest.mark.parametrize("seed", range(12))
def test_moves_and_deletes_leave_a_worker_holding_exactly_its_lanes_resources(seed):
    # Resources move between entities, are deleted, and come back; routers restart and forget what
    # they routed. Applying what the merge releases (an upsert stores, a delete removes, a notice
    # removes the resource if it is held in the lane it names) must leave what the source says.
    rng = random.Random(1000 + seed)
    records = _source(rng, 120)
    held = set(rng.sample(range(P), 2))
    decode_ = lambda m: decode(m.topic, m.key, m.value)  # noqa: E731
    router, merge, stored = Router(P, decode_), LaneMerge(P, {}, held=held), {}
    carriers: dict[Lane, int] = {}
    at = 0
    while at < len(records):
        span = [RawMessage("source-changes", 0, o, *records[o]) for o in range(at, min(at + rng.randint(1, 9),
                                                                                    len(records)))]
        if rng.random() < 0.15:
            router = Router(P, decode_)
        for lane, batch in router.route(0, span, at, at + len(span)).items():
            if lane.topic == "shared-changes" or lane.partition in held:
                merge.add(lane.topic, lane.partition, carriers.setdefault(lane, 0), unpack(pack(batch)))
                carriers[lane] += 1
        at += len(span)
        apply_released(stored, merge.release().messages, held)
    assert stored == held_truth(records, held)


def test_a_span_routed_again_is_not_history_twice():
    # A gained lane holds a move notice and a later upsert, then the same span again from a restarted
    # router: applied again, the notice would remove what the upsert stored.
    merge = LaneMerge(P, {0: 10}, held=[])
    merge.gain(1)
    notice = Frame(NOTICE, 3, None, None, b"mover")
    merge.add("entity-changes", 1, 0, RoutedBatch(0, 0, 4, (notice,)))
    merge.add("entity-changes", 1, 1, RoutedBatch(0, 4, 6, (_rec(5),)))
    merge.add("entity-changes", 1, 2, RoutedBatch(0, 3, 6, (notice, _rec(5))))
    merge.add("entity-changes", 1, 3, RoutedBatch(0, 6, 10, ()))
    out = merge.release()
    assert [(m.offset, m.notice) for m in out.history] == [(3, True), (5, False)]
