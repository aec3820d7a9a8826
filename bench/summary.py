"""The Markdown summary of a benchmark run: tables side by side, targets met or missed, where the time goes."""

from __future__ import annotations

from bench.quality.report import markdown as quality_markdown
from bench.scale_summary import scale_lines
from bench.tables import _table, _yes


def subscriber_lines(path: dict, plot: str | None = None) -> list[str]:
    """Latency a subscriber of `plan-invalidations` sees, and cached selects while events stream."""
    lines = ["Subscriber-visible latency: from the producer's send (stamped just before the call) to an aiokafka "
             "consumer of `plan-invalidations`, assigned every partition at its end before the first send, "
             "having read the announcement. Bench workload: events named as an announcement's cause. Hot plan: "
             "every event changes the one Atlas plan, and an event counts as seen once every version of the plan "
             "published before it reflected it has been announced (the plan's first version included); one sent "
             "while its plan was announced and its successor not yet compiled has nothing left to hear. A backlog "
             "built when more than 100 ms of input was unapplied as the last event was acknowledged.", ""]
    hot = path.get("hot_plan")
    bare = next((s for s in (path.get("relay_floor") or {}).get("stages", []) if s["stage_ms"] == 0), None)
    streams = [(f"hot Atlas plan, {hot['rate']:,.0f}/s", hot, bare)] if hot else []
    long_running = path.get("hot_plan_long_running")
    if long_running:
        streams.append(("same, on the long-running worker", long_running, bare))
    spread = path.get("spread")
    if spread:
        streams.append((f"{spread['plans']}-plan spread, {spread['rate']:,.0f}/s", spread, spread.get("relay")))
    streams += [(f"bench workload, {int(r):,}/s", v, v.get("relay")) for r, v in path["latency_by_rate"].items()]
    rows = [[name, v["achieved_rate"], v["count"], v["p50_ms"], v["p95_ms"], v["p99_ms"], v["max_ms"],
             (relay or {}).get("p50_ms"), (relay or {}).get("p99_ms"), _ratio(v, relay), v.get("lag_at_end"),
             _yes(v.get("backlog")), _stalls(v)] for name, v, relay in streams]
    lines += _table(["stream", "achieved/s", "measured events", "p50 ms", "p95 ms", "p99 ms", "max ms",
                     "relay p50 ms", "relay p99 ms", "p99 vs relay", "unapplied at end", "backlog",
                     "loop stalls > 20 ms"], rows)
    lines += ["Each stream ran on a worker of its own, on fresh topics as its relay's are: the embedded broker keeps "
              "topics in memory and each fetch costs it more the more records the partition holds (see "
              "`_own_worker` in `bench/invalidation_path.py`)."
              + (f" The long-running worker's row is the same hot plan on the worker of the throughput run and the "
                 f"selects, whose topics held {_records(long_running)}; informational, no target." if long_running
                 else ""), "",
              "Relay columns: a bare relay (`bench/relay.py`: a consumer of its own inbound topic producing one "
              "record per event, no stage, read back by the same kind of consumer) at the stream's rate, run right "
              "after it in the same run; the hot plan's is the unstaged run below."
              + (f" Spread: each event edits the one resource of one of {spread['plans']} plans (round robin), "
                 "counted as the hot plan's events are, plan by plan." if spread else "")
              + (f" Latency against input rate beside the relay: `{plot}`." if plot else ""), ""]
    if hot and hot.get("successor"):
        succ = hot["successor"]
        lines += [f"Hot plan: a version reflecting each event was published on `plans` for {succ['count']} of "
                  f"{hot['events']} events, p50 {succ['p50_ms']} ms and p99 {succ['p99_ms']} ms after the send "
                  "(successors are compiled after the announcement, coalesced per plan).", ""]
    lines += relay_lines(path.get("relay_floor"), hot)
    lines += faust_relay_lines(path.get("faust_relay"))
    selects = path.get("selects_under_stream")
    if selects:
        rate = next(iter(selects.values()))["select_rate"]
        quiet = path.get("quiet_plans")
        lines += [f"Cached selects over HTTP at {rate:g}/s (open loop: each at its scheduled time) while the bench "
                  "workload streams at a fixed rate" + (
                      f"; every other select asks one of {quiet} plans of entities the stream never edits (fresh "
                      "throughout, so a cache hit under load), the others the workload's plans, which the stream "
                      "invalidates" if quiet else "") + ":", ""]
        lines += _table(["input rate", "cached selects", "compiled", "recompiled", "failed", "p50 ms", "p95 ms",
                         "p99 ms", "max ms", "all selects p50 / p99 ms", "stream backlog", "loop stalls > 20 ms"],
                        [[f"{int(r):,}/s", v["count"], v["compiled"], v.get("recompiled", "-"), v["failures"],
                          v["p50_ms"], v["p95_ms"], v["p99_ms"], v["max_ms"], _all_selects(v),
                          _yes(v["stream"]["backlog"]) if "stream" in v else "-", _stalls(v)]
                         for r, v in selects.items()])
        lines += ["Cached: the plan was fresh when asked. Recompiled: it was missing when asked (the stream had "
                  "invalidated it) and a recompilation stored it while the select waited for the writer; such "
                  "selects are timed under all selects only.", "",
                  "The worker's loop probe wakes every 10 ms; a sample late by more than 20 ms is a stall of the "
                  "HTTP loop (issue 13: applying and compiling must never hold it longer).", ""]
    return lines


