"""The targets table: issue 13's rows, each with its measured value and verdict."""

from __future__ import annotations

from bench.report import invalidation_rows, scale_rows, takeover_row, targets


def _path(**over) -> dict:
    path = {
        "throughput": {"ratio_to_ceiling": 0.087},
        "hot_plan": {"rate": 200.0, "p99_ms": 40.0, "uncovered": 0, "events": 1000},
        "latency_by_rate": {"1000": {"p99_ms": 90.0, "backlog": False, "lag_at_end": 12}},
        "selects_under_stream": {"200": {"p99_ms": 114.0}},
        "fanout": {"fanout_plans": 100_201, "ratio_to_bare_producer": 2.41},
        "scale_out": {"ratios": {"total_compilations_2_vs_1": 2.0, "busiest_worker_share_of_1": 1.0,
                                 "events_per_second_2_vs_1": 0.97},
                      "takeover": {"plans": 200, "takeover_seconds": 16.2, "timeout_seconds": 120.0, "lost": 0}},
    }
    path.update(over)
    return path


def _by_measure(rows: list[dict]) -> dict[str, dict]:
    return {r["measure"]: r for r in rows}


def test_every_issue_13_target_has_a_row_with_value_and_verdict():
    rows = _by_measure(invalidation_rows(_path()))
    assert list(rows) == [
        "events/s per worker vs bare Faust agent",
        "subscriber p99, one hot plan (Atlas), 200 events/s",
        "subscriber p99, bench workload, 1,000 events/s",
        "select p99 (cached) while 200 events/s apply",
        "HTTP loop stalls over 20 ms while events apply (probe every 10 ms)",
        "100,000-plan fan-out, last announcement vs bare aiokafka producer",
        "total recompilations, 2 workers vs 1",
        "recompilations of the busiest of 2 workers vs 1 worker",
        "events/s, 2 workers vs 1 (each pinned to its own core)",
        "take-over after kill -9 (200 plans)"]
    verdicts = {m: r["met"] for m, r in rows.items()}
    assert verdicts == {
        "events/s per worker vs bare Faust agent": False,
        "subscriber p99, one hot plan (Atlas), 200 events/s": True,
        "subscriber p99, bench workload, 1,000 events/s": True,
        "select p99 (cached) while 200 events/s apply": False,
        "HTTP loop stalls over 20 ms while events apply (probe every 10 ms)": False,
        "100,000-plan fan-out, last announcement vs bare aiokafka producer": False,
        "total recompilations, 2 workers vs 1": False,
        "recompilations of the busiest of 2 workers vs 1 worker": False,
        "events/s, 2 workers vs 1 (each pinned to its own core)": False,
        "take-over after kill -9 (200 plans)": False}
    assert rows["events/s per worker vs bare Faust agent"]["shown"] == "8.7%"
    assert rows["events/s per worker vs bare Faust agent"]["gap"] == "4.0x short"
    assert rows["select p99 (cached) while 200 events/s apply"]["gap"] == "5.7x over"
    assert rows["total recompilations, 2 workers vs 1"]["shown"] == "2.00x"
    assert rows["take-over after kill -9 (200 plans)"]["shown"] == "16.2 s, 0 lost"


def _stalls(over: int, samples: int = 500, max_le_ms: float | None = 50.0) -> dict:
    return {"samples": samples, "over_budget": over, "budget_ms": 20.0, "max_le_ms": max_le_ms}


def test_loop_stalls_count_over_every_stream_that_applied_events_and_name_where_they_were():
    path = _path(latency_by_rate={"1000": {"p99_ms": 90.0, "backlog": False, "lag_at_end": 1,
                                           "loop_stalls": _stalls(2, max_le_ms=100.0)}},
                 selects_under_stream={"0": {"p99_ms": 2.0, "loop_stalls": _stalls(9)},  # no events: not counted
                                       "200": {"p99_ms": 5.0, "loop_stalls": _stalls(0)}},
                 hot_plan={"rate": 200.0, "p99_ms": 40.0, "uncovered": 0, "events": 1000,
                           "loop_stalls": _stalls(1, max_le_ms=None)})
    row = _by_measure(invalidation_rows(path))["HTTP loop stalls over 20 ms while events apply (probe every 10 ms)"]
    assert not row["met"] and row["value"] == 3 and row["shown"] == "3 of 1,500 samples"
    assert row["gap"] == "bench workload, 1000/s: 2 (longest <= 100 ms); hot plan, 200/s: 1 (longest over 5 s)"
    path["latency_by_rate"]["1000"]["loop_stalls"] = _stalls(0)
    path["hot_plan"]["loop_stalls"] = _stalls(0)
    row = _by_measure(invalidation_rows(path))["HTTP loop stalls over 20 ms while events apply (probe every 10 ms)"]
    assert row["met"] and row["gap"] is None and row["shown"] == "0 of 1,500 samples"


def test_a_backlog_misses_the_1000_per_second_target_even_with_a_low_p99():
    rows = _by_measure(invalidation_rows(_path(latency_by_rate={
        "1000": {"p99_ms": 80.0, "backlog": True, "lag_at_end": 700}})))
    row = rows["subscriber p99, bench workload, 1,000 events/s"]
    assert not row["met"] and row["gap"] == "a backlog built"
    assert row["shown"] == "80 ms, backlog yes (700 unapplied at the end)"


