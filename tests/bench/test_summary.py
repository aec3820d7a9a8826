"""The summary's scale-out section renders every figure of the run."""

from __future__ import annotations

from bench.summary import longest_stage_within, relay_lines, scale_lines, subscriber_lines


def _scale(sharded: bool = False, restore: dict | None = None) -> dict:
    def worker(compilations: int, cpu: float, stored: int, shard: dict | None = None) -> dict:
        return {"compilations": compilations, "cpu_seconds": cpu, "state_bytes": stored, "shard": shard}

    shard = {"partitions": {"source-changes-by-entity": [0, 1]}, "resources": 200, "entities": 20, "plans": 3,
             "restoring": []} if sharded else None
    runs = {"1": {"workers": 1, "pinned": True, "seconds": 2.0, "events_per_second": 5.0,
                  "per_worker": [worker(7, 2.0, 40 * 2**20, shard)]},
            "2": {"workers": 2, "pinned": True, "seconds": 1.5, "events_per_second": 6.7,
                  "per_worker": [worker(4, 1.8, 30 * 2**20, shard), worker(3, 1.7, 31 * 2**20, shard)]}}
    return {"workload": {"events": 10, "plans": 7, "catalog_events": 900, "bulk_resources": 800, "partitions": 4},
            "pinning": "1 and 2 worker(s) ran pinned.", "sharded": sharded, "runs": runs,
            "scaling": {"1": {"events_per_second_vs_1": 1.0, "cpu_seconds_vs_1": [1.0], "state_bytes_vs_1": [1.0],
                              "state_bound_vs_1": 1.0},
                        "2": {"events_per_second_vs_1": 1.34, "cpu_seconds_vs_1": [0.9, 0.85],
                              "state_bytes_vs_1": [0.75, 0.775], "state_bound_vs_1": 0.625}},
            "ratios": {"events_per_second_2_vs_1": 1.34, "total_compilations_2_vs_1": 1.0,
                       "busiest_worker_share_of_1": 0.571, "cpu_busiest_2_vs_1": 0.9,
                       "events_per_second_2_vs_1_ceiling": 1.111},
            "replicated": {"bytes": 10 * 2**20, "how": "file bytes of one worker fed no entity resources"},
            "takeover": {"plans": 30, "owned_all_seconds": 4.5, "announced_all_seconds": 6.25, "lost": 0,
                         "timeout_seconds": 60.0, "session_timeout": 4.0},
            "restore": restore or {"measured": False, "resources": 100_000,
                                   "reason": "not measurable on this build: x"}}


def test_scale_section_names_every_figure_of_every_cluster():
    text = "\n".join(scale_lines(_scale()))
    assert "## 1, 2 workers (same workload, one run)" in text and "1 and 2 worker(s) ran pinned." in text
    assert "| 1 | yes | 2.0 | 5.0 | 1.0x | 7 | 2.0 | 1.0x | 40.0 | 1.0x | - |" in text
    assert ("| 2 | yes | 1.5 | 6.7 | 1.34x | 4 / 3 | 1.8 / 1.7 | 0.9x / 0.85x | 30.0 / 31.0 | 0.75x / 0.775x "
            "| 0.625x |") in text
    assert "Replicated part: 10.0 MB (25% of one worker's 40.0 MB), measured as the file bytes of one worker" in text
    assert "This build reports no `shard` in /healthz" in text
    assert "used 90% of the single worker's CPU" in text and "at most 1.111x" in text
    assert "session timeout 4 s" in text and "every partition after 4.5 s" in text
    assert "announced on `plan-invalidations` after 6.25 s; 0 plans were never announced within 60 s" in text
    assert "Restore of a 100,000-resource shard: not measurable on this build: x." in text
    assert "Phases" not in text  # a run that recorded none
    assert "{" not in text
    assert scale_lines(None) == []


def test_cpu_less_the_benchs_own_health_polls_is_said_per_worker_where_workers_timed_them():
    scale = _scale()
    for n, unwatched in (("1", [1.5]), ("2", [0.8, 0.75])):
        for p, c in zip(scale["runs"][n]["per_worker"], unwatched, strict=True):
            p["cpu_seconds_unwatched"] = c
        scale["scaling"][n]["cpu_unwatched_vs_1"] = [round(c / 1.5, 3) for c in unwatched]
    text = "\n".join(scale_lines(scale))
    assert ("less those reads, as timed on each worker's status thread, the CPU s per worker were 1 worker(s): 1.5 "
            "(1.0x of one worker's); 2 worker(s): 0.8 / 0.75 (0.533x / 0.5x of one worker's).") in text
    assert "less those reads" not in "\n".join(scale_lines(_scale()))  # not timed: not said
    scale["replicated"].update(cpu_seconds_unwatched=0.5, change_events=400)
    scale["scaling"]["2"]["cpu_estimate_vs_1"] = 0.667
    text = "\n".join(scale_lines(scale))
    assert ("timed alone on the 400 events of the change stream every worker applies (principals, revocations, "
            "clock ticks) spent 0.5 CPU s, 33% of the 1.5 s one worker spent") in text
    assert "each of N workers would spend 0.67x (2 workers; measured 0.533x) of one worker's. An estimate" in text
    assert "Replicated inputs' CPU" not in "\n".join(scale_lines(_scale()))  # not measured: not said