def _records(stream: dict) -> str:
    """The records a long-running worker's topics held, as a phrase."""
    held = stream.get("topic_records") or {}
    return ", ".join(f"{n:,} on `{name}`" for name, n in held.items()) or "an unknown number of records"


def _all_selects(row: dict) -> str:
    """p50 / p99 of every select of a row, cached or compiled (what a caller of the service sees)."""
    every = row.get("all_selects") or {}
    return f"{every['p50_ms']} / {every['p99_ms']}" if every.get("p50_ms") is not None else "-"


def _ratio(ours: dict, relay: dict | None) -> str | None:
    """Our p99 over the relay's at the same rate, or None where either is missing."""
    if ours.get("p99_ms") is None or not (relay or {}).get("p99_ms"):
        return None
    return f"{ours['p99_ms'] / relay['p99_ms']:.2f}x"


def _stalls(stream: dict) -> str:
    """A stream's loop-probe samples over 20 ms, out of all it took ("-": not recorded by this run)."""
    stalls = stream.get("loop_stalls")
    if not stalls:
        return "-"
    worst = f", longest <= {stalls['max_le_ms']:g} ms" if stalls["over_budget"] and stalls["max_le_ms"] else ""
    return f"{stalls['over_budget']} of {stalls['samples']}{worst}"


def relay_lines(floor: dict | None, hot: dict | None) -> list[str]:
    """The hot-plan figure beside a bare relay through the same broker: what two hops and a batch of N ms cost."""
    if not floor or not floor.get("stages"):
        return []
    rate = f"{hot['rate']:,.0f}/s" if hot else "the hot-plan rate"
    lines = [f"The same latency through a bare relay at {rate}, same broker, same run: it reads as the worker's "
             "replica does, holds each batch for a fixed time in a thread (as the writer holds an apply batch), "
             "then produces it; a consumer like the one above reads it. With no stage this is the floor two "
             "broker hops put under the hot-plan figure."
             + (f" The worker's apply batch took {floor['worker_batch_ms']} ms on average in the hot-plan stream."
                if floor.get("worker_batch_ms") else ""), ""]
    return lines + _table(["serial stage ms", "events", "p50 ms", "p95 ms", "p99 ms", "max ms", "lost"],
                          [[s["stage_ms"], s["events"], s.get("p50_ms"), s.get("p95_ms"), s.get("p99_ms"),
                            s.get("max_ms"), s["lost"]] for s in floor["stages"]])


