"""A worker merging what its own router sent before reading it back: the same records, once, in order, resumable."""

from __future__ import annotations

import random
from dataclasses import dataclass

import orjson
import pytest
from aiokafka import TopicPartition

from agents.stream.lane_merge import LaneMerge
from agents.stream.lane_reader import LaneReader
from agents.stream.raw_message import RawMessage
from agents.stream.router import Lane, Router
from schemas.codec import decode
from schemas.plan_partition import plan_partition
from schemas.routed_batch import RECORD, Frame, RoutedBatch, pack, unpack
from tests.agents.test_lane_merge import _source, apply_released, held_truth

P = 3


def _rec(offset: int) -> Frame:
    return Frame(RECORD, offset, None, b"k", b"v%d" % offset)


def test_a_batch_merged_as_sent_is_released_at_once_and_skipped_when_read_back():
    merge = LaneMerge(P, {}, held=[1])
    merge.add("shared-changes", 0, 0, RoutedBatch(0, 0, 2, ()))
    merge.add("entity-changes", 1, 0, RoutedBatch(0, 0, 2, ()))
    assert merge.feed("shared-changes", 0, 1, RoutedBatch(0, 2, 4, ()))
    assert merge.feed("entity-changes", 1, 1, RoutedBatch(0, 2, 4, (_rec(3),)))
    assert [m.offset for m in merge.release().messages] == [3]
    merge.add("entity-changes", 1, 1, RoutedBatch(0, 2, 4, (_rec(3),)))  # read back
    merge.add("shared-changes", 0, 1, RoutedBatch(0, 2, 4, ()))
    out = merge.release()
    assert out.messages == []
    assert out.positions[("entity-changes", 1)] == 2 and out.positions[("source-changes", 0)] == 4


def test_a_batch_merged_as_sent_is_passed_over_unread_when_read_back_and_the_next_one_is_read():
    @dataclass
    class Read:  # the fields of a consumed record the reader uses
        offset: int
        value: bytes
        key: bytes | None = None
        timestamp: int | None = None
        headers: tuple = ()

    reader = LaneReader(P, lambda: frozenset({1}))
    reader.start({}, {})
    lane = TopicPartition("x-entity-changes", 1)
    logical = {"x-entity-changes": "entity-changes", "x-shared-changes": "shared-changes"}
    reader.fetched({lane: [Read(0, pack(RoutedBatch(0, 0, 2, ())))],
                    TopicPartition("x-shared-changes", 0): [Read(0, pack(RoutedBatch(0, 0, 2, ())))]}, logical)
    assert [m.offset for m in reader.sent([("entity-changes", 1, 1, RoutedBatch(0, 2, 4, (_rec(3),))),
                                           ("shared-changes", 0, 1, RoutedBatch(0, 2, 4, ()))]).messages] == [3]
    # Read back, carrier 1 is passed over unread: its bytes are not even a routed batch here, and no error counts.
    out = reader.fetched({lane: [Read(1, b"not unpacked"), Read(2, pack(RoutedBatch(0, 4, 6, (_rec(5),))))],
                          TopicPartition("x-shared-changes", 0): [Read(1, b"not unpacked either"),
                                                                    Read(2, pack(RoutedBatch(0, 4, 6, ())))]}, logical)
    assert [m.offset for m in out.messages] == [5]
    assert (reader.passed_fed, reader.errors) == (2, 0)
    # A record at a carrier that was not fed is still read, and refused when it is no routed batch.
    reader.fetched({lane: [Read(3, b"poison")]}, logical)
    assert (reader.passed_fed, reader.errors) == (2, 1)


def test_a_batch_is_not_merged_as_sent_before_the_lane_brought_what_lies_below_it():
    merge = LaneMerge(P, {}, held=[1])
    # Another router's batch of partition 0 (offsets 0-1) is on the lane at carrier 0, unread.
    assert not merge.feed("entity-changes", 1, 1, RoutedBatch(0, 2, 4, (_rec(3),)))
    assert not merge.feed("entity-changes", 2, 0, RoutedBatch(0, 0, 4, (_rec(3),)))  # a lane not read here


def test_a_lane_fed_ahead_resumes_at_its_first_carrier_not_read():
    # Carrier 0 (another source partition's router) is unread when carrier 1 is fed and released: a restart
    # must read the lane from carrier 0, or that batch would never be merged.
    merge = LaneMerge(P, {}, held=[1])
    merge.add("shared-changes", 1, 0, RoutedBatch(1, 0, 2, ()))
    assert merge.feed("shared-changes", 1, 1, RoutedBatch(1, 2, 3, ()))
    assert merge.feed("entity-changes", 1, 1, RoutedBatch(1, 0, 5, (_rec(2), _rec(4))))  # offset 4 stays open
    out = merge.release()
    assert [m.offset for m in out.messages] == [2]
    assert out.positions[("entity-changes", 1)] == 0


