"""A restart after a long absence: the plans peers recompiled for the partitions a worker keeps, until it is ready."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import orjson

from bench.takeover import PARTITIONS, _node, clones, compiled_record

KEPT = (0, 1)
"""Partitions the worker owned before it stopped and is given again (the other two are a peer's throughout)."""
TARGET_SECONDS = 3.0
"""Issue 29's target: ready within 3 s of opening the file, with 20,000 such plans parked."""
FEED_BATCH = 500  # records per transaction, as the plan feed reads them (`PlanFeed._settle`)
IDLE_CHECK = 1.0  # seconds between the worker's idle checkpoint checks (`checkpoint_when_idle`)


def measure(plans: int = 20_000, repeats: int = 3, changed_share: float = 0.1, stale_share: float = 0.01,
            keys_per_plan: int = 40) -> dict:
    """Median seconds from opening a stopped worker's file to its first assignment followed, over `repeats` restarts.

    Before it stopped the worker owned `plans` plans of its kept partitions; meanwhile a peer
    recompiled every one (new plan ids naming the old ones as replaced; `changed_share` of them
    with a dependency key changed, `stale_share` made stale by an applied event the peer never
    announced). Each restart opens a copy of the stopped file, parks the peer's records as the
    feed does (batches of 500, with the worker's idle checkpoint at most once a second),
    then follows the assignment of the same partitions: ready is open + follow. Beside it, the
    same restart taking the records over through `Ownership.adopt` (the path before: each record
    read into Python and prepared again). `lost`: a kept head or stale plan not announced (must be 0).
    """
    with tempfile.TemporaryDirectory(prefix="fpbench-restart-") as tmp:
        stopped, peers, stale = _stopped_worker(Path(tmp), plans, changed_share, stale_share, keys_per_plan)
        runs = {how: [_restart(Path(tmp), stopped, peers, stale, how) for _ in range(repeats)]
                for how in ("where_they_lie", "as_records")}
    out = {"plans": plans, "repeats": repeats, "partitions_kept": list(KEPT), "in_process": True,
           "changed_share": changed_share, "stale": len(stale), "target_seconds": TARGET_SECONDS}
    for how, results in runs.items():
        last = results[-1]
        out[how] = {key: round(statistics.median(r[key] for r in results), 3)
                    for key in ("open_seconds", "feed_seconds", "follow_seconds", "ready_seconds")}
        out[how].update({k: last[k] for k in ("announced", "lost", "heads_current", "queued", "wal_mb_at_follow")})
    ours, before = out["where_they_lie"]["ready_seconds"], out["as_records"]["ready_seconds"]
    out["ready_seconds"] = ours
    out["lost"] = max(out[how]["lost"] for how in runs)
    out["ratio_to_target"] = round(ours / TARGET_SECONDS, 2)
    out["ratio_as_records_vs_where_they_lie"] = round(before / ours, 2) if ours else None
    return out


def _stopped_worker(tmp: Path, plans: int, changed_share: float, stale_share: float,
                    keys_per_plan: int) -> tuple[Path, list[dict], set[str]]:
    """The stopped worker's file (its plans current and indexed), the peer's records of them, the stale ids."""
    record = compiled_record(tmp / "owner.duckdb")
    state, _, _, parked, ownership = _node(tmp / "stopped.duckdb")
    try:
        old = clones(record, plans, set(KEPT), keys_per_plan)
        with state.store.transaction():
            parked.park(old)
            ownership.change(KEPT)  # its plans, current and indexed when it stopped
        changed_every = max(1, round(1 / changed_share)) if changed_share else 0
        stale_every = max(1, round(1 / stale_share)) if stale_share else 0
        peers, stale = [], set()
        for i, r in enumerate(old):
            deps = r["dependencies"]
            if changed_every and i % changed_every == 0:
                deps = [*deps[:-1], f"resource:{r['entity_id']}-since"]
            if stale_every and i % stale_every == 0:
                deps = [*deps, f"resource:{r['entity_id']}-changed"]
                stale.add(f"{r['plan_id']}-b")
            peers.append(dict(r, plan_id=f"{r['plan_id']}-b", replaces=r["plan_id"], dependencies=deps))
        [(topic, by_partition)] = list(record["compiled_as_of"].items())[:1]
        partition, next_offset = next(iter(by_partition.items()))
        with state.store.transaction():  # the events the peer applied (every replica applies them) and never announced
            state.key_changes.record({(topic, int(partition), int(next_offset)): [
                f"resource:{r['entity_id']}-changed" for r in old[::stale_every]] if stale_every else []})
    finally:
        state.close()  # a clean stop: checkpointed, no log to replay
    return tmp / "stopped.duckdb", peers, stale


def _restart(tmp: Path, stopped: Path, peers: list[dict], stale: set[str], how: str) -> dict:
    path = tmp / "restarted.duckdb"
    shutil.copy(stopped, path)
    started = time.perf_counter()
    state, _, _, parked, ownership = _node(path)
    try:
        opened = time.perf_counter() - started
        fed = checked = time.perf_counter()
        for lo in range(0, len(peers), FEED_BATCH):
            with state.store.transaction():
                parked.park(peers[lo:lo + FEED_BATCH])  # nothing owned yet: the feed only parks
            if time.perf_counter() - checked >= IDLE_CHECK:
                state.store.checkpoints.when_idle()
                checked = time.perf_counter()
        fed = time.perf_counter() - fed
        wal = state.store.checkpoints.wal_bytes()
        old_heads = set(state.plans.head_ids([p["plan_key"] for p in peers]).values())
        follow = time.perf_counter()
        if how == "where_they_lie":
            ownership.follow(KEPT)
        else:
            with state.store.transaction():
                _as_records(state, parked, ownership)
        follow = time.perf_counter() - follow
        announced = {orjson.loads(v)["plan_id"] for _, t, _, v in state.outbox.pending(10 * len(peers) + 1000)
                     if t == "plan-invalidations" and v}
        heads = state.plans.head_ids([p["plan_key"] for p in peers])
        return {"open_seconds": opened, "feed_seconds": fed, "follow_seconds": follow, "ready_seconds": opened + follow,
                "announced": len(announced), "lost": len((old_heads | stale) - announced),
                "heads_current": sum(heads.get(p["plan_key"]) == p["plan_id"] for p in peers),
                "queued": state.queue.size(), "wal_mb_at_follow": round(wal / 2**20, 1)}
    finally:
        state.close()


def _as_records(state, parked, ownership) -> None:
    """The baseline: as `Ownership.follow` of kept partitions did, every unknown record adopted as a record."""
    ownership.hand_back(frozenset(range(PARTITIONS)) - set(KEPT))
    ownership.owned = frozenset(KEPT)
    records = parked.records(KEPT)
    known = state.plans.known([r["plan_id"] for r in records])
    records = [r for r in records if r["plan_id"] not in known]
    now = state.store.now()
    heads = state.plans.heads_stamped(sorted({r["plan_key"] for r in records}))
    # Announced first, its fresh heads are invalidated: adopting then makes every record current.
    ownership._announce_orphans([(key, head[0]) for key, head in heads.items() if head[2] == "fresh"], now)
    ownership.adopt(records, KEPT, parked={r["plan_id"] for r in records})