def faust_relay_lines(runs: list[dict] | None) -> list[str]:
    """The same hop through a bare Faust agent: with Faust's hard-coded 1.5 s fetch wait, and with it set in code."""
    if not runs:
        return []
    lines = ["", "The same hop through a bare Faust agent (group consumer, `take_events`, the app's producer), "
             "same broker, same run: whether Faust's agents can carry the inputs at the fast path's latency.", ""]
    return lines + _table(["fetch wait ms", "events", "p50 ms", "p95 ms", "p99 ms", "max ms", "lost"],
                          [[r["fetch_wait_ms"], r["events"], r.get("p50_ms"), r.get("p95_ms"), r.get("p99_ms"),
                            r.get("max_ms"), r["lost"]] for r in runs]) + [""]


def longest_stage_within(floor: dict | None, p99_ms: float) -> dict | None:
    """The relay run with the longest stage whose p99 stayed within `p99_ms`, if any."""
    within = [s for s in (floor or {}).get("stages", []) if s.get("p99_ms") is not None and s["p99_ms"] <= p99_ms]
    return max(within, key=lambda s: s["stage_ms"], default=None)


def takeover_lines(take: dict | None) -> list[str]:
    """A worker gaining partitions takes their parked plans over (in process, no broker)."""
    if not take:
        return []
    phases = ", ".join(f"{k} {v} s" for k, v in take["phases"].items())
    return ["## Take-over of parked plans (in process)", "",
            f"A worker gained partitions {take['partitions_gained']} holding {take['plans']:,} parked plans "
            f"({take['edges']:,} dependency edges); {take['stale']:,} of them had a key changed by an applied event "
            f"the dead owner never announced. `Ownership.change` took {take['seconds']} s, commit included "
            f"({phases}): {take['adopted']:,} adopted without compiling, {take['announced']:,} announced and queued "
            f"for recompiling, {take['lost']} affected plans not announced (lost), {take['wrongly_announced']} "
            "announced without cause. In process: no broker, no group rebalance (the kill -9 row times those).", ""]


def restart_lines(restart: dict | None) -> list[str]:
    """A worker restarted after its kept partitions' plans were recompiled elsewhere (in process, no broker)."""
    if not restart:
        return []
    ours, before = restart["where_they_lie"], restart["as_records"]
    return ["## Restart after a long absence (in process)", "",
            f"A worker stopped owning partitions {restart['partitions_kept']} with {restart['plans']:,} plans current; "
            f"meanwhile a peer recompiled every one ({restart['changed_share']:.0%} with a dependency key changed, "
            f"{restart['stale']:,} made stale by an event it never announced). Restarted on its file (median of "
            f"{restart['repeats']}), it opened it in {ours['open_seconds']} s, parked the peer's records as its feed "
            f"does in {ours['feed_seconds']} s, and followed the same assignment in {ours['follow_seconds']} s: "
            f"ready after {ours['ready_seconds']} s against the {restart['target_seconds']:g} s target "
            f"({restart['ratio_to_target']}x). {ours['heads_current']:,} records current, {ours['announced']:,} "
            f"announced (every kept head and every stale record), {ours['queued']:,} queued for recompiling, "
            f"{restart['lost']} lost. Taking the same records over as records (`Ownership.adopt`, the restart's "
            f"path before) was ready after {before['ready_seconds']} s "
            f"({restart['ratio_as_records_vs_where_they_lie']}x).", ""]


def event_id_lines(ids: dict | None) -> list[str]:
    """Forgetting old event ids: a generation dropped against the same ids deleted."""
    if not ids:
        return []
    return ["## Forgetting old event ids", "",
            f"Of {ids['total']:,} event ids, the {ids['expired']:,} older than the retention were forgotten (median "
            f"of {ids['repeats']} copies, statement and commit): dropping their generation took "
            f"{ids['rotation_seconds']} s, deleting them from one table {ids['delete_seconds']} s "
            f"({ids['delete_us_per_id']} us an id; {ids['ratio_delete_vs_rotation']}x). What generations cost a "
            f"batch of {ids['claim_batch']} new ids: {ids['claim_ms_without_older']} ms with the other "
            f"{ids['older_ids']:,} ids in the same table, {ids['claim_ms_with_older']} ms with them in an older "
            f"generation ({ids['claim_ratio_with_vs_without']}x).", ""]


