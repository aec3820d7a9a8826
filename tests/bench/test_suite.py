"""The bench suite's next steps: what a run that missed targets says to do, from its own figures."""

from __future__ import annotations

from bench.suite import next_steps


def _result(stages: dict | None) -> dict:
    return {"targets": [{"measure": "subscriber p99, one hot plan (Atlas), 200 events/s", "met": False}],
            "invalidation_path": {"hot_plan": {"p99_ms": 80.0, "worker_stages": stages}}}


def test_a_missed_hot_plan_target_names_the_workers_own_split_of_the_wait():
    stages = {"batch_wait": {"count": 240, "mean_ms": 27.4, "p50_le_ms": 30.0, "p99_le_ms": 40.0},
              "batch_apply": {"count": 240, "mean_ms": 21.5, "p50_le_ms": 25.0, "p99_le_ms": 30.0}}
    said = " ".join(next_steps(_result(stages)))
    assert "(240 batches)" in said and "waited 27.4 ms on average (p99 <= 40.0 ms)" in said
    assert "a batch took 21.5 ms (p99 <= 30.0 ms)" in said


def test_a_run_without_the_workers_figures_says_nothing_of_them():
    assert not any("Inside the worker" in step for step in next_steps(_result(None)))
