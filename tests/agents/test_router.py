"""Routing a span of source-changes: each record's lanes, move notices, and the framing receivers read back."""

from __future__ import annotations

import orjson
import pytest

from agents.stream.raw_message import RawMessage
from agents.stream.router import Lane, Router
from schemas.routed_batch import SHARED
from schemas.codec import decode
from schemas.errors import InvalidEvent
from schemas.plan_partition import plan_partition
from schemas.routed_batch import NOTICE, RECORD, TOMBSTONE, Frame, RoutedBatch, pack, unpack
from tests.events import envelope, principal, resource

P = 4


def _router() -> Router:
    return Router(P, lambda m: decode(m.topic, m.key, m.value, position=f"{m.partition}:{m.offset}"))


def _msg(offset: int, event: tuple[str, dict] | None, key: bytes | None = b"k") -> RawMessage:
    value = None if event is None else orjson.dumps(event[1])
    return RawMessage("source-changes", 0, offset, key, value, 1_700_000_000.5)


def _delete(rid: str) -> tuple[str, dict]:
    return "source-changes", envelope(kind="resource", op="delete", resource={"id": rid})


def _entities_in_distinct_lanes() -> tuple[str, str]:
    names = [f"E{i}" for i in range(50)]
    first = names[0]
    return first, next(n for n in names if plan_partition(n, P) != plan_partition(first, P))


def test_a_resource_goes_to_its_entitys_lane_and_the_first_time_is_named_in_every_other_lane():
    router = _router()
    entity, _ = _entities_in_distinct_lanes()
    lane = plan_partition(entity, P)
    batches = router.route(0, [_msg(5, resource("r1", entity=entity))], 5, 6)
    assert set(batches) == {Lane("entity-changes", q) for q in range(P)} | {Lane("shared-changes", 0)}
    assert all(b.start == 5 and b.end == 6 for b in batches.values())
    assert [f.kind for f in batches[Lane("entity-changes", lane)].frames] == [RECORD]
    for q in [*(q for q in range(P) if q != lane)]:
        assert [(f.kind, f.value) for f in batches[Lane("entity-changes", q)].frames] == [(NOTICE, b"r1")]
    assert [(f.kind, f.value) for f in batches[Lane("shared-changes", 0)].frames] == [(NOTICE, b"r1")]


def test_a_known_resource_in_the_same_lane_goes_there_alone_and_a_move_names_only_the_lane_it_left():
    router = _router()
    a, b = _entities_in_distinct_lanes()
    router.route(0, [_msg(1, resource("r1", entity=a))], 1, 2)
    again = router.route(0, [_msg(2, resource("r1", entity=a, version=2))], 2, 3)
    assert sum(len(x.frames) for x in again.values()) == 1
    moved = router.route(0, [_msg(3, resource("r1", entity=b, version=3))], 3, 4)
    assert [f.kind for f in moved[Lane("entity-changes", plan_partition(b, P))].frames] == [RECORD]
    assert [(f.kind, f.value) for f in moved[Lane("entity-changes", plan_partition(a, P))].frames] == [(NOTICE, b"r1")]
    assert sum(len(x.frames) for x in moved.values()) == 2


def test_principals_unreadable_records_and_deletes_of_unknown_resources_go_to_the_shared_lane():
    router = _router()
    batches = router.route(0, [_msg(0, principal("p1")), _msg(1, None), _msg(2, ("source-changes", {"x": 1})),
                               _msg(3, _delete("nobody-knows"))], 0, 4)
    shared = batches[Lane("shared-changes", 0)].frames
    assert [(f.offset, f.kind) for f in shared] == [(0, RECORD), (1, TOMBSTONE), (2, RECORD), (3, RECORD)]
    # A tombstone deletes the resource its key names: like the unknown delete it reaches every entity
    # lane too, and whichever held it removes it.
    for q in range(P):
        assert [f.offset for f in batches[Lane("entity-changes", q)].frames] == [1, 3]


