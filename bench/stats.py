"""Pure arithmetic of the subscriber-side benchmarks: percentiles, coverage latency, backlog and lost invalidations."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass(frozen=True)
class Announcement:
    """One record read from `plan-invalidations`, as a subscriber saw it."""

    seen_at: float
    """Wall-clock second the consumer had it in hand."""
    plan_key: str
    """The plan's key (request and entity), stable across successors."""
    topic: str
    """Logical or broker topic of the causing event."""
    partition: int
    """Partition of the causing event."""
    offset: int
    """Offset of the causing event."""
    event_id: str
    """Event id of the causing event."""
    successor: str | None = None
    """The plan that replaces it, if compiled before the announcement."""
    plan_id: str = ""
    """The plan announced invalid."""


@dataclass(frozen=True)
class Published:
    """One plan record read from `plans`: a version of a plan key a subscriber may cache."""

    seen_at: float
    """Wall-clock second the consumer had it in hand."""
    plan_key: str
    """The plan's key."""
    plan_id: str
    """The version's id (an identical recompilation is published again under the same id)."""
    as_of: int
    """Next offset of the watched input partition the version reflects (0 when it names none)."""


def percentiles(values: list[float]) -> dict:
    """p50/p95/p99 and max in milliseconds of values in seconds (None when there is nothing to measure)."""
    if not values:
        return {"count": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else ordered * 99
    return {"count": len(ordered), "p50_ms": round(q[49] * 1000, 2), "p95_ms": round(q[94] * 1000, 2),
            "p99_ms": round(q[98] * 1000, 2), "max_ms": round(ordered[-1] * 1000, 2)}


def named_latencies(sent: Mapping[str, float], seen: Iterable[Announcement]) -> list[float]:
    """Send-to-visible seconds of each sent event that some announcement names as its cause (first one counts)."""
    first: dict[str, float] = {}
    for a in seen:
        if a.event_id in sent and (a.event_id not in first or a.seen_at < first[a.event_id]):
            first[a.event_id] = a.seen_at
    return [first[e] - sent[e] for e in sent if e in first]


def invalidation_latencies(sends: list[tuple[int, float]], seen: Iterable[Announcement],
                           published: Iterable[Published], plan_key: str, partition: int,
                           first: tuple[str, int]) -> tuple[list[float], int]:
    """Latency of each send until a subscriber has heard that every version of the plan it changed is invalid.

    A version published reflecting offsets below `as_of` is stale for every send at or past it;
    it is closed by the first announcement of its id caused on that partition at or past `as_of`
    (an announcement caused elsewhere closes it when seen after the version was). `first` is the
    version cached before the stream (id, `as_of`). A send is covered when every version stale
    for it is closed, at the latest of those closings (0 when all closed before it was sent).
    This holds whether the announcement carries a successor or announces first and the
    successor follows; a send whose plan was already announced, successor not yet compiled, has
    nothing left to hear. Returns the latencies and how many sends a version stayed open for.
    """
    versions = [(first[1], first[0], float("-inf"))]
    versions += [(p.as_of, p.plan_id, p.seen_at) for p in published if p.plan_key == plan_key]
    mine = [a for a in seen if a.plan_key == plan_key]
    closings = []
    for as_of, plan_id, published_at in sorted(versions):
        heard = [a.seen_at for a in mine if a.plan_id == plan_id
                 and (a.offset >= as_of if a.partition == partition else a.seen_at >= published_at)]
        closings.append((as_of, min(heard) if heard else float("inf")))
    waits, uncovered = [], 0
    latest, j = float("-inf"), 0
    for offset, sent_at in sorted(sends):
        while j < len(closings) and closings[j][0] <= offset:
            latest = max(latest, closings[j][1])
            j += 1
        if latest == float("inf"):
            uncovered += 1
        else:
            waits.append(max(0.0, latest - sent_at))
    return waits, uncovered


def successor_latencies(sends: list[tuple[int, float]], published: Iterable[Published],
                        plan_key: str) -> list[float]:
    """Latency of each send until a version of the plan reflecting it is published (none: left out)."""
    marks = sorted((p.as_of, p.seen_at) for p in published if p.plan_key == plan_key)
    suffix, best = [], float("inf")
    for as_of, at in reversed(marks):
        best = min(best, at)
        suffix.append((as_of, best))
    suffix.reverse()
    out, j = [], 0
    for offset, sent_at in sorted(sends):
        while j < len(suffix) and suffix[j][0] <= offset:
            j += 1
        if j < len(suffix):
            out.append(max(0.0, suffix[j][1] - sent_at))
    return out


def unapplied(produced: Mapping[str, Mapping[int, int]], applied: Mapping[str, Mapping]) -> int:
    """Events produced (next offsets per topic and partition) that the worker has not applied yet."""
    total = 0
    for topic, parts in produced.items():
        done = applied.get(topic, {})
        for partition, end in parts.items():
            total += max(0, end - done.get(str(partition), done.get(partition, 0)))
    return total


def backlog_built(lag_at_end: int, rate: float) -> bool:
    """A backlog built when more than 100 ms of the stream was still unapplied as the last event went out."""
    return lag_at_end > max(1.0, rate * 0.1)


def lost_invalidations(expected: Iterable[str], announced: Iterable[str]) -> list[str]:
    """Plan keys an event affected that no announcement on `plan-invalidations` ever named, sorted."""
    return sorted(set(expected) - set(announced))


def owns_all(duty: Mapping[str, Iterable[int]], topics: Iterable[str], partitions: int) -> bool:
    """Whether a worker's duty (input topic -> partitions) covers every partition of every input topic."""
    return all(set(duty.get(t, ())) >= set(range(partitions)) for t in topics)


def split_between(duties: Iterable[Mapping[str, Iterable[int]]], topics: Iterable[str], partitions: int) -> bool:
    """Whether workers' duties (input topic -> partitions) share every partition of every topic out, once each."""
    duties, topics = list(duties), list(topics)
    for topic in topics:
        held = [p for duty in duties for p in duty.get(topic, ())]
        if sorted(held) != list(range(partitions)):
            return False
    return True


def exposition(text: str) -> dict[str, float]:
    """Prometheus exposition text as {series with labels: value}."""
    series = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            series[name] = float(value)
    return series


def histogram_delta(before: Mapping[str, float], after: Mapping[str, float], name: str) -> dict:
    """What a Prometheus histogram (unlabelled) observed between two scrapes: count, mean and bucket bounds in ms.

    `p50_le_ms` / `p99_le_ms` are the upper bounds of the buckets holding those ranks (the
    histogram keeps no finer detail); None where nothing was observed.
    """
    count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
    prefix = f'{name}_bucket{{le="'
    bounds = sorted((float(series[len(prefix):-2]), after[series] - before.get(series, 0.0))
                    for series in after if series.startswith(prefix))

    def rank_bound(share: float) -> float | None:
        for bound, cumulative in bounds:
            if count and cumulative >= share * count:
                return None if bound == float("inf") else round(bound * 1e3, 1)
        return None

    return {"count": int(count), "mean_ms": round(total / count * 1e3, 1) if count else None,
            "p50_le_ms": rank_bound(0.5), "p99_le_ms": rank_bound(0.99)}


def stalls_during(before: Mapping[str, float], after: Mapping[str, float], budget_ms: float = 20.0) -> dict:
    """The worker's loop-probe samples between two scrapes: how many, how many late by more than `budget_ms`,
    and the upper bound (ms) of the bucket holding the latest wake-up (None: beyond the last bound, or none).

    The probe wakes every 10 ms, so each sample over the budget is a stall of the HTTP loop.
    """
    name = "freshplan_loop_stall_seconds"
    count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    prefix = f'{name}_bucket{{le="'
    bounds = sorted((float(series[len(prefix):-2]), after[series] - before.get(series, 0.0))
                    for series in after if series.startswith(prefix))
    within = max((n for bound, n in bounds if bound <= budget_ms / 1e3), default=0.0)
    worst = next((bound for bound, n in bounds if n >= count), None) if count else None
    return {"samples": int(count), "over_budget": int(count - within), "budget_ms": budget_ms,
            "max_le_ms": None if worst is None or worst == float("inf") else round(worst * 1e3, 1)}