def gil_lines(gil: dict | None) -> list[str]:
    """The writer's work alone, beside a busy process and beside a busy thread of its own process (no target)."""
    if not gil:
        return []
    alone, proc, thread = gil["alone"], gil["beside_process"], gil["beside_thread"]
    return ["## The writer beside the event loop (in process)", "",
            f"The writer's work on {gil['events']:,} change events of the bench workload (batches of {gil['batch']}, "
            f"successors compiled between them; median of {gil['rounds']}) took {alone['wall_s']} s alone, "
            f"{proc['wall_s']} s beside a process busy {gil['busy_share']:.0%} of every {gil['period_ms']:g} ms "
            f"({gil['wall_vs_alone']['beside_process']}x) and {thread['wall_s']} s beside a thread of its own process "
            f"busy the same ({gil['wall_vs_alone']['beside_thread']}x), with {alone['cpu_s']}, {proc['cpu_s']} and "
            f"{thread['cpu_s']} CPU s. A worker's event loop is such a thread: the difference is the writer waiting "
            "for the GIL, which another process does not hold. Informational, no target.", ""]


def markdown(result: dict, images: list[str]) -> str:
    """Render the run as Markdown."""
    env = result["environment"]
    lines = [f"# freshplan bench, {result['captured_at']}", "",
             f"Machine: {env['cpu_count']} cores, Python {env['python']}, {env['platform']}. "
             f"Everything below ran in one run on the embedded broker (Tansu {env.get('broker', '?')}); "
             "shared machines are noisy, so read ratios and percentiles, not single numbers.", ""]
    lines += ["## Targets", ""]
    lines += _table(["measure", "target", "measured", "met", "gap"],
                    [[t["measure"], t["target"], t["shown"], "yes" if t["met"] else "**no**", t["gap"] or ""]
                     for t in result["targets"]])
    path = result.get("invalidation_path")
    if path:
        tp = path["throughput"]
        lines += ["## Invalidation path (one worker, end to end: event in, invalidations out)", ""]
        lines += _table(["contender", "events", "seconds", "events/s", "ratio"],
                        [["bare Faust agent (ceiling)", tp["ceiling_bare_faust"]["events"],
                          tp["ceiling_bare_faust"]["seconds"], tp["ceiling_bare_faust"]["events_per_second"], "1.0"],
                         ["freshplan", tp["freshplan"]["events"], tp["freshplan"]["seconds"],
                          tp["freshplan"]["events_per_second"], tp["ratio_to_ceiling"]]])
        lines += [f"freshplan recompiled {tp['freshplan']['recompilations_per_second']} plans/s during the run "
                  f"({tp['freshplan']['invalidations']} invalidations announced, "
                  f"{tp['freshplan']['identical_recompilations']} recompilations came out identical and were "
                  "not announced).", ""]
        lines += subscriber_lines(path, next((name for name in images if name.endswith("-latency.png")), None))
        fan = path["fanout"]
        lines += [f"Fan-out: one policy version invalidated {fan['invalidations_seen']:,} of {fan['fanout_plans']:,} "
                  f"indexed plans ({fan['cloned_plans']:,} of them copies of one compiled plan with its dependency "
                  "keys, written into the stopped worker's state, then the worker restarted); the first "
                  f"announcement came after {fan['first_invalidation_seconds']} s and the last after "
                  f"{fan['all_published_seconds']} s ({fan['seconds_per_plan_ms']} ms per plan). Fan-outs larger "
                  "than `FRESHPLAN_EAGER_RECOMPILE_LIMIT` are announced before their successors are compiled. "
                  f"For scale, a bare aiokafka producer needed {fan['bare_producer_seconds']} s in the same run to "
                  f"publish {fan['invalidations_seen']:,} keyed records of about the same size "
                  f"(ratio {fan.get('ratio_to_bare_producer')}x).", ""]
        lines += scale_lines(path.get("scale_out"))
    lines += takeover_lines(result.get("takeover"))
    lines += restart_lines(result.get("restart"))
    lines += event_id_lines(result.get("event_ids"))
    lines += gil_lines(result.get("gil_cost"))
    caches = result.get("caches")
    if caches:
        lines += [f"## Caches on the same change stream ({caches['events']:,} events at {caches['event_rate']:g}/s "
                  f"event time, {caches['reads_per_event']} read per event over {caches['plans']} plans)", ""]
        rows = []
        for name, c in caches["contenders"].items():
            unnecessary = c.get("unnecessary_recompilations", c.get("identical_recompilations"))
            rows.append([name, c["serves"], c["stale_serves"], c["recompilations"], unnecessary,
                         c.get("invalidations")])
        lines += _table(["contender", "serves", "stale serves", "recompilations",
                         "unnecessary / identical recompilations", "invalidations announced"], rows)
        fp = caches["contenders"]["freshplan"]
        lines += [f"freshplan announces a touched plan before recompiling it, except a few touched only through "
                  "a resource they left out (compiled first, announced if changed); "
                  f"{fp['unnecessary_invalidations']:,} of its {fp['invalidations']:,} announcements were "
                  "unnecessary (the successor came out identical), and "
                  f"{fp['identical_share_of_triggered']:.1%} of the recompilations its index triggered came out "
                  "identical.", ""]
    history = result.get("history")
    if history:
        f, g, c = history["fresh_file_ms"], history["with_history_ms"], history["composite_keys_baseline_ms"]
        big = str(history["history"])
        lines += ["## Apply cost as the ledgers grow", "",
                  f"One batch of {history['batch_events']} hot-plan events (median of {history['batches']}): "
                  f"{f['new_events']} ms on a new file, {g['new_events']} ms with {history['history']:,} event ids "
                  f"and key changes recorded; a batch repeating applied events {f['repeated_events']} vs "
                  f"{g['repeated_events']} ms. Baseline, the same ledger statements on the composite keys used "
                  f"before (DuckDB scans for a composite key): repeated ids {c['1000']['repeated_ids']} ms with "
                  f"1,000 recorded vs {c[big]['repeated_ids']} ms, key changes {c['1000']['key_changes']} vs "
                  f"{c[big]['key_changes']} ms.", ""]
    index = result.get("index")
    if index:
        m, r = index["memory_per_plan"], index["restart"]
        lines += ["## Dependency index", "",
                  f"{m['plans']:,} plans with {m['edges'] // m['plans']} dependency keys each: "
                  f"{m['file_bytes_per_plan']} bytes per plan on disk (index rows, ART index and plan heads), "
                  f"{m['buffer_bytes_per_plan']} bytes per plan held in DuckDB's buffers after a full scan.", "",
                  f"Restart with {r['plans']:,} indexed plans ({r['edges']:,} edges, {r['file_mb']} MB): the index "
                  f"is stored, not rebuilt, so a restart opens the file in {r['open_seconds']} s and answers the "
                  f"first lookup in {r['first_lookup_seconds']} s; looking up all {r['policy_fanout_plans']:,} plans "
                  f"of one policy takes {r['policy_fanout_lookup_seconds']} s. (Building it took "
                  f"{r['build_seconds']} s.)", ""]
        stored = index.get("stored_plan")
        if stored:
            lines += [f"Each compiled plan also keeps its plan row and receipt until retention removes them "
                      f"(`FRESHPLAN_PLAN_RETENTION`, `FRESHPLAN_RECEIPT_RETENTION`): over {stored['plans']:,} "
                      f"compiled bench plans, {stored['plan_json_bytes_per_plan']} bytes of plan and request JSON "
                      f"and {stored['receipt_json_bytes_per_plan']} bytes of receipt JSON per plan; the file grew "
                      f"{stored['file_bytes_per_plan']} bytes per plan with its index, heads and receipt.", ""]
    quality = result.get("quality")
    if quality:
        lines += quality_markdown(quality)
    profile = result.get("profile")
    if profile:
        lines += ["## Where the time goes (pyinstrument over the apply path, in process)", ""]
        lines += _table(["part", "share of apply time"], [[k, f"{v:.1%}"] for k, v in profile["shares"].items()])
        lines += [f"Full profile: `{profile['file']}`.", ""]
    if result.get("next_steps"):
        lines += ["## Next steps", ""] + [f"- {s}" for s in result["next_steps"]] + [""]
    lines += [f"![{name}]({name})" for name in images]
    return "\n".join(lines) + "\n"
