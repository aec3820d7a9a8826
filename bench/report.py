"""The targets of a benchmark run, each with its measured value and verdict, and the JSON writer."""

from __future__ import annotations

from pathlib import Path

import orjson

HOT_PLAN_VS_RELAY = 2.0
"""Issue 29: the hot plan's subscriber-visible p99 at 200 events/s against the same run's bare relay at that rate."""
HOT_PLAN_P99_MS, FAST_RELAY_MS = 50.0, 25.0
"""Issue 29: and within 50 ms where the relay's p99 is under 25 ms."""
SPREAD_VS_RELAY = 4.0
"""Issue 29: the bench workload's and the 40-plan spread's p99 at 1,000 events/s against the same-rate relay."""
CEILING_SHARE = 0.70
"""Issue 29: events/s per worker against the bare Faust agent's."""
SELECT_P99_MS = 20.0
"""Issue 29: cached select p99 while 1,000 events/s apply."""
SCALE_EVENTS_2_VS_1 = 1.8
"""Issue 28's events/s of 2 workers, each pinned to a core of its own, against 1 (issue 13 asked 1.5x)."""
CPU_PER_WORKER_VS_1 = {2: 0.55, 4: 0.3}
"""Issue 28's CPU seconds of each worker of a cluster of N against one worker's, for the same input."""
TAKEOVER_SLACK_S = 3.0
"""Issue 28: after a kill -9 every affected plan is announced within the group session timeout plus this."""

OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def write_json(path: Path, doc: dict) -> None:
    """Sorted keys and fixed indentation, so that equal payloads are equal bytes."""
    path.write_bytes(orjson.dumps(doc, option=OPTIONS) + b"\n")


def targets(result: dict) -> list[dict]:
    """Each target of the benchmark issues with the measured value and whether it was met."""
    rows = []
    path = result.get("invalidation_path")
    if path:
        rows += invalidation_rows(path)
    caches = result.get("caches")
    if caches:
        fp = caches["contenders"]["freshplan"]
        rows.append(_row("stale serves (freshplan)", "0", fp["stale_serves"], 0, "<=", "{}"))
        share = fp["unnecessary_invalidations"] / fp["invalidations"] if fp["invalidations"] else 0.0
        rows.append(_row("unnecessary invalidations announced", "< 10%", share, 0.10, "<", "{:.1%}"))
    take = result.get("takeover")
    if take:
        rows.append(parked_takeover_row(take))
    restart = result.get("restart")
    if restart:
        rows.append(restart_row(restart))
    ids = result.get("event_ids")
    if ids:
        rows.append(_row(f"forgetting {ids['expired']:,} of {ids['total']:,} event ids (writer time, median; ours)",
                         "<= 0.1 s", ids["rotation_seconds"], 0.1, "<=", "{:.3f} s"))
    history = result.get("history")
    if history:
        rows.append(_row(f"apply batch with {history['history']:,} event ids and key changes recorded vs a new file",
                         "<= 1.5x", max(history["ratio_history_vs_fresh"].values()), 1.5, "<=", "{:.2f}x"))
    rows += batch_cost_rows(result.get("batch_cost") or {})
    revoked = result.get("revocations")
    if revoked:
        rows.append(_row(f"{revoked['upserts']:,} principal upserts over {revoked['revocations']:,} revocations",
                         "< 1 s", revoked["with_revocations_s"], 1.0, "<", "{:.2f} s"))
    index = result.get("index")
    if index:
        rows.append(_row("index bytes per plan (on disk)", "< 1 KiB", index["memory_per_plan"]["file_bytes_per_plan"],
                         1024, "<", "{:.0f} B"))
    return rows


def batch_cost_rows(cost: dict) -> list[dict]:
    """Issue 29's apply batch targets, with the DuckDB statements each batch ran beside the writer time."""
    rows = []
    by_size = cost.get("by_size") or {}
    for size, bound in (("1", 2.0), ("170", 25.0)):
        if size in by_size:
            rows.append(_row(f"apply batch of {size} resource upsert{'s' if size != '1' else ''} touching no plan "
                             f"(writer time, median; {by_size[size].get('statements', '?')} statements)",
                             f"<= {bound:g} ms", by_size[size]["median_ms"], bound, "<=", "{:.1f} ms"))
    one = cost.get("one_plan_announced")
    if one:
        rows.append(_row(f"apply batch of 1 upsert touching 1 plan, announced (writer time, median; "
                         f"{one['statements']} statements; ours)", "<= 2 ms", one["median_ms"], 2.0, "<=", "{:.1f} ms"))
    return rows


