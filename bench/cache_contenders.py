"""TTL caches, flush-all and freshplan on the same change stream: stale serves and wasted work."""

from __future__ import annotations

import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from agents.plans.backlog import recompile_queued
from agents.plans.plan_writer import PlanWriter
from agents.stream.event_apply import EventApplier, RawMessage
from agents.web.query import QueryService
from bench.workload import Record, Workload
from compiler.pipeline import compile_request
from state.local_state import LocalState

TTLS = (1.0, 10.0, 60.0)


class _Positions:
    """Hands out per-topic offsets so in-process messages look like consumed ones."""

    def __init__(self) -> None:
        self.next: Counter[str] = Counter()

    def message(self, record: Record) -> RawMessage:
        topic, key, value = record
        offset = self.next[topic]
        self.next[topic] += 1
        return RawMessage(topic, 0, offset, key, value, None)


def run(workload: Workload, *, event_rate: float = 1000.0, reads_per_event: int = 1, seed: int = 11,
        progress: Callable[[int, int], None] | None = None) -> dict:
    """Replay the change stream at `event_rate` (event time) with reads in between; count per contender.

    The oracle is a from-scratch compile against the state after each event. A serve is stale
    when it differs from the oracle. A recompilation is unnecessary when its result equals the
    plan the contender had dropped.
    """
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="fpbench-cache-") as tmp:
        state = LocalState.open(Path(tmp) / "state.duckdb")
        try:
            positions = _Positions()
            inv = EventApplier(state, PlanWriter(state, lambda name: name))
            inv.apply([positions.message(r) for r in workload.catalog])
            query = QueryService(state, inv.plans)
            requests = workload.requests
            truth = {i: query.select(r)["plan_id"] for i, r in enumerate(requests)}
            ttl = {t: {i: (pid, 0.0) for i, pid in truth.items()} for t in TTLS}
            ttl_counts = {t: Counter() for t in TTLS}
            flush: dict[int, str] = dict(truth)
            flush_last = dict(truth)
            flush_counts: Counter[str] = Counter()
            fresh_counts: Counter[str] = Counter()
            before = Counter(state.store.counters())
            compile_seconds = 0.0
            total = len(workload.changes)
            for n, record in enumerate(workload.changes):
                now = (n + 1) / event_rate
                started = time.perf_counter()
                inv.apply([positions.message(record)])
                # The worker's backlog loop: successors of the announced plans, before the next batch.
                while recompile_queued(inv.plans, 16):
                    pass
                compile_seconds += time.perf_counter() - started
                flush.clear()
                for _ in range(reads_per_event):
                    i = rng.randrange(len(requests))
                    oracle = compile_request(requests[i], state.catalog, state.store.now()).plan_id
                    served = query.select(requests[i])
                    fresh_counts["serves"] += 1
                    fresh_counts["stale_serves"] += served["plan_id"] != oracle
                    for t in TTLS:
                        pid, cached_at = ttl[t][i]
                        ttl_counts[t]["serves"] += 1
                        if now - cached_at < t:
                            ttl_counts[t]["stale_serves"] += pid != oracle
                        else:
                            ttl_counts[t]["recompilations"] += 1
                            ttl_counts[t]["unnecessary_recompilations"] += pid == oracle
                            ttl[t][i] = (oracle, now)
                    flush_counts["serves"] += 1
                    if i in flush:
                        flush_counts["stale_serves"] += flush[i] != oracle
                    else:
                        flush_counts["recompilations"] += 1
                        flush_counts["unnecessary_recompilations"] += flush_last[i] == oracle
                        flush[i] = flush_last[i] = oracle
                if progress:
                    progress(n + 1, total)
            after = Counter(state.store.counters())
        finally:
            state.close()
    delta = after - before
    triggered = delta["invalidations"] + delta["unchanged_recompilations"]
    # Identical outcomes: recompiled before announcing (not announced), or announced first and compiled later.
    identical = delta["unchanged_recompilations"] + delta["announced_unchanged"]
    contenders = {f"ttl_{int(t)}s": _summary(ttl_counts[t]) for t in TTLS}
    contenders["flush_all"] = dict(_summary(flush_counts), invalidations=total * len(requests))
    contenders["freshplan"] = {
        "serves": fresh_counts["serves"], "stale_serves": fresh_counts["stale_serves"],
        "recompilations": triggered + query.selects["selects.compiled"] - len(requests),
        "invalidations": delta["invalidations"], "unnecessary_invalidations": delta["announced_unchanged"],
        "identical_recompilations": identical,
        "identical_share_of_triggered": round(identical / triggered, 4) if triggered else 0.0,
        "apply_seconds": round(compile_seconds, 3)}
    return {"events": total, "plans": len(requests), "event_rate": event_rate, "reads_per_event": reads_per_event,
            "contenders": contenders}


def _summary(c: Counter[str]) -> dict:
    rec = c["recompilations"]
    return {"serves": c["serves"], "stale_serves": c["stale_serves"], "recompilations": rec,
            "unnecessary_recompilations": c["unnecessary_recompilations"],
            "unnecessary_share": round(c["unnecessary_recompilations"] / rec, 4) if rec else 0.0}
