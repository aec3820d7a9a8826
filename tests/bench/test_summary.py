"""The summary's scale-out section renders every figure of the run."""

from __future__ import annotations

from bench.summary import longest_stage_within, relay_lines, scale_lines


def test_scale_out_section_names_the_figures():
    run = {"workers": 1, "pinned": True, "events": 10, "seconds": 2.0, "events_per_second": 5.0,
           "per_worker": [{"compilations": 7}], "total_compilations": 7}
    two = dict(run, workers=2, per_worker=[{"compilations": 7}, {"compilations": 8}], total_compilations=15)
    text = "\n".join(scale_lines({
        "one": run, "two": two, "ratios": {"events_per_second_2_vs_1": 1.0, "total_compilations_2_vs_1": 2.14,
                                           "busiest_worker_share_of_1": 1.14},
        "takeover": {"plans": 30, "owned_all_seconds": 4.5, "announced_all_seconds": 6.25, "lost": 0,
                     "timeout_seconds": 60.0, "session_timeout": 4.0}}))
    assert "| 2 | yes | 10 | 2.0 | 5.0 | 7 / 8 | 15 |" in text
    assert "total recompilations 2.14x" in text
    assert "session timeout 4 s" in text and "every input partition after 4.5 s" in text
    assert "announced after 6.25 s; 0 plans were never announced within 60 s" in text
    assert "{" not in text
    assert "CPU s per worker" in text and "at most" not in text  # no CPU figures: no ceiling claimed
    with_cpu = "\n".join(scale_lines({
        "one": dict(run, per_worker=[{"compilations": 7, "cpu_seconds": 2.0}]),
        "two": dict(two, per_worker=[{"compilations": 7, "cpu_seconds": 1.8}, {"compilations": 8, "cpu_seconds": 1.7}]),
        "ratios": {"events_per_second_2_vs_1": 1.0, "total_compilations_2_vs_1": 2.14,
                   "busiest_worker_share_of_1": 1.14, "cpu_busiest_2_vs_1": 0.9,
                   "events_per_second_2_vs_1_ceiling": 1.111},
        "takeover": {"plans": 30, "owned_all_seconds": 4.5, "announced_all_seconds": 6.25, "lost": 0,
                     "timeout_seconds": 60.0, "session_timeout": 4.0}}))
    assert "| 2.0 |" in with_cpu and "1.8 / 1.7 |" in with_cpu
    assert "used 90% of the single worker's CPU" in with_cpu and "at most 1.111x" in with_cpu
    assert scale_lines(None) == []


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