def _own_ids(p: int, records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Each source partition's resources apart (resource ids are per partition, as a keyed source makes them)."""
    out = []
    for key, value in records:
        doc = orjson.loads(value)
        if doc["kind"] == "resource":
            doc["resource"]["id"] = f"p{p}-{doc['resource']['id']}"
        out.append((key, orjson.dumps(doc)))
    return out


@pytest.mark.parametrize("seed", range(16))
def test_merging_own_batches_as_sent_applies_what_reading_them_back_would(seed):
    # Routers of every source partition write the lanes interleaved; this worker routes some partitions and
    # merges those batches as they are acknowledged, while its reader lags the lanes by a random amount.
    rng = random.Random(7000 + seed)
    source = {p: _own_ids(p, _source(rng, 60)) for p in range(P)}
    held = set(rng.sample(range(P), 2))
    routes_here = set(rng.sample(range(P), rng.randint(1, P)))
    decode_ = lambda m: decode(m.topic, m.key, m.value)  # noqa: E731
    routers = {p: Router(P, decode_) for p in range(P)}
    lanes: dict[Lane, list[bytes]] = {}
    read = {}
    merge, applied, stored = LaneMerge(P, {}, held=held), [], {}
    at = {p: 0 for p in range(P)}

    def reads(lane: Lane) -> bool:
        return lane.topic == "shared-changes" or lane.partition in held

    def read_some(everything: bool = False) -> None:
        for lane in [lane for lane in lanes if reads(lane)]:
            upto = len(lanes[lane]) if everything else rng.randint(read.get(lane, 0), len(lanes[lane]))
            for carrier in range(read.get(lane, 0), upto):
                if not merge.fed_already(lane.topic, lane.partition, carrier):  # as the reader passes it over
                    merge.add(lane.topic, lane.partition, carrier, unpack(lanes[lane][carrier]))
            read[lane] = max(read.get(lane, 0), upto)

    def release() -> None:
        out = merge.release().messages
        applied.extend(out)
        apply_released(stored, out, held)

    while any(at[p] < len(source[p]) for p in range(P)):
        p = rng.choice([p for p in range(P) if at[p] < len(source[p])])
        if rng.random() < 0.08:
            # The partition changes hands: its new router starts from the group's offset, maybe behind.
            routers[p] = Router(P, decode_)
            routes_here ^= {p}
            at[p] = max(0, at[p] - rng.randint(0, 5))
        start = at[p]
        span = [RawMessage("source-changes", p, o, *source[p][o])
                for o in range(start, min(start + rng.randint(1, 6), len(source[p])))]
        if rng.random() < 0.1:
            routers[p] = Router(P, decode_)  # a router restarted
        sent = []
        for lane, batch in routers[p].route(p, span, start, start + len(span)).items():
            lanes.setdefault(lane, []).append(pack(batch))
            sent.append((lane, len(lanes[lane]) - 1, batch))
        if p in routes_here:
            for lane, carrier, batch in sent:
                merge.feed(lane.topic, lane.partition, carrier, batch)
        if rng.random() < 0.1:  # routed again from the group's offset: the span comes twice
            continue
        at[p] += len(span)
        if rng.random() < 0.4:
            read_some()
        if rng.random() < 0.5:
            release()
    read_some(everything=True)
    release()
    out = merge.release()
    assert out.positions == {**{("source-changes", p): len(source[p]) for p in range(P)},
                             **{(lane.topic, lane.partition): len(c) for lane, c in lanes.items() if reads(lane)}}
    records = [(m.partition, m.offset) for m in applied if not m.notice]
    assert len(records) == len(set(records)), "a record was applied twice"
    for p in range(P):
        mine = [o for (q, o) in records if q == p]
        assert mine == sorted(mine)
        required, deletes = [], []
        for o, (_, value) in enumerate(source[p]):
            doc = orjson.loads(value)
            if doc["op"] == "delete":
                deletes.append(o)
            elif doc["kind"] != "resource" or plan_partition(doc["resource"]["entity"], P) in held:
                required.append(o)
        assert set(required) <= set(mine) <= set(required) | set(deletes)
    # Resource ids are per source partition, so the partitions' orders never meet.
    assert stored == held_truth([r for p in range(P) for r in source[p]], held)
