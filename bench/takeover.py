"""Take-over of many parked plans in process: judge, restore, announce and queue, timed end to end."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import orjson

from agents.stream.event_apply import EventApplier, RawMessage
from agents.plans.ownership import Ownership, WholeCatalog
from agents.plans.plan_writer import PlanWriter
from agents.web.peers import Peers
from agents.web.query import QueryService
from bench.workload import generate
from schemas.plan_partition import plan_partition
from state.local_state import LocalState
from state.parked_plans import ParkedPlans

PARTITIONS = 4
KEPT = (0, 1)
"""Partitions the worker owns before the take-over; it gains the others (a peer's after its kill -9)."""


def _node(path: Path) -> tuple[LocalState, PlanWriter, EventApplier, ParkedPlans, Ownership]:
    state = LocalState.open(path)
    with state.store.transaction():
        state.store.record_cluster("bench-cluster")
    plans = PlanWriter(state, lambda name: name)
    parked = ParkedPlans(state.store, PARTITIONS)
    return state, plans, EventApplier(state, plans), parked, Ownership(
        state, plans, state.key_changes, parked, PARTITIONS, "plan-dependencies", WholeCatalog())


def compiled_record(path: Path) -> dict:
    """A real `plan-dependencies` record: the bench catalog applied, one plan compiled by its owner."""
    state, plans, applier, _, ownership = _node(path)
    try:
        workload = generate(plans=1, changes=0)
        offsets: dict[str, int] = {}
        messages = []
        for topic, key, value in workload.catalog:
            offsets[topic] = offsets.get(topic, -1) + 1
            messages.append(RawMessage(topic, 0, offsets[topic], key, value))
        applier.apply(messages)
        with state.store.transaction():
            ownership.change(range(PARTITIONS))
        query = QueryService(state, plans, peers=Peers(foreign_partition=ownership.foreign_partition))
        query.select(workload.requests[0])
        [record] = [orjson.loads(v) for _, t, _, v in state.outbox.pending() if t == "plan-dependencies" and v]
        return record
    finally:
        state.close()


def clones(record: dict, plans: int, gained: set[int], keys_per_plan: int = 0) -> list[dict]:
    """`plans` copies of one record with distinct ids, keys and entities, all in `gained` partitions.

    Each copy depends on the record's keys plus keys of its own entity's resources, padded up
    to `keys_per_plan` (a plan citing more evidence has more edges to restore).
    """
    shared = record["dependencies"]
    own = max(1, keys_per_plan - len(shared))
    out, i = [], 0
    while len(out) < plans:
        entity = f"T{i}"
        i += 1
        if plan_partition(entity, PARTITIONS) not in gained:
            continue
        n = len(out)
        out.append(dict(record, plan_id=f"plan-takeover-{n:07d}", plan_key=f"pk-takeover-{n:07d}", entity_id=entity,
                        dependencies=[*shared, *(f"resource:{entity}-own{j}" for j in range(own))]))
    return out


def measure(plans: int = 100_000, stale_share: float = 0.01, keys_per_plan: int = 40) -> dict:
    """Park `plans` records of partitions a worker gains, change keys of a share of them, time the take-over.

    Staleness comes from recorded key changes at the records' compiled_as_of (an event the
    dead owner never announced). `lost` counts stale plans with no `plan-invalidations` record
    in the outbox afterwards: it must be 0.
    """
    gained = set(range(PARTITIONS)) - set(KEPT)
    with tempfile.TemporaryDirectory(prefix="fpbench-takeover-") as tmp:
        record = compiled_record(Path(tmp) / "owner.duckdb")
        state, _, _, parked, ownership = _node(Path(tmp) / "taker.duckdb")
        try:
            built = time.perf_counter()
            records = clones(record, plans, gained, keys_per_plan)
            stale_every = max(1, round(1 / stale_share)) if stale_share else 0
            affected = {r["plan_id"]: r["dependencies"][-1] for i, r in enumerate(records)
                        if stale_every and i % stale_every == 0}
            [(topic, by_partition)] = list(record["compiled_as_of"].items())[:1]
            partition, next_offset = next(iter(by_partition.items()))
            with state.store.transaction():
                ownership.change(KEPT)
                parked.park(records)
                state.key_changes.record({(topic, int(partition), int(next_offset)): list(affected.values())})
            state.store.db.execute("CHECKPOINT")
            setup = time.perf_counter() - built  # cloning and parking: done as records arrive, off this clock
            edges = sum(len(r["dependencies"]) for r in records)
            del records
            started = time.perf_counter()
            with state.store.transaction():
                taken, _ = ownership.change(range(PARTITIONS))
            seconds = time.perf_counter() - started
            announced = {orjson.loads(v)["plan_id"] for _, t, _, v in state.outbox.pending(10 * plans + 1000)
                         if t == "plan-invalidations" and v}
            heads = state.store.db.execute("SELECT count(*) FROM plan_heads").fetchone()[0]
            return {"plans": plans, "edges": edges, "partitions_gained": sorted(gained),
                    "in_process": True, "seconds": round(seconds, 3), "setup_seconds": round(setup, 2),
                    "phases": dict(taken.phases, commit=round(seconds - taken.seconds, 3)),
                    "adopted": taken.adopted, "announced": len(announced), "stale": len(affected),
                    "queued": state.queue.size(), "plan_heads": heads,
                    "lost": len(set(affected) - announced),
                    "wrongly_announced": len(announced - set(affected))}
        finally:
            state.close()
