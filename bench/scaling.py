"""1, 2 and 4 workers on one workload: events/s, CPU and state per worker, kill -9 of one of 2, a shard's restore."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Callable

import aiohttp

from bench import shard_restore, state_size
from bench.scale_out import cluster, cores, ratios, refresh, settle, takeover, throughput, warm
from bench.workload import Workload, bulk

Progress = Callable[[str], None]


def pinning(workers: list[int], available: int) -> str:
    """How the runs were placed on cores, in a sentence for the report."""
    def said(counts: list[int]) -> str:
        names = [str(n) for n in counts]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"

    fits = [n for n in workers if n <= available]
    over = [n for n in workers if n > available]
    text = (f"{said(fits)} worker(s) ran pinned, each worker to a core of its own (this machine has {available} "
            "core(s), which the broker and the bench share)." if fits else "")
    if over:
        text += (f" {said(over)} workers cannot each be pinned on {available} core(s): they ran unpinned, sharing "
                 "the cores with each other, the broker and the bench, so their events/s says what this machine "
                 "gives, not what the design scales to.")
    return text.strip()


def scaling(runs: dict[str, dict], replicated_bytes: int | None, replicated_used: int | None = None,
            replicated_cpu: float | None = None) -> dict[str, dict]:
    """Each run against the 1-worker run: events/s, CPU and state bytes of every worker, and issue 28's bound
    (on the files' bytes, and on the bytes in blocks in use: `replicated_used` is the replicated part's).

    `replicated_cpu`, what the replicated part of the change stream cost a lone worker timed alone (the
    /healthz polls left out), gives `cpu_estimate_vs_1`: that share plus 1/N of the rest, what each of N
    would spend if the part did not split at all and the rest split evenly. An estimate, not a bound:
    timed alone, those events carry whole batches' fixed costs, which a mixed stream's batches share.
    """
    one = runs["1"]
    single_cpu = one["per_worker"][0].get("cpu_seconds")
    single_unwatched = one["per_worker"][0].get("cpu_seconds_unwatched")
    single_bytes = one["per_worker"][0].get("state_bytes")
    single_used = one["per_worker"][0].get("state_used_bytes")
    out = {}
    for n, run in runs.items():
        cpu = [p.get("cpu_seconds") for p in run["per_worker"]]
        unwatched = [p.get("cpu_seconds_unwatched") for p in run["per_worker"]]
        stored = [p.get("state_bytes") for p in run["per_worker"]]
        cap = state_size.bound(single_bytes, replicated_bytes, run["workers"])
        used = [p.get("state_used_bytes") for p in run["per_worker"]]
        used_cap = state_size.bound(single_used, replicated_used, run["workers"])
        out[n] = {"workers": run["workers"], "pinned": run["pinned"],
                  "events_per_second_vs_1": _ratio(run["events_per_second"], one["events_per_second"]),
                  "cpu_seconds_vs_1": [_ratio(c, single_cpu) for c in cpu],
                  "cpu_busiest_vs_1": _ratio(max(cpu) if None not in cpu else None, single_cpu),
                  # The same less what the bench's /healthz polls cost each worker (see `scale_out.throughput`).
                  "cpu_unwatched_vs_1": [_ratio(c, single_unwatched) for c in unwatched],
                  "cpu_busiest_unwatched_vs_1": _ratio(max(unwatched) if None not in unwatched else None,
                                                       single_unwatched),
                  "state_bytes_vs_1": [_ratio(b, single_bytes) for b in stored],
                  "state_largest_vs_1": _ratio(max(stored) if None not in stored else None, single_bytes),
                  "state_bound_bytes": cap and round(cap), "state_bound_vs_1": _ratio(cap, single_bytes),
                  "state_used_largest_vs_1": _ratio(max(used) if None not in used else None, single_used),
                  "state_used_bound_vs_1": _ratio(used_cap, single_used),
                  "cpu_estimate_vs_1": cpu_estimate(replicated_cpu, single_unwatched, run["workers"])}
    return out


def cpu_estimate(replicated: float | None, single: float | None, workers: int) -> float | None:
    """Each of `workers`' share of one worker's CPU, were the replicated part not to split and the rest to split."""
    if replicated is None or not single:
        return None
    share = min(1.0, replicated / single)
    return round(share + (1 - share) / workers, 3)


def _ratio(value, base) -> float | None:
    return None if value is None or not base else round(value / base, 3)


async def _run(bootstrap: str, workload: Workload, directory: Path, http: aiohttp.ClientSession, n: int, *,
               kill: bool, takeover_timeout: float, session_timeout: float, say: Progress) -> tuple[dict, dict | None]:
    """One cluster of `n`: warm, the change stream, a clean stop for its files' sizes; with `kill`, a restart and
    the kill -9 of one of them."""
    workers = await cluster(bootstrap, directory, http, n, FRESHPLAN_SESSION_TIMEOUT=f"{session_timeout:g}")
    try:
        say(f"{n} worker(s): warming {len(workload.requests)} plans over {len(workload.catalog):,} catalog events, "
            f"then the same {len(workload.changes):,} events")
        keys = await warm(workers, workload)
        run = dict(await throughput(workers, workload.changes, pin=True), partitions=workers[0].settings.partitions)
        await state_size.stop_all(workers)
        for p, w in zip(run["per_worker"], workers, strict=True):
            p["state"] = state_size.state_bytes(w)
            p["state_bytes"] = p["state"]["bytes"]
            p["state_used_bytes"] = p["state"]["used_bytes"]
        taken = None
        if kill:
            say(f"{n} workers: restarted on their files, then kill -9 of one right after edits that change every plan")
            await asyncio.gather(*(w.restart() for w in workers))
            await settle(workers)
            keys = await refresh(workers, workload)
            taken = dict(await takeover(workers[0], workers[1], workload, keys, takeover_timeout),
                         session_timeout=session_timeout, standby_replicas=0)
        return run, taken
    finally:
        await state_size.stop_all(workers)


async def _standby_kill(bootstrap: str, workload: Workload, directory: Path, http: aiohttp.ClientSession, *,
                        takeover_timeout: float, session_timeout: float, say: Progress) -> dict:
    """The kill -9 of one of 2 workers that each keep a warm standby copy of the other's partitions."""
    workers = await cluster(bootstrap, directory, http, 2, FRESHPLAN_SESSION_TIMEOUT=f"{session_timeout:g}",
                            FRESHPLAN_STANDBY_REPLICAS="1")
    try:
        say("2 workers with FRESHPLAN_STANDBY_REPLICAS=1: warmed, restarted on their files, then kill -9 of one")
        await warm(workers, workload)
        await state_size.stop_all(workers)
        await asyncio.gather(*(w.restart() for w in workers))
        await settle(workers)
        keys = await refresh(workers, workload)
        return dict(await takeover(workers[0], workers[1], workload, keys, takeover_timeout),
                    session_timeout=session_timeout, standby_replicas=1)
    finally:
        await state_size.stop_all(workers)