def test_the_kill_section_says_where_the_seconds_went_with_and_without_standby_copies():
    scale = _scale(sharded=True)
    scale["takeover"].update(assigned_seconds=4.1, restore={"partitions": [1, 3], "records_read": 25_312,
                                                            "resources_restored": 10_780, "seconds": 5.18})
    scale["takeover_standby"] = dict(scale["takeover"], announced_all_seconds=4.6, owned_all_seconds=4.3,
                                     assigned_seconds=4.2, restore=None)
    text = "\n".join(scale_lines(scale))
    assert ("Phases, no standby copies (the embedded default): the group's new assignment reached the survivor "
            "after 4.1 s") in text
    assert "it restored partitions [1, 3] (25,312 records read, 10,780 resource changes applied) in 5.18 s" in text
    assert "`FRESHPLAN_STANDBY_REPLICAS=1` (each keeps a warm copy of the other's partitions): every affected plan " \
           "announced after 4.6 s, 0 lost" in text
    assert "it restored nothing (it held the partitions already); it held every partition after 4.3 s" in text
    assert "{" not in text


def test_a_sharded_build_shows_what_each_shard_held_and_how_long_a_joiner_restored():
    restore = {"measured": True, "resources": 100_000, "published_records": 220_000, "restored_seconds": 14.2,
               "assigned_seconds": 6.1, "restored_after_assigned_seconds": 8.1, "timeout_seconds": 600.0,
               "joiner": {"partitions": {"source-changes-by-entity": [2, 3]}, "resources": 100_000}}
    text = "\n".join(scale_lines(_scale(sharded=True, restore=restore)))
    assert "| 2 | 1 | source-changes-by-entity [0, 1] | 200 | 20 | 3 |" in text and "no `shard`" not in text
    assert ("its shard (100000 resources, partitions source-changes-by-entity [2, 3]) was restored after 14.2 s "
            "from its start (8.1 s after /healthz first named its partitions, 6.1 s in)") in text
    assert "{" not in text
    still = dict(restore, restored_seconds=None, restored_after_assigned_seconds=None)
    assert "still restoring after 600 s" in "\n".join(scale_lines(_scale(sharded=True, restore=still)))


def test_relay_section_lists_each_stage_and_the_workers_batch():
    floor = {"worker_batch_ms": 23.4, "stages": [
        {"stage_ms": 0.0, "events": 1000, "count": 1000, "p50_ms": 22.0, "p95_ms": 35.0, "p99_ms": 38.5,
         "max_ms": 41.0, "lost": 0},
        {"stage_ms": 23.4, "events": 1000, "count": 1000, "p50_ms": 60.0, "p95_ms": 70.0, "p99_ms": 77.0,
         "max_ms": 80.0, "lost": 0}]}
    text = "\n".join(relay_lines(floor, {"rate": 200.0}))
    assert "bare relay at 200/s" in text and "apply batch took 23.4 ms on average" in text
    assert "| 0.0 | 1000 | 22.0 | 35.0 | 38.5 | 41.0 | 0 |" in text
    assert "| 23.4 | 1000 | 60.0 | 70.0 | 77.0 | 80.0 | 0 |" in text
    assert longest_stage_within(floor, 50)["stage_ms"] == 0.0
    assert longest_stage_within(floor, 30) is None
    assert relay_lines(None, None) == [] and relay_lines({"stages": []}, None) == []


def _stream(p99: float, **over) -> dict:
    return dict({"achieved_rate": 199.0, "count": 200, "p50_ms": p99 / 2, "p95_ms": p99 * 0.9, "p99_ms": p99,
                 "max_ms": p99 * 1.2, "lag_at_end": 0, "backlog": False}, **over)


def test_each_stream_is_shown_beside_the_same_rate_relay_with_the_p99_ratio():
    path = {"hot_plan": _stream(60.0, rate=200.0),
            "relay_floor": {"stages": [{"stage_ms": 10.0, "p50_ms": 30.0, "p99_ms": 45.0, "events": 200, "lost": 0},
                                       {"stage_ms": 0.0, "p50_ms": 12.0, "p99_ms": 24.0, "events": 200, "lost": 0}]},
            "spread": _stream(80.0, rate=400.0, plans=40, relay={"p50_ms": 9.0, "p99_ms": 20.0}),
            "latency_by_rate": {"100": _stream(30.0, relay={"p50_ms": 8.0, "p99_ms": 15.0}),
                                "400": _stream(50.0)}}  # its relay not measured
    text = "\n".join(subscriber_lines(path, "2026-12-05-latency.png"))
    assert "| hot Atlas plan, 200/s | 199.0 | 200 | 30.0 | 54.0 | 60.0 | 72.0 | 12.0 | 24.0 | 2.50x | 0 | no |" in text
    assert "| 40-plan spread, 400/s | 199.0 | 200 | 40.0 | 72.0 | 80.0 | 96.0 | 9.0 | 20.0 | 4.00x |" in text
    assert "| bench workload, 100/s | 199.0 | 200 | 15.0 | 27.0 | 30.0 | 36.0 | 8.0 | 15.0 | 2.00x |" in text
    assert "| bench workload, 400/s | 199.0 | 200 | 25.0 | 45.0 | 50.0 | 60.0 | n/a | n/a | n/a |" in text
    assert "one of 40 plans (round robin)" in text and "beside the relay: `2026-12-05-latency.png`" in text
    bare = "\n".join(subscriber_lines({"latency_by_rate": {"100": _stream(30.0)}}))
    assert "spread" not in bare and "latency.png" not in bare


def test_the_events_each_worker_applied_bound_what_adding_workers_can_give():
    scale = _scale()
    scale["runs"]["1"]["per_worker"][0]["applied_events"] = 20_000
    for worker, applied in zip(scale["runs"]["2"]["per_worker"], (13_000, 12_000), strict=True):
        worker["applied_events"] = applied
    text = "\n".join(scale_lines(scale))
    assert "one worker 20,000; 2 workers 13,000 / 12,000 (the busiest 0.65x one worker's" in text
    assert "0.65x its CPU each" in text and "at most 1.54x its events/s" in text
    assert "applied during the change stream" not in "\n".join(scale_lines(_scale()))  # not recorded: not said