def hot_plan_bound_ms(relay_p99_ms: float) -> float:
    """The hot plan's p99 bound: twice the relay's, and 50 ms where the relay's is under 25 ms."""
    bound = HOT_PLAN_VS_RELAY * relay_p99_ms
    # Implied by the ratio wherever it applies (2 x 25 = 50); kept so the bound is the as written.
    return min(bound, HOT_PLAN_P99_MS) if relay_p99_ms < FAST_RELAY_MS else bound


def _gap(row: dict, why: str) -> None:
    row["met"] = False
    row["gap"] = "; ".join(filter(None, [row["gap"], why]))


def vs_relay_row(label: str, target: str, ours: dict | None, relay: dict | None, bound_of,
                 no_backlog: bool = True) -> dict:
    """A stream's p99 as a ratio to the same-rate bare relay's; `bound_of(relay p99)` is the p99 it may reach.

    Missing either side is "not measured"; events left uncovered (the coverage rule) miss it whatever
    the ratio, and so does a backlog where the target says `no_backlog` (shown either way).
    """
    ours_p99, relay_p99 = (ours or {}).get("p99_ms"), (relay or {}).get("p99_ms")
    if ours_p99 is None or not relay_p99:
        row = _row(label, target, None, 0, "<=", "{}")
        if ours_p99 is not None:
            row["shown"] = f"{ours_p99:.0f} ms, relay n/a"
            row["gap"] = "the same-rate relay was not measured"
        return row
    bound = bound_of(relay_p99)
    row = _row(label, target, ours_p99 / relay_p99, bound / relay_p99, "<=", "{:.2f}x")
    over = f" over {ours['count']} events" if ours.get("count") else ""  # a p99 of 100 samples is their 2nd largest
    row["shown"] += f" ({ours_p99:.0f} ms{over} against the relay's {relay_p99:.0f} ms)"
    if "backlog" in ours:
        row["shown"] += f", backlog {'yes' if ours['backlog'] else 'no'}"
        if ours["backlog"] and no_backlog:
            _gap(row, f"a backlog built ({ours['lag_at_end']} unapplied at the end)")
    if ours.get("uncovered"):
        # A send with a stale version never announced is a lost sample: the percentile alone would flatter.
        _gap(row, f"{ours['uncovered']} of {ours['events']} sends left a stale version unannounced")
    return row


def _at(label: str, rate: float, wanted: float) -> str:
    """A row's label ({} the rate) at the rate it was measured, saying so when that is below its target's."""
    below = "" if rate >= wanted else f" (the target's {wanted:,.0f}/s not run)"
    return label.format(f"{rate:,.0f} events/s") + below


def latency_rows(path: dict) -> list[dict]:
    """Issue 29's fast-path targets: p99 as ratios to the same run's bare relay, backlogs, selects under 1,000/s."""
    rows = []
    hot = path.get("hot_plan")
    stages = (path.get("relay_floor") or {}).get("stages") or []
    bare = next((s for s in stages if s["stage_ms"] == 0), None)
    rate = f"{hot['rate']:,.0f}" if hot else "200"
    rows.append(vs_relay_row(f"subscriber p99, one hot plan (Atlas), {rate} events/s, vs the same-rate bare relay",
                             f"<= {HOT_PLAN_VS_RELAY:g}x the relay's (and <= {HOT_PLAN_P99_MS:g} ms where the "
                             f"relay's p99 < {FAST_RELAY_MS:g} ms)", hot, bare, hot_plan_bound_ms, no_backlog=False))
    spread_bound = lambda relay_p99: SPREAD_VS_RELAY * relay_p99  # noqa: E731
    target = f"<= {SPREAD_VS_RELAY:g}x the relay's, no backlog"
    lat = path["latency_by_rate"].get("1000")
    rows.append(vs_relay_row("subscriber p99, bench workload, 1,000 events/s, vs the same-rate bare relay", target,
                             lat, (lat or {}).get("relay"), spread_bound))
    spread = path.get("spread")
    label = _at(f"subscriber p99, {spread['plans'] if spread else 40}-plan spread, {{}}, vs the same-rate bare relay",
                spread["rate"] if spread else 1000, 1000)
    rows.append(vs_relay_row(label, target, spread, (spread or {}).get("relay"), spread_bound))
    flood = path["latency_by_rate"].get("5000")
    row = _row("backlog, bench workload, 5,000 events/s (one worker)", "no backlog", flood and flood["lag_at_end"],
               0, "<=", "{}")
    if flood:
        row.update(met=not flood["backlog"], gap="a backlog built" if flood["backlog"] else None,
                   shown=f"{'yes' if flood['backlog'] else 'no'} ({flood['lag_at_end']} unapplied at the end)")
    rows.append(row)
    selects = path.get("selects_under_stream", {})
    streamed = [int(r) for r in selects if int(r)]
    rate = 1000 if "1000" in selects or not streamed else max(streamed)
    sel = selects.get(str(rate))
    row = _row(_at("select p99 (cached) while {} apply", rate, 1000),
               f"<= {SELECT_P99_MS:g} ms", sel and sel["p99_ms"], SELECT_P99_MS, "<=", "{:.0f} ms")
    if sel and sel["p99_ms"] is not None and sel.get("count"):  # a p99 of a few dozen hits is their maximum
        row["shown"] += f" over {sel['count']} cache hits"
    rows.append(row)
    return rows


