"""The invalidation path through the broker: events/s against a bare Faust agent, latency beside a relay, fan-out."""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench import faust_relay, relay, spread
from bench.harness import BenchWorker, run_ceiling, start_worker
from bench.stats import named_latencies, percentiles, stalls_during
from bench.scale_out import throughput
from bench.streaming import Listener, hot_plan, selects_under_stream, send_at_rate, stream_summary
from bench.workload import Workload, bundle, generate, quiet, request
from streams.admin import producer
from streams.partitions import discover
from streams.settings import INPUT_TOPICS

Progress = Callable[[str], None]
RELAY_KEYS = 100
"""Keys the relay beside the bench workload spreads its records over (the workload's inputs span every partition)."""
CEILING_RUNS = 3
"""Runs of the bare Faust agent; the median is the ceiling (one run alone moved 11,300-14,000 events/s in a day)."""


async def measure(bootstrap: str, workload: Workload, directory: Path, *, rates: tuple[int, ...],
                  rate_seconds: float, fanout_plans: int, hot_rate: float, select_rates: tuple[int, ...],
                  select_rate: float, session_timeout: float, say: Progress, spread_plans: int = 40,
                  spread_rate: float = 1_000.0) -> dict:
    """Run every broker-side comparison; returns the report section.

    One long-running worker is timed on throughput, selects under a stream and the fan-out; each
    latency stream gets a worker of its own (`_own_worker`). Order matters: the fan-out restarts
    the worker with many cloned plans, so it comes last. The restarted worker waits out the
    group's session timeout before it is assigned partitions.
    """
    # No cap on connections: the selects under a stream are open loop, and aiohttp's default 100 connections held
    # cache hits in this process for up to 0.7 s behind the selects waiting on compiles (the worker answered them
    # within 31 ms), which is no latency of the service.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        worker = await start_worker(bootstrap, directory / "freshplan", http,
                                    FRESHPLAN_SESSION_TIMEOUT=f"{session_timeout:g}")
        try:
            # With the plans the selects under a stream ask besides the workload's (`quiet`), warmed here so that
            # what storing them sets off (their records read back, a checkpoint) is long over by then.
            quiet_catalog, quiet_requests = quiet(max(1, len(workload.requests) // 20))
            say(f"warming {len(workload.requests)} plans, and {len(quiet_requests)} no stream touches")
            token = await worker.publish(workload.catalog + quiet_catalog)
            for body in workload.requests + quiet_requests:
                await worker.select(body, token)
            await worker.caught_up(token)
            say(f"freshplan: applying {len(workload.changes)} events (worker pinned to one core)")
            throughput = await _throughput(worker, workload)
            say(f"ceiling: a bare Faust agent over the same topics, {CEILING_RUNS} runs")
            ceiling = median_run([await run_ceiling(bootstrap, [worker.settings.topic(t) for t in INPUT_TOPICS],
                                                    len(workload.catalog) + len(quiet_catalog) + len(workload.changes),
                                                    directory,
                                                    session_timeout)
                                  for _ in range(CEILING_RUNS)])
            kafka = worker.settings.kafka.client_kwargs()
            fetch_wait = round(worker.settings.batch_window * 1000)

            async def bare_relay(rate: float, keys: int) -> dict:
                # Beside each stream, at its rate: the issue judges the fast path as a ratio to this.
                return await relay.relay(bootstrap, kafka, worker.settings.partitions, rate,
                                         max(1, int(rate * rate_seconds)), 0.0, fetch_wait, keys=keys)

            # Each latency stream runs on a worker of its own, on fresh topics as its relay's are: the embedded
            # broker's fetch costs grow with the records a partition holds (see `_own_worker`), so a stream on
            # topics the earlier runs filled paid a broker cost its relay did not.
            own = functools.partial(_on_own_worker, bootstrap, http, session_timeout)
            latency = await own(directory / "rates", workload,
                                lambda w: _at_rates(w, rates, rate_seconds, bare_relay, say), warm=True)
            # Every other select asks a plan the streams leave fresh (`quiet`): a cache hit under load, timed often
            # enough for a p99; the others ask the workload's plans, which the stream invalidates.
            bodies = [body for pair in zip(itertools.cycle(quiet_requests), workload.requests) for body in pair]
            selects = {}
            for k, rate in enumerate(select_rates):
                say(f"cached selects at {select_rate:g}/s while {rate} events/s apply, for {rate_seconds:g}s")
                records = generate(changes=max(1, int(rate * rate_seconds)), seed=100 + rate, prefix=f"sel{rate}-",
                                   version_base=1_000_000 * (len(rates) + 1 + k)).changes
                selects[str(rate)] = await selects_under_stream(worker, bodies, records, rate, rate_seconds,
                                                                select_rate)
            say(f"{spread_plans}-plan spread at {spread_rate:g} events/s for {rate_seconds:g}s (a worker of its "
                "own), then the bare relay")
            spreading = await own(directory / "spread", workload,
                                  lambda w: spread.spread(w, spread_plans, spread_rate, rate_seconds))
            spreading["relay"] = await bare_relay(spread_rate, spread_plans)
            say(f"hot plan on the Atlas scenario at {hot_rate:g} events/s for {rate_seconds:g}s (a worker of its own)")
            hot = await own(directory / "hot", None, lambda w: hot_plan(w, hot_rate, rate_seconds))
            say("the same hot plan on the long-running worker (its topics hold every record it applied)")
            hot_long = await hot_plan(worker, hot_rate, rate_seconds)
            hot_long["topic_records"] = await _topic_records(worker)
            batch_ms = ((hot.get("worker_stages") or {}).get("batch_apply") or {}).get("mean_ms")
            stages = sorted({0.0, 10.0, 20.0} | ({round(batch_ms, 1)} if batch_ms else set()))
            say(f"bare relay through the same broker at {hot_rate:g} events/s, serial stages of {stages} ms")
            floor = await relay.sweep(bootstrap, kafka, worker.settings.partitions, hot_rate, rate_seconds, stages,
                                      fetch_wait)
            say(f"a bare Faust agent as relay at {hot_rate:g} events/s: Faust's fetch wait, then 10 ms set in code")
            events = max(1, int(hot_rate * rate_seconds))
            faust_hops = [await faust_relay.relay(bootstrap, kafka, hot_rate, events, wait,
                                                  session_timeout=session_timeout) for wait in (None, 10)]
            # Before the fan-out restarts the worker (which starts its figures afresh).
            streamed = await worker.health()
            say(f"fan-out: one policy version over {fanout_plans} plans")
            fanout = await _fanout(worker, fanout_plans)
            health = await worker.health()
        finally:
            worker.stop()
    ratio = throughput["events_per_second"] / ceiling["events_per_second"] if ceiling["events_per_second"] else None
    return {"throughput": {"freshplan": throughput, "ceiling_bare_faust": ceiling,
                           "ratio_to_ceiling": ratio and round(ratio, 4)},
            "latency_by_rate": latency, "selects_under_stream": selects, "quiet_plans": len(quiet_requests),
            "spread": spreading, "hot_plan": hot,
            "hot_plan_long_running": hot_long,
            "fanout": fanout,
            "relay_floor": {"stages": floor, "worker_batch_ms": batch_ms}, "faust_relay": faust_hops,
            "worker_counters": {k: v for k, v in health["counters"].items() if not k.startswith("selects")},
            # Pauses that held the worker's loop during the whole run (the tails above include them).
            "worker_loop_stall_max_seconds": health.get("loop_stall_max_seconds"), "worker_gc": health.get("gc"),
            # A checkpoint stops the writer; one inside the hot-plan stream is its tail (see state/checkpoints.py).
            # As of the end of its hot-plan stream, for the long-running worker.
            "worker_checkpoints": streamed.get("checkpoints")}


def median_run(runs: list[dict]) -> dict:
    """The run of median events/s (an odd count: an actual run), with every run's events/s beside it."""
    ranked = sorted(runs, key=lambda r: r["events_per_second"] or 0)
    return dict(ranked[len(ranked) // 2], runs_events_per_second=[r["events_per_second"] for r in runs])


async def _throughput(worker: BenchWorker, workload: Workload) -> dict:
    # Events are published while the worker is paused, so the clock measures applying, not producing.
    run = await throughput([worker], workload.changes, pin=True)
    [counts] = run["per_worker"]
    recompiles = counts["invalidations"] + counts["unchanged_recompilations"]
    return {"events": run["events"], "seconds": run["seconds"], "events_per_second": round(run["events_per_second"]),
            "invalidations": counts["invalidations"],
            # Announced plans are compiled by the backlog, which may still be at it when the clock stops.
            "identical_recompilations": counts["unchanged_recompilations"] + counts.get("announced_unchanged", 0),
            "compilations": counts["compilations"], "pinned": run["pinned"], "cpu_seconds": counts["cpu_seconds"],
            "recompilations_per_second": round(recompiles / run["seconds"], 1)}


async def _at_rates(worker: BenchWorker, rates: tuple[int, ...], seconds: float,
                    bare_relay: Callable[[float, int], Awaitable[dict]], say: Progress) -> dict:
    """The bench workload at each fixed rate, each followed by the bare relay at that rate."""
    latency = {}
    for k, rate in enumerate(rates):
        say(f"subscriber-visible latency at {rate} events/s for {seconds:g}s (a worker of its own), then the bare "
            "relay")
        latency[str(rate)] = await _latency(worker, rate, seconds, version_base=1_000_000 * (k + 1))
        latency[str(rate)]["relay"] = await bare_relay(rate, RELAY_KEYS)
    return latency


async def _on_own_worker(bootstrap: str, http: aiohttp.ClientSession, session_timeout: float, directory: Path,
                         workload: Workload | None, run: Callable[[BenchWorker], Awaitable[dict]],
                         warm: bool = False) -> dict:
    """`run` on a worker of its own (`_own_worker`), stopped afterwards."""
    worker = await _own_worker(bootstrap, directory, http, session_timeout, workload, warm)
    try:
        return await run(worker)
    finally:
        worker.stop()


async def _own_worker(bootstrap: str, directory: Path, http: aiohttp.ClientSession, session_timeout: float,
                      workload: Workload | None, warm: bool = False) -> BenchWorker:
    """A worker on topics of its own, with the bench catalog applied (and every bench plan selected, `warm`).

    The embedded broker keeps topics in memory and its fetch costs grow with the records a
    partition holds: 300 fetches of one new record each cost it 0.37 CPU s on an empty
    partition and 1.11 s behind 200,000 records (measured on this machine). The relays run on
    fresh topics; a stream measured on topics the earlier runs filled (some 60,000 records)
    paid that on every fetch of every hop, and shared two cores with it. So each stream gets
    fresh topics too; the hot plan is also run on the long-running worker, for the difference.
    """
    worker = await start_worker(bootstrap, directory, http, FRESHPLAN_SESSION_TIMEOUT=f"{session_timeout:g}")
    try:
        if workload is not None:
            token = await worker.publish(workload.catalog)
            for body in workload.requests if warm else ():
                await worker.select(body, token)
            await worker.caught_up(token)
    except BaseException:
        worker.stop()
        raise
    return worker


async def _topic_records(worker: BenchWorker) -> dict[str, int]:
    """Records each of the worker's busiest topics holds (all partitions), as the broker's end offsets say."""
    names = ("source-changes", "entity-changes", "shared-changes", "plans", "plan-invalidations")
    consumer = AIOKafkaConsumer(bootstrap_servers=worker.bootstrap, **worker.settings.kafka.client_kwargs())
    await consumer.start()
    try:
        out = {}
        for name in names:
            tps = await discover(consumer, [worker.settings.topic(name)], attempts=1)
            out[name] = sum((await consumer.end_offsets(tps)).values()) if tps else 0
        return out
    finally:
        await consumer.stop()


async def _latency(worker: BenchWorker, rate: int, seconds: float, version_base: int) -> dict:
    """Subscriber-visible latency on the bench workload at a fixed rate.

    From the producer's send (stamped just before the call) to a consumer of `plan-invalidations`,
    started before the first send, having read the first announcement that names the event as its
    cause. Events that invalidated nothing are not in the percentiles; `lag_at_end` says whether
    the worker kept up (a backlog built when more than 100 ms of input was unapplied at the end).
    """
    stream = generate(changes=max(1, int(rate * seconds)), seed=rate, prefix=f"lat{rate}-",
                      version_base=version_base).changes
    before = await worker.metrics()
    async with Listener(worker) as listener:
        sent = await send_at_rate(worker, stream, rate)
        await listener.settle()
    waits = named_latencies({s.event_id: s.sent_at for s in sent.sent}, listener.seen)
    return dict(percentiles(waits), **stream_summary(sent, rate), events_that_invalidated=len(waits),
                loop_stalls=stalls_during(before, await worker.metrics()))


async def _fanout(worker: BenchWorker, plans: int) -> dict:
    """Time from publishing a policy version to the last of its invalidations on the topic.

    One plan is compiled for real; `plans` copies of it (same dependency keys, distinct requests
    and plan keys) are written into the stopped worker's state, which is quicker than compiling
    them one by one and indexes them exactly as compiled plans are. The worker then restarts.
    """
    template = await worker.select(dict(request("u0", "E0"), query="fan-out template"))
    await worker.caught_up(worker_token(await worker.health()))
    worker.stop()
    others = _clone_plans(worker.settings.db_path, template["plan_id"], plans)
    await worker.restart()
    health = await worker.health()
    # A new bench policy version changes every fresh plan of the bench bundle (not the Atlas one).
    expected = health["plans"].get("fresh", 0) - others
    consumer = await _announcements_from_now(worker)
    seen: set[str] = set()
    try:
        started = time.perf_counter()
        await worker.publish([bundle(version=2)])
        first = None
        deadline = started + 900
        while len(seen) < expected and time.perf_counter() < deadline:
            batch = await consumer.getmany(timeout_ms=100, max_records=20_000)
            for records in batch.values():
                for m in records:
                    doc = orjson.loads(m.value)
                    if doc["cause"]["event_id"] == "bench-bundle-2":
                        first = first or time.perf_counter()
                        seen.add(doc["plan_id"])
        last = time.perf_counter()
    finally:
        await consumer.stop()
    ceiling = await _bare_producer(worker, len(seen), size=300)
    return {"fanout_plans": expected, "invalidations_seen": len(seen), "cloned_plans": plans,
            "bare_producer_seconds": ceiling,
            "first_invalidation_seconds": first and round(first - started, 3),
            "all_published_seconds": round(last - started, 3),
            "ratio_to_bare_producer": round((last - started) / ceiling, 2) if ceiling else None,
            "seconds_per_plan_ms": round((last - started) / max(1, len(seen)) * 1000, 4)}


async def _bare_producer(worker: BenchWorker, records: int, size: int) -> float:
    """Seconds a bare aiokafka producer needs for as many keyed records of about the same size: the floor."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    name = worker.settings.topic("bench-producer-ceiling")
    admin = AIOKafkaAdminClient(bootstrap_servers=worker.bootstrap, **worker.settings.kafka.client_kwargs())
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, worker.settings.partitions, 1)])
    finally:
        await admin.close()
    send = producer(worker.bootstrap, worker.settings.kafka.client_kwargs())
    await send.start()
    try:
        await send.send_and_wait(name, b"warm-up", key=b"warm-up")
        value = b"x" * size
        started = time.perf_counter()
        futures = [await send.send(name, value, key=f"plan-{i}".encode()) for i in range(records)]
        await asyncio.gather(*futures)
        return round(time.perf_counter() - started, 3)
    finally:
        await send.stop()


async def _announcements_from_now(worker: BenchWorker) -> AIOKafkaConsumer:
    """A consumer of `plan-invalidations` positioned at its end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=worker.bootstrap, enable_auto_commit=False,
                                fetch_max_wait_ms=10,  # a short long-poll: the listener's own wait is not latency
                                max_partition_fetch_bytes=8_000_000, **worker.settings.kafka.client_kwargs())
    await consumer.start()
    name = worker.settings.topic("plan-invalidations")
    tps = [TopicPartition(name, p) for p in range(worker.settings.partitions)]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)
    return consumer


def worker_token(health: dict) -> str:
    """The freshness token a worker reports for its current state."""
    return health["freshness_token"]


def _clone_plans(db_path: Path, template_id: str, copies: int) -> int:
    """Write `copies` of a compiled plan into a stopped worker's state; returns its fresh plans of other bundles."""
    import pyarrow as pa

    from compiler.request import parse_request, plan_key
    from state.local_state import LocalState

    state = LocalState.open(db_path)
    try:
        db = state.store.db
        key, request_doc, plan_doc, receipt_id = db.execute(
            "SELECT plan_key, request, plan, receipt_id FROM plans WHERE plan_id = ?", [template_id]).fetchone()
        entity = orjson.loads(plan_doc)["entity_id"]
        deps = [r[0] for r in db.execute("SELECT dep_key FROM dependency_index WHERE plan_key = ?", [key]).fetchall()]
        base = orjson.loads(request_doc)
        others = sum(orjson.loads(r)["decision_type"] != base["decision_type"] for (r,) in db.execute(
            "SELECT request FROM plans WHERE status = 'fresh'").fetchall())
        keys, ids, requests, docs = [], [], [], []
        for i in range(copies):
            doc = dict(base, query=f"fan-out copy {i}")
            keys.append(plan_key(parse_request(doc), entity))
            ids.append(f"plan-fanout-{i:07d}")
            requests.append(orjson.dumps(doc).decode())
            docs.append(plan_doc.replace(template_id, ids[-1]))
        n = len(keys)
        when = pa.timestamp("us", tz="UTC")
        with state.store.transaction():
            state.store.insert_rows("plans", pa.table({
                "plan_id": ids, "plan_key": keys, "status": ["fresh"] * n, "live": pa.array([True] * n),
                "valid_until": pa.array([None] * n, when), "request": requests, "plan": docs,
                "receipt_id": [receipt_id] * n, "reason": pa.array([None] * n, pa.string()),
                "cause": pa.array([None] * n, pa.string()), "successor_plan_id": pa.array([None] * n, pa.string()),
                "compiled_at": pa.array([None] * n, when), "invalidated_at": pa.array([None] * n, when)}))
            state.store.insert_rows("plan_heads", pa.table({
                "plan_key": keys, "plan_id": ids, "live": pa.array([True] * n),
                "valid_until": pa.array([None] * n, when)}))
            state.store.insert_rows("dependency_index", pa.table({
                "dep_key": [d for _ in keys for d in deps], "plan_key": [k for k in keys for _ in deps]}),
                verb="INSERT INTO")
    finally:
        state.close()
    return others
