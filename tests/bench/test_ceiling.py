"""The bare Faust ceiling is the median of its runs: one run is an actual run, and every run is reported."""

from __future__ import annotations

from bench.invalidation_path import median_run


def test_the_ceiling_is_the_run_of_median_events_per_second_with_all_runs_beside_it():
    runs = [{"events": 100, "seconds": 0.01, "events_per_second": 10_000},
            {"events": 100, "seconds": 0.007, "events_per_second": 14_000},
            {"events": 100, "seconds": 0.009, "events_per_second": 11_300}]
    assert median_run(runs) == {"events": 100, "seconds": 0.009, "events_per_second": 11_300,
                                "runs_events_per_second": [10_000, 14_000, 11_300]}


def test_a_run_that_measured_nothing_ranks_lowest_rather_than_failing():
    runs = [{"events_per_second": None}, {"events_per_second": 9}, {"events_per_second": 7}]
    assert median_run(runs)["events_per_second"] == 7