def invalidation_rows(path: dict) -> list[dict]:
    """Issue 29's and 13's targets: ratios to same-run references, subscriber-visible percentiles, 1 vs 2 workers."""
    rows = [_row("events/s per worker vs bare Faust agent", f">= {CEILING_SHARE:.0%} of the ceiling",
                 path["throughput"]["ratio_to_ceiling"], CEILING_SHARE, ">=", "{:.1%}")]
    rows += latency_rows(path)
    rows.append(loop_row(path))
    fan = path["fanout"]
    label = "100,000-plan fan-out, last announcement vs bare aiokafka producer" + (
        "" if fan["fanout_plans"] >= 100_000 else f" ({fan['fanout_plans']:,} plans)")
    rows.append(_row(label, "<= 1.2x", fan.get("ratio_to_bare_producer"), 1.2, "<=", "{:.2f}x"))
    scale = path.get("scale_out")
    ratios = scale["ratios"] if scale else {}
    rows.append(_row("total recompilations, 2 workers vs 1", "<= 1.05x", ratios.get("total_compilations_2_vs_1"),
                     1.05, "<=", "{:.2f}x"))
    rows.append(_row("recompilations of the busiest of 2 workers vs 1 worker", "<= 60%",
                     ratios.get("busiest_worker_share_of_1"), 0.60, "<=", "{:.0%}"))
    rows.append(_row("events/s, 2 workers vs 1 (each pinned to its own core)", f">= {SCALE_EVENTS_2_VS_1:g}x",
                     ratios.get("events_per_second_2_vs_1"), SCALE_EVENTS_2_VS_1, ">=", "{:.2f}x"))
    take = scale["takeover"] if scale else None
    rows.append(takeover_row(take))
    if scale and scale.get("scaling"):
        rows += scale_rows(scale)
    return rows


def scale_rows(scale: dict) -> list[dict]:
    """Issue 28's targets: CPU and state per worker of 2 and 4 workers against 1, the kill -9 against the session."""
    rows = []
    for n, figures in scale["scaling"].items():
        cap = CPU_PER_WORKER_VS_1.get(figures["workers"])
        if cap is None:
            continue
        unwatched = figures.get("cpu_busiest_unwatched_vs_1")
        if unwatched is None:  # an older run, or a build whose /healthz does not time its reads
            rows.append(_row(f"CPU s of each of {n} workers vs 1 worker (same input)", f"<= {cap:g}x",
                             figures["cpu_busiest_vs_1"], cap, "<=", "{:.2f}x"))
            continue
        row = _row(f"CPU s of each of {n} workers vs 1 worker (same input, the bench's /healthz polls left out)",
                   f"<= {cap:g}x", unwatched, cap, "<=", "{:.2f}x")
        if figures["cpu_busiest_vs_1"] is not None:
            row["shown"] += f" ({figures['cpu_busiest_vs_1']:.2f}x with them)"
        rows.append(row)
    for n, figures in scale["scaling"].items():
        if figures["workers"] > 1:
            bound = figures["state_bound_vs_1"]
            target = f"replicated part + 1/{n} of the rest" + (f" = {bound:.2f}x" if bound else "")
            row = _row(f"state file of each of {n} workers vs 1 worker", f"<= {target}", figures["state_largest_vs_1"],
                       bound if bound is not None else 0.0, "<=", "{:.2f}x")
            if bound is None:
                row.update(met=False, gap="replicated part not measured")
            used, used_bound = figures.get("state_used_largest_vs_1"), figures.get("state_used_bound_vs_1")
            if used is not None and used_bound is not None:  # runs before 2026-12-07 did not measure it
                row["shown"] += f" (blocks in use: {used:.2f}x against {used_bound:.2f}x)"
            rows.append(row)
    for key, copies in (("takeover", ""), ("takeover_standby", ", each with a standby copy of the other's")):
        take = scale.get(key)
        if take:
            bound = take["session_timeout"] + TAKEOVER_SLACK_S
            rows.append(_kill_row(f"kill -9 of one of 2 workers{copies}: every affected plan announced "
                                  f"({take['plans']:,} plans)",
                                  f"<= session timeout + {TAKEOVER_SLACK_S:g} s = {bound:g} s, 0 lost",
                                  take["announced_all_seconds"], bound, take))
    return rows