def test_uncovered_hot_plan_sends_miss_the_target():
    rows = _by_measure(invalidation_rows(_path(hot_plan={"rate": 200.0, "p99_ms": 10.0, "uncovered": 3,
                                                         "events": 1000})))
    row = rows["subscriber p99, one hot plan (Atlas), 200 events/s"]
    assert not row["met"] and "3 of 1000 sends left a stale version unannounced" in row["gap"]


def test_a_lost_invalidation_fails_the_take_over_however_fast():
    row = takeover_row({"plans": 30, "takeover_seconds": 2.0, "timeout_seconds": 60.0, "lost": 1})
    assert not row["met"] and row["gap"] == "1 invalidations lost" and row["shown"] == "2.0 s, 1 lost"
    row = takeover_row({"plans": 30, "takeover_seconds": None, "timeout_seconds": 60.0, "lost": 4})
    assert not row["met"] and row["shown"] == "not done within 60 s, 4 lost"
    assert takeover_row({"plans": 30, "takeover_seconds": 9.5, "timeout_seconds": 60.0, "lost": 0})["met"]


def test_what_a_run_did_not_measure_is_missed_and_says_so():
    rows = _by_measure(invalidation_rows(_path(latency_by_rate={"100": {}}, selects_under_stream={},
                                               scale_out=None)))
    for measure in ("subscriber p99, bench workload, 1,000 events/s", "select p99 (cached) while 200 events/s apply",
                    "total recompilations, 2 workers vs 1", "take-over after kill -9"):
        assert not rows[measure]["met"] and rows[measure]["gap"] == "not measured in this run"
        assert rows[measure]["shown"] == "n/a"


def test_small_fanouts_name_their_size_and_other_sections_keep_their_rows():
    rows = targets({"invalidation_path": _path(fanout={"fanout_plans": 631, "ratio_to_bare_producer": 1.1})})
    assert _by_measure(rows)["100,000-plan fan-out, last announcement vs bare aiokafka producer (631 plans)"]["met"]


def test_issue_28_rows_bound_cpu_and_state_per_worker_and_the_kill_by_the_session_timeout():
    scale = {"scaling": {"1": {"workers": 1, "cpu_busiest_vs_1": 1.0, "state_largest_vs_1": 1.0,
                               "state_bound_vs_1": 1.0},
                         "2": {"workers": 2, "cpu_busiest_vs_1": 0.55, "state_largest_vs_1": 0.6,
                               "state_bound_vs_1": 0.625},
                         "4": {"workers": 4, "cpu_busiest_vs_1": 0.31, "state_largest_vs_1": 0.9,
                               "state_bound_vs_1": None}},
             "takeover": {"plans": 200, "announced_all_seconds": 9.4, "timeout_seconds": 120.0, "lost": 0,
                          "session_timeout": 6.0}}
    rows = _by_measure(scale_rows(scale))
    assert [(m, r["met"]) for m, r in rows.items()] == [
        ("CPU s of each of 2 workers vs 1 worker (same input)", True),
        ("CPU s of each of 4 workers vs 1 worker (same input)", False),
        ("state file of each of 2 workers vs 1 worker", True),
        ("state file of each of 4 workers vs 1 worker", False),
        ("kill -9 of one of 2 workers: every affected plan announced (200 plans)", False)]
    assert rows["state file of each of 2 workers vs 1 worker"]["target"] == (
        "<= replicated part + 1/2 of the rest = 0.62x")
    assert rows["state file of each of 4 workers vs 1 worker"]["gap"] == "replicated part not measured"
    kill = rows["kill -9 of one of 2 workers: every affected plan announced (200 plans)"]
    assert kill["target"] == "<= session timeout + 3 s = 9 s, 0 lost" and kill["shown"] == "9.4 s, 0 lost"
    scale["scaling"]["2"].update(cpu_busiest_vs_1=0.7, cpu_busiest_unwatched_vs_1=0.52)
    cpu = _by_measure(scale_rows(scale))[
        "CPU s of each of 2 workers vs 1 worker (same input, the bench's /healthz polls left out)"]
    assert cpu["met"] and cpu["shown"] == "0.52x (0.70x with them)"
    scale["takeover_standby"] = dict(scale["takeover"], announced_all_seconds=8.5, standby_replicas=1)
    copies = _by_measure(scale_rows(scale))[
        "kill -9 of one of 2 workers, each with a standby copy of the other's: every affected plan announced (200 plans)"]
    assert copies["met"] and copies["shown"] == "8.5 s, 0 lost"
    del scale["takeover_standby"]
    scale["takeover"].update(announced_all_seconds=5.0, lost=2)
    kill = _by_measure(scale_rows(scale))["kill -9 of one of 2 workers: every affected plan announced (200 plans)"]
    assert not kill["met"] and kill["gap"] == "2 invalidations lost"
    # The 2-vs-1 events/s row carries issue 28's target now.
    assert _by_measure(invalidation_rows(_path()))["events/s, 2 workers vs 1 (each pinned to its own core)"][
        "target"] == ">= 1.8x"
