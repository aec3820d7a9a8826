"""The Markdown summary of a benchmark run: tables side by side, targets met or missed, where the time goes."""

from __future__ import annotations

from bench.quality.report import markdown as quality_markdown


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join("n/a" if v is None else str(v) for v in row) + " |" for row in rows]
    return out + [""]


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
        lines += ["Event-to-invalidation latency at fixed input rates (events that caused an invalidation):", ""]
        lines += _table(["input rate", "achieved", "measured events", "p50 ms", "p95 ms", "p99 ms", "max ms"],
                        [[f"{int(r):,}/s", v["achieved_rate"], v["count"], v["p50_ms"], v["p95_ms"], v["p99_ms"],
                          v["max_ms"]] for r, v in path["latency_by_rate"].items()])
        fan = path["fanout"]
        lines += [f"Fan-out: one policy version invalidated {fan['invalidations_seen']:,} of {fan['fanout_plans']:,} "
                  f"indexed plans ({fan['cloned_plans']:,} of them copies of one compiled plan with its dependency "
                  "keys, written into the stopped worker's state, then the worker restarted); the first "
                  f"announcement came after {fan['first_invalidation_seconds']} s and the last after "
                  f"{fan['all_published_seconds']} s ({fan['seconds_per_plan_ms']} ms per plan). Fan-outs larger "
                  "than `FRESHPLAN_EAGER_RECOMPILE_LIMIT` are announced before their successors are compiled. "
                  f"For scale, a bare aiokafka producer needed {fan['bare_producer_seconds']} s in the same run to "
                  f"publish {fan['invalidations_seen']:,} keyed records of about the same size.", ""]
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
        lines += [f"freshplan announces an invalidation only when the recompiled plan differs, so none of its "
                  f"announcements was unnecessary; {fp['identical_share_of_triggered']:.1%} of the recompilations "
                  "its index triggered came out identical (work, not announcements).", ""]
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
