"""The scale-out part of the bench summary: each cluster's figures, what each worker applied and held, kill -9."""

from __future__ import annotations

from bench.tables import _each, _mb, _table, _yes


def scale_lines(scale: dict | None) -> list[str]:
    """1, 2 and 4 workers on the same workload: events/s, CPU and state per worker, kill -9, a shard's restore."""
    if not scale:
        return []
    work = scale["workload"]
    counts = ", ".join(scale["runs"])
    lines = [f"## {counts} workers (same workload, one run)", "",
             f"Each cluster had topics of its own ({work['partitions']} partitions) and got the same records in the "
             f"same order: {work['catalog_events']:,} catalog events ({work['bulk_resources']:,} of them resources "
             f"of entities no plan is about, so that state has something to split), {work['plans']} plans selected "
             f"on every worker, then {work['events']:,} change events published while the inputs were paused and "
             "timed from the resume until every worker had applied them and published what they caused. CPU s: "
             "each worker process's user and system time over that interval (from /proc, its /healthz polls "
             "included). State: the DuckDB file after a clean stop (checkpointed, no log). "
             + scale["pinning"], ""]
    rows = []
    for n, run in scale["runs"].items():
        fig = scale["scaling"][n]
        workers = run["per_worker"]
        rows.append([run["workers"], _yes(run["pinned"]), run["seconds"], run["events_per_second"],
                     f"{fig['events_per_second_vs_1']}x", " / ".join(str(p["compilations"]) for p in workers),
                     _each(p.get("cpu_seconds") for p in workers), _each(fig["cpu_seconds_vs_1"], "x"),
                     _each(_mb(p.get("state_bytes")) for p in workers), _each(fig["state_bytes_vs_1"], "x"),
                     "-" if run["workers"] == 1 else _each([fig["state_bound_vs_1"]], "x")])
    lines += _table(["workers", "pinned", "seconds", "events/s", "vs 1", "recompilations per worker",
                     "CPU s per worker", "CPU vs 1", "state MB per worker", "state vs 1", "state bound vs 1"], rows)
    unwatched = [(run["workers"], [p.get("cpu_seconds_unwatched") for p in run["per_worker"]],
                  scale["scaling"][n].get("cpu_unwatched_vs_1") or []) for n, run in scale["runs"].items()]
    if all(None not in cpu and None not in vs for _, cpu, vs in unwatched):
        lines += ["The bench polls every worker's /healthz while it waits (each read costs the worker a few to tens "
                  "of ms of CPU); less those reads, as timed on each worker's status thread, the CPU s per worker "
                  "were " + "; ".join(f"{n} worker(s): {_each(cpu)} ({_each(vs, 'x')} of one worker's)"
                                      for n, cpu, vs in unwatched) + ".", ""]
    lines += applied_lines(scale)
    replicated = scale.get("replicated") or {}
    one_bytes = scale["runs"]["1"]["per_worker"][0].get("state_bytes")
    if replicated.get("bytes") and one_bytes:
        lines += [f"Replicated part: {_mb(replicated['bytes'])} MB ({replicated['bytes'] / one_bytes:.0%} of one "
                  f"worker's {_mb(one_bytes)} MB), measured as the {replicated['how']}. Issue 28's bound for each "
                  "worker of N is that part plus 1/N of the rest of one worker's file.", ""]
    lines += replicated_cpu_lines(scale)
    lines += shard_lines(scale)
    r = scale.get("ratios") or {}
    if r.get("total_compilations_2_vs_1") is not None:
        ceiling = (f" The busier of 2 workers used {r['cpu_busiest_2_vs_1']:.0%} of the single worker's CPU: on "
                   f"cores of their own 2 workers could reach at most {r['events_per_second_2_vs_1_ceiling']}x."
                   if r.get("cpu_busiest_2_vs_1") is not None else "")
        lines += [f"2 vs 1: events/s {r['events_per_second_2_vs_1']}x, total recompilations "
                  f"{r['total_compilations_2_vs_1']}x, busiest worker {r['busiest_worker_share_of_1']} of the single "
                  "worker's recompilations (the workers' `compilations` counter during the run)." + ceiling, ""]
    t = scale.get("takeover")
    if t:
        lines += [f"Kill -9: the 2-worker cluster was restarted on its files, edits that change all {t['plans']} "
                  "plans were published and one worker was killed with SIGKILL at once (group session timeout "
                  f"{t.get('session_timeout', 10):g} s: the group cannot notice sooner). The survivor held every "
                  f"partition after {t['owned_all_seconds']} s and every affected plan had been announced on "
                  f"`plan-invalidations` after {t['announced_all_seconds']} s; {t['lost']} plans were never announced "
                  f"within {t['timeout_seconds']:g} s (lost).", ""]
        lines += kill_phase_lines(t, "no standby copies (the embedded default)")
    standby = scale.get("takeover_standby")
    if standby:
        lines += [f"The same kill -9 on a second 2-worker cluster with `FRESHPLAN_STANDBY_REPLICAS=1` (each keeps a "
                  f"warm copy of the other's partitions): every affected plan announced after "
                  f"{standby['announced_all_seconds']} s, {standby['lost']} lost.", ""]
        lines += kill_phase_lines(standby, "standby copies")
    lines += restore_lines(scale.get("restore"))
    return lines


