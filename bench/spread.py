"""A spread of plans: each event changes one of many plans (round robin); latency per event by the hot plan's rule."""

from __future__ import annotations

from typing import Iterable, Mapping

from bench.harness import BenchWorker
from bench.stats import Announcement, Published, invalidation_latencies, percentiles, stalls_during
from bench.streaming import Listener, Sent, as_of, send_at_rate, stream_summary
from bench.workload import Record, entity, request, resource

PREFIX = "SPREAD"
"""Entities of the spread's plans: no other plan, and no other stream, is about them."""


def catalog(plans: int) -> list[Record]:
    """One entity per plan with one resource it needs (so an edit of it changes that plan and no other)."""
    out: list[Record] = []
    for i in range(plans):
        out += [entity(f"{PREFIX}{i}", f"spread-e{i}"), resource(f"{PREFIX}{i}-r0", f"{PREFIX}{i}", 1, f"spread-{i}-1")]
    return out


def requests(plans: int) -> list[dict]:
    """One select body per plan, each about its own entity."""
    return [request("u0", f"{PREFIX}{i}") for i in range(plans)]


def edits(plans: int, n: int) -> list[Record]:
    """`n` edits, round robin over the plans' resources, each a new version (so each changes its plan)."""
    return [resource(f"{PREFIX}{k % plans}-r0", f"{PREFIX}{k % plans}", 2 + k // plans, f"spread-c{k}")
            for k in range(n)]


def per_plan_latencies(sent: list[Sent], plan_of: Mapping[str, str], seen: Iterable[Announcement],
                       published: list[tuple[float, dict]], first: Mapping[str, dict]) -> tuple[list[float], int]:
    """Each event's latency until every version of its plan that predates it is announced, and the uncovered count.

    The hot plan's rule (`invalidation_latencies`) applied plan by plan: `plan_of` names the plan
    key each event changed, `first` the version of each cached before the stream, `published`
    (seen at, record) every record read from `plans`. A plan's events share its resource's key,
    so one partition; an event counts wherever it is sent, so a plan spread over two is refused.
    """
    seen = list(seen)
    by_plan: dict[str, list[Sent]] = {}
    for s in sent:
        by_plan.setdefault(plan_of[s.event_id], []).append(s)
    waits: list[float] = []
    uncovered = 0
    for key, sends in by_plan.items():
        partitions = {s.partition for s in sends}
        if len(partitions) != 1:
            raise ValueError(f"plan {key}'s events went to partitions {sorted(partitions)}, not one")
        [partition] = partitions
        versions = [Published(at, doc.get("plan_key", ""), doc.get("plan_id", ""), as_of(doc, partition))
                    for at, doc in published if doc.get("plan_key") == key]
        mine, missed = invalidation_latencies([(s.offset, s.sent_at) for s in sends], seen, versions, key, partition,
                                              (first[key]["plan_id"], as_of(first[key], partition)))
        waits += mine
        uncovered += missed
    return waits, uncovered


async def spread(worker: BenchWorker, plans: int, rate: float, seconds: float) -> dict:
    """Compile `plans` plans, then stream edits over them at `rate` for `seconds`; subscriber-visible latency."""
    token = await worker.publish(catalog(plans))
    first = [await worker.select(body, token) for body in requests(plans)]
    await worker.caught_up(token)
    stream_edits = edits(plans, max(1, int(rate * seconds)))
    plan_of = {f"spread-c{k}": first[k % plans]["plan_key"] for k in range(len(stream_edits))}
    before = await worker.metrics()
    async with Listener(worker, follow_plans=True) as listener:
        stream = await send_at_rate(worker, stream_edits, rate)
        await listener.settle()
    after = await worker.metrics()
    waits, uncovered = per_plan_latencies(stream.sent, plan_of, listener.seen, listener.published,
                                          {doc["plan_key"]: doc for doc in first})
    return dict(percentiles(waits), **stream_summary(stream, rate), rate=rate, plans=plans, uncovered=uncovered,
                loop_stalls=stalls_during(before, after))