async def measure(bootstrap: str, workload: Workload, directory: Path, *, workers: tuple[int, ...] = (1, 2, 4),
                  bulk_resources: int, restore_resources: int, takeover_timeout: float, session_timeout: float,
                  say: Progress) -> dict:
    """Every size of cluster on `workload` plus `bulk_resources` resources of entities no plan is about.

    Each cluster has topics of its own and gets the same records in the same order. The 2-worker
    cluster is then restarted and one of it killed with SIGKILL. A lone worker fed the input
    without entity resources gives the replicated part of a worker's file; the restore of a
    `restore_resources` shard is measured where workers report shards.
    """
    if 1 not in workers:
        raise ValueError("the scale figures are ratios to 1 worker: include 1 in `workers`")
    started = time.perf_counter()
    scaled = Workload(workload.catalog + bulk(bulk_resources), workload.requests, workload.changes)
    available = len(cores())
    say(pinning(list(workers), available))
    runs: dict[str, dict] = {}
    taken = None
    async with aiohttp.ClientSession() as http:
        for n in workers:
            runs[str(n)], kill_run = await _run(bootstrap, scaled, directory / f"workers-{n}", http, n, kill=n == 2,
                                                takeover_timeout=takeover_timeout, session_timeout=session_timeout,
                                                say=say)
            taken = kill_run or taken
        taken_standby = await _standby_kill(bootstrap, scaled, directory / "standby", http,
                                            takeover_timeout=takeover_timeout, session_timeout=session_timeout,
                                            say=say) if 2 in workers else None
        say("replicated part: one worker fed the same input without the resources of entities")
        replicated = await state_size.replicated_part(bootstrap, scaled, directory / "replicated", http,
                                                      FRESHPLAN_SESSION_TIMEOUT=f"{session_timeout:g}")
        sharded = any(p.get("shard") is not None for run in runs.values() for p in run["per_worker"])
        if sharded:
            restore = await shard_restore.measure(bootstrap, directory / "restore", http, restore_resources, say,
                                                  FRESHPLAN_SESSION_TIMEOUT=f"{session_timeout:g}")
        else:
            say(f"restore of a {restore_resources:,}-resource shard: {shard_restore.NOT_MEASURABLE}")
            restore = shard_restore.not_measurable(restore_resources)
    return {"workload": {"events": len(scaled.changes), "plans": len(scaled.requests),
                         "catalog_events": len(scaled.catalog), "bulk_resources": bulk_resources,
                         "partitions": next(iter(runs.values()))["partitions"]},
            "cores": available, "pinning": pinning(list(workers), available), "sharded": sharded,
            "runs": runs, "scaling": scaling(runs, replicated["bytes"], replicated["used_bytes"],
                                             replicated.get("cpu_seconds_unwatched")),
            "ratios": ratios(runs["1"], runs["2"]) if "2" in runs else {},
            "replicated": replicated, "takeover": taken, "takeover_standby": taken_standby, "restore": restore,
            "seconds": round(time.perf_counter() - started, 1)}