def applied_lines(scale: dict) -> list[str]:
    """How many input events each worker applied, and what that share bounds at equal cost per event."""
    runs = scale["runs"]
    one = (runs.get("1") or {}).get("per_worker", [{}])[0].get("applied_events")
    if not one:
        return []  # an older run: not recorded
    parts = []
    for n, run in runs.items():
        if n == "1":
            continue
        applied = [p.get("applied_events") or 0 for p in run["per_worker"]]
        share = max(applied) / one
        parts.append(f"{n} workers {' / '.join(f'{a:,}' for a in applied)} (the busiest {share:.2f}x one worker's; "
                     f"were every event to cost the same, {share:.2f}x its CPU each and at most {1 / share:.2f}x its "
                     "events/s together)")
    return [f"Input events applied during the change stream: one worker {one:,}; " + "; ".join(parts) + ". Every "
            "worker applies the replicated inputs (principal and entity records, revocations, the clock, resources "
            "about no entity), so only the rest splits; those cost less than resource edits, so measured ratios "
            "can beat these.", ""]


def kill_phase_lines(take: dict, label: str) -> list[str]:
    """Where a kill -9's seconds went: the group's new assignment, the survivor's restore, its take-over."""
    if "assigned_seconds" not in take:
        return []  # an older run: no phases recorded
    restore = take.get("restore")
    restored = (f"it restored partitions {restore['partitions']} ({restore['records_read']:,} records read, "
                f"{restore['resources_restored']:,} resource changes applied) in {restore['seconds']} s"
                if restore else "it restored nothing (it held the partitions already)")
    if restore and take["owned_all_seconds"] - take["assigned_seconds"] < restore["seconds"]:
        # Only a restore begun before the assignment ends within less of it than it took: the read-ahead.
        restored += ", begun before the assignment arrived (its peer watch or the rebalance's read-ahead)"
    return [f"Phases, {label}: the group's new assignment reached the survivor after {take['assigned_seconds']} s "
            "(session timeout, a heartbeat, then the rebalance, whose JoinGroup the embedded broker holds for half "
            f"the session timeout); {restored}; it held every partition after "
            f"{take['owned_all_seconds']} s.", ""]


def shard_lines(scale: dict) -> list[str]:
    """What each worker's `shard` held after the change stream, or that this build reports none."""
    if not scale.get("sharded"):
        return ["This build reports no `shard` in /healthz: every worker applies and keeps every resource (the "
                "catalog is replicated; only plans are split by partition), so CPU and state per worker cannot "
                "fall with more workers yet.", ""]
    rows = []
    for run in scale["runs"].values():
        for i, p in enumerate(run["per_worker"]):
            shard = p.get("shard") or {}
            rows.append([run["workers"], i, _held(shard.get("partitions")), shard.get("resources"),
                         shard.get("entities"), shard.get("plans")])
    return ["What each worker's shard held after the change stream (`shard` in /healthz):", ""] + _table(
        ["workers", "worker", "partitions", "resources", "entities", "plans"], rows)


def restore_lines(restore: dict | None) -> list[str]:
    """A fresh worker's restore of its shard, or why this build cannot show one."""
    if not restore:
        return []
    if not restore.get("measured"):
        return [f"Restore of a {restore['resources']:,}-resource shard: {restore['reason']}.", ""]
    joiner = restore.get("joiner") or {}
    after = restore["restored_after_assigned_seconds"]
    done = (f"its shard ({joiner.get('resources')} resources, partitions {_held(joiner.get('partitions'))}) was "
            f"restored after {restore['restored_seconds']} s from its start ({after} s after /healthz first named "
            f"its partitions, {restore['assigned_seconds']} s in)"
            if restore["restored_seconds"] is not None else
            f"its shard was still restoring after {restore['timeout_seconds']:g} s")
    return [f"Restore: one worker held {restore['published_records']:,} entities and resources, spread so that any "
            f"half of the partitions holds {restore['resources']:,} resources; a fresh worker with empty state "
            f"joined the group and {done}.", ""]


def _held(partitions: dict | None) -> str:
    return ", ".join(f"{topic} {parts}" for topic, parts in (partitions or {}).items()) or "none"


def replicated_cpu_lines(scale: dict) -> list[str]:
    """What the inputs every worker applies cost a lone worker timed alone, and what that suggests for each of N."""
    replicated = scale.get("replicated") or {}
    cpu = replicated.get("cpu_seconds_unwatched")
    single = scale["runs"]["1"]["per_worker"][0].get("cpu_seconds_unwatched")
    estimates = {n: fig.get("cpu_estimate_vs_1") for n, fig in scale["scaling"].items() if n != "1"}
    if cpu is None or not single or None in estimates.values():
        return []
    measured = {n: max(fig.get("cpu_unwatched_vs_1") or [None], key=lambda v: -1 if v is None else v)
                for n, fig in scale["scaling"].items() if n != "1"}
    return [f"Replicated inputs' CPU: a lone worker timed alone on the {replicated['change_events']:,} events of the "
            f"change stream every worker applies (principals, revocations, clock ticks) spent {cpu} CPU s, "
            f"{cpu / single:.0%} of the {single} s one worker spent on the whole stream (the /healthz polls left out). "
            "Were that part not to split and the rest to split evenly, each of N workers would spend "
            + ", ".join(f"{estimates[n]:.2f}x ({n} workers; measured {measured[n]}x)" for n in estimates)
            + " of one worker's. An estimate, not a bound: timed alone, those events carry whole batches' fixed "
            "costs, which the batches of a mixed stream share.", ""]
