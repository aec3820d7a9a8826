"""The spread stream: edits round robin over its plans, each event's latency by the hot plan's rule, plan by plan."""

from __future__ import annotations

import orjson
import pytest

from bench.spread import catalog, edits, per_plan_latencies, requests
from bench.stats import Announcement
from bench.streaming import Sent


def test_each_edit_is_a_new_version_of_one_plans_only_resource_round_robin():
    bodies = [orjson.loads(v) for _, _, v in edits(3, 7)]
    assert [b["resource"]["id"] for b in bodies] == [f"SPREAD{k % 3}-r0" for k in range(7)]
    assert [b["resource"]["version"] for b in bodies] == [2, 2, 2, 3, 3, 3, 4]  # the catalog has version 1
    assert len({b["event_id"] for b in bodies}) == 7
    entities = [orjson.loads(v)["entity"]["id"] for _, _, v in catalog(3) if b'"kind":"entity"' in v]
    assert entities == ["SPREAD0", "SPREAD1", "SPREAD2"] == [r["entity"] for r in requests(3)]


def _doc(plan_id: str, key: str, partition: int, as_of: int) -> dict:
    return {"plan_id": plan_id, "plan_key": key, "compiled_as_of": {"source-changes": {str(partition): as_of}}}


def _heard(at: float, key: str, partition: int, offset: int, plan_id: str) -> Announcement:
    return Announcement(at, key, "source-changes", partition, offset, f"e@{offset}", None, plan_id)


def test_an_event_is_heard_once_every_version_of_its_plan_before_it_is_announced_and_each_plan_apart():
    first = {"pa": _doc("a1", "pa", 0, 5), "pb": _doc("b1", "pb", 1, 3)}
    sent = [Sent("source-changes", 0, 5, "e1", 10.0), Sent("source-changes", 1, 3, "e2", 10.05),
            Sent("source-changes", 0, 7, "e3", 10.1)]
    plan_of = {"e1": "pa", "e2": "pb", "e3": "pa"}
    published = [(10.06, _doc("a2", "pa", 0, 6))]   # a2 reflects e1, not e3
    seen = [_heard(10.03, "pa", 0, 5, "a1"), _heard(10.15, "pa", 0, 7, "a2")]
    waits, uncovered = per_plan_latencies(sent, plan_of, seen, published, first)
    assert [round(w, 3) for w in waits] == [0.03, 0.05]  # e3 waited for a2's announcement too
    assert uncovered == 1                                # nothing ever announced b1: e2 is not counted as heard
    seen.append(_heard(10.2, "pb", 1, 3, "b1"))
    waits, uncovered = per_plan_latencies(sent, plan_of, seen, published, first)
    assert sorted(round(w, 3) for w in waits) == [0.03, 0.05, 0.15] and uncovered == 0
    # An announcement of one plan says nothing of another on the same partition.
    other = [_heard(10.01, "pb", 0, 9, "a1")]
    assert per_plan_latencies(sent[:1], plan_of, other, [], first) == ([], 1)


def test_a_plan_whose_events_went_to_two_partitions_is_refused():
    sent = [Sent("source-changes", 0, 5, "e1", 10.0), Sent("source-changes", 1, 5, "e2", 10.1)]
    with pytest.raises(ValueError, match="partitions"):
        per_plan_latencies(sent, {"e1": "pa", "e2": "pa"}, [], [], {"pa": _doc("a1", "pa", 0, 5)})