def test_a_delete_of_a_known_resource_goes_to_its_lane_only():
    router = _router()
    entity, _ = _entities_in_distinct_lanes()
    router.route(0, [_msg(0, resource("r1", entity=entity))], 0, 1)
    batches = router.route(0, [_msg(1, _delete("r1"))], 1, 2)
    assert [f.offset for f in batches[Lane("entity-changes", plan_partition(entity, P))].frames] == [1]
    assert sum(len(x.frames) for x in batches.values()) == 1


def test_a_routed_batch_reads_back_as_framed():
    batch = RoutedBatch(3, 10, 20, (Frame(RECORD, 10, 1_700_000_000_500, b"k", b"{}"),
                                    Frame(TOMBSTONE, 12, None, b"k2", None),
                                    Frame(RECORD, 18, 5, None, b""),
                                    Frame(NOTICE, 19, 5, None, b"r1")))
    assert unpack(pack(batch)) == batch
    assert unpack(pack(RoutedBatch(0, 7, 7, ()))) == RoutedBatch(0, 7, 7, ())


@pytest.mark.parametrize("data", [b"", b"\x01\x00", pack(RoutedBatch(0, 5, 3, ())),
                                  b"\x02" + pack(RoutedBatch(0, 0, 1, ()))[1:],
                                  pack(RoutedBatch(0, 0, 5, (Frame(RECORD, 7, None, b"k", b"v"),))),
                                  pack(RoutedBatch(0, 0, 5, (Frame(RECORD, 1, None, b"k", b"v"),
                                                             Frame(RECORD, 1, None, b"k", b"v")))),
                                  pack(RoutedBatch(0, 0, 5, (Frame(RECORD, 1, None, b"k", b"value"),)))[:-2]])
def test_anything_else_on_a_lane_is_an_invalid_event(data):
    with pytest.raises(InvalidEvent):
        unpack(data)


def test_every_lane_gets_a_batch_even_with_nothing_for_it():
    batches = _router().route(2, [], 40, 41)
    assert len(batches) == P + 1 and all(b.frames == () and b.end == 41 for b in batches.values())
    assert Lane("shared-changes", 2) in batches and SHARED == -1


def test_a_batch_too_large_for_one_record_is_split_into_contiguous_spans_and_a_record_too_large_is_cut():
    from schemas.routed_batch import OVERSIZED, split
    router = Router(P, lambda m: decode(m.topic, m.key, m.value), max_bytes=2_000)
    big = _msg(2, principal("p1"))
    huge = RawMessage("source-changes", 0, 3, b"k", b"{" + b" " * 5_000 + b"}")
    batches = router.route(0, [_msg(0, principal("p0")), _msg(1, principal("p2")), big, huge], 0, 4)
    shared = batches[Lane("shared-changes", 0)]
    assert shared.frames[-1].kind == OVERSIZED and len(shared.frames[-1].value) <= 2_000
    parts = split(shared, 700)
    assert len(parts) > 1 and parts[0].start == 0 and parts[-1].end == 4
    assert all(a.end == b.start for a, b in zip(parts, parts[1:], strict=False))
    assert [f for p in parts for f in p.frames] == list(shared.frames)
    assert all(len(pack(p)) <= 700 or len(p.frames) == 1 for p in parts)


def test_a_gap_in_a_partitions_offsets_forgets_what_the_router_knew_of_it():
    router = _router()
    entity, _ = _entities_in_distinct_lanes()
    router.route(0, [_msg(0, resource("r1", entity=entity))], 0, 1)
    assert sum(len(b.frames) for b in router.route(0, [_msg(1, resource("r1", entity=entity))], 1, 2).values()) == 1
    # Routed again from an earlier offset (a new duty owner's start, or this one's after a hand-back): notices again.
    again = router.route(0, [_msg(1, resource("r1", entity=entity))], 1, 2)
    assert sum(len(b.frames) for b in again.values()) == P + 1