def streamed_stalls(path: dict) -> list[tuple[str, dict]]:
    """(stream, loop-probe figures) of every stream in which events applied (older runs recorded none)."""
    out = [(f"bench workload, {rate}/s", lat["loop_stalls"]) for rate, lat in path["latency_by_rate"].items()
           if lat.get("loop_stalls")]
    out += [(f"selects while {rate}/s apply", sel["loop_stalls"])
            for rate, sel in path.get("selects_under_stream", {}).items() if int(rate) and sel.get("loop_stalls")]
    spread = path.get("spread") or {}
    if spread.get("loop_stalls"):
        out.append((f"{spread['plans']}-plan spread, {spread['rate']:,.0f}/s", spread["loop_stalls"]))
    hot = path.get("hot_plan") or {}
    if hot.get("loop_stalls"):
        out.append((f"hot plan, {hot['rate']:,.0f}/s", hot["loop_stalls"]))
    return out


def loop_row(path: dict) -> dict:
    """Issue 13's "the HTTP event loop is never blocked more than 20 ms by applying": probe samples over 20 ms."""
    streams = streamed_stalls(path)
    over = sum(s["over_budget"] for _, s in streams) if streams else None
    row = _row("HTTP loop stalls over 20 ms while events apply (probe every 10 ms)", "0", over, 0, "<=", "{}")
    if streams:
        row["shown"] += f" of {sum(s['samples'] for _, s in streams):,} samples"
    if over:
        row["gap"] = "; ".join(f"{name}: {s['over_budget']} ({_longest(s)})" for name, s in streams if s["over_budget"])
    return row


def _longest(stalls: dict) -> str:
    return f"longest <= {stalls['max_le_ms']:g} ms" if stalls["max_le_ms"] is not None else "longest over 5 s"


def takeover_row(take: dict | None) -> dict:
    """Take-over after kill -9: within 10 s and no invalidation lost (a loss fails it whatever the time)."""
    label = "take-over after kill -9" + (f" ({take['plans']:,} plans)" if take else "")
    if take is None:
        return _row(label, "<= 10 s, 0 lost", None, 10, "<=", "{}")
    return _kill_row(label, "<= 10 s, 0 lost", take["takeover_seconds"], 10.0, take)


def _kill_row(label: str, target: str, seconds: float | None, bound: float, take: dict) -> dict:
    """A kill -9 row: the time against its bound, and any lost invalidation fails it whatever the time."""
    row = _row(label, target, seconds, bound, "<=", "{:.1f} s")
    if seconds is None:
        row["shown"] = f"not done within {take['timeout_seconds']:g} s"
    row["shown"] += f", {take['lost']} lost"
    if take["lost"]:
        row["met"] = False
        row["gap"] = "; ".join(filter(None, [row["gap"], f"{take['lost']} invalidations lost"]))
    return row


def parked_takeover_row(take: dict) -> dict:
    """Taking parked plans over in process (judge, restore, announce, commit): within 10 s and none lost."""
    row = _row(f"take-over of {take['plans']:,} parked plans (in process)", "<= 10 s, 0 lost", take["seconds"], 10.0,
               "<=", "{:.1f} s")
    row["shown"] += f", {take['lost']} lost"
    if take["lost"]:
        row["met"] = False
        row["gap"] = "; ".join(filter(None, [row["gap"], f"{take['lost']} invalidations lost"]))
    return row


def restart_row(restart: dict) -> dict:
    """A restart with plans compiled meanwhile: ready (file opened, assignment followed) within 3 s, none lost."""
    row = _row(f"restart with {restart['plans']:,} plans recompiled meanwhile, ready (in process, median)",
               f"< {restart['target_seconds']:g} s, 0 lost", restart["ready_seconds"], restart["target_seconds"], "<",
               "{:.2f} s")
    row["shown"] += f", {restart['lost']} lost"
    if restart["lost"]:
        row["met"] = False
        row["gap"] = "; ".join(filter(None, [row["gap"], f"{restart['lost']} invalidations lost"]))
    return row


def _row(what: str, target: str, value, bound, op: str, fmt: str) -> dict:
    met = value is not None and {"<=": value <= bound, ">=": value >= bound, "<": value < bound}[op]
    if value is None:
        gap = "not measured in this run"
    elif met:
        gap = None
    elif op == ">=":
        gap = f"{bound / value:.1f}x short" if value else "not measured"
    else:
        gap = f"{value / bound:.1f}x over" if bound else f"{value} over"
    return {"measure": what, "target": target, "value": value, "shown": "n/a" if value is None else fmt.format(value),
            "met": met, "gap": gap}
