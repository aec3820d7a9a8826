"""`freshplan bench --quick` runs every comparison through the broker and writes its artefacts."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest

from bench.suite import next_steps
from tests.bench.test_scaling import check_scale_run
from tests.conftest import ROOT


@pytest.mark.timeout(620)  # the quick bench now also kills a standby cluster's worker (about a minute more)
def test_bench_quick_writes_results_summary_and_plots(broker, tmp_path):
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers)
    out = subprocess.run([sys.executable, "-m", "agents.cli", "bench", "--quick", "--out", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "caches: 150/150 events" in out.stderr          # progress while it runs
    [result_file] = [p for p in tmp_path.glob("*.json") if not p.name.endswith("-quality.json")]
    result = orjson.loads(result_file.read_bytes())
    assert result["history"]["history"] == 20_000 and result["history"]["with_history_ms"]["new_events"] > 0
    path = result["invalidation_path"]
    assert path["throughput"]["ceiling_bare_faust"]["events_per_second"] > 0
    assert len(path["throughput"]["ceiling_bare_faust"]["runs_events_per_second"]) == 3  # the median of 3 runs
    assert path["throughput"]["freshplan"]["events"] == 300 and path["throughput"]["ratio_to_ceiling"] > 0
    latency = path["latency_by_rate"]["100"]
    assert latency["count"] > 0 and latency["events"] == 100 and "backlog" in latency and latency["lag_at_end"] >= 0
    assert set(path["latency_by_rate"]) == {"100", "400"}
    for rate, stream in path["latency_by_rate"].items():  # the bare relay ran beside each rate, at that rate
        assert stream["relay"]["stage_ms"] == 0 and stream["relay"]["rate"] == int(rate)
        assert stream["relay"]["events"] == int(rate) and stream["relay"]["lost"] == 0
    spread = path["spread"]                                # every edit of every spread plan reached a subscriber
    assert spread["plans"] == 40 and spread["events"] == 400 and spread["uncovered"] == 0 and spread["count"] == 400
    assert spread["relay"]["events"] == 400 and spread["relay"]["lost"] == 0 and spread["relay"]["keys"] == 40
    hot = path["hot_plan"]                                 # every edit of the hot plan reached a subscriber
    assert hot["events"] == 200 and hot["uncovered"] == 0 and hot["count"] == 200
    assert hot["write_ahead_log"]["bytes_after"] is not None and "cap_checkpoint" in hot["write_ahead_log"]
    for stream in (hot, latency, spread, path["selects_under_stream"]["200"]):  # the loop was probed through each
        assert stream["loop_stalls"]["samples"] > 0 and stream["loop_stalls"]["over_budget"] >= 0
    relay = path["relay_floor"]                            # the broker's floor under the hot-plan figure
    assert [s["stage_ms"] for s in relay["stages"]][:1] == [0.0] and len(relay["stages"]) >= 3
    assert all(s["lost"] == 0 and s["events"] == 200 for s in relay["stages"])
    selects = path["selects_under_stream"]
    assert set(selects) == {"0", "200"} and "stream" not in selects["0"]
    assert all(s["failures"] == 0 and s["count"] + s["compiled"] + s["recompiled"] == 20 for s in selects.values())
    assert selects["200"]["stream"]["events"] == 200
    # Every other select asks a plan the stream never touches: at least those are cache hits under the stream.
    assert path["quiet_plans"] == 10 and selects["200"]["count"] >= 10
    scale = path["scale_out"]
    check_scale_run(scale, out.stderr, tmp_path / "scale")
    assert all(run["events"] == 300 for run in scale["runs"].values())  # the same workload for every cluster
    assert all(p["compilations"] > 0 for p in scale["runs"]["2"]["per_worker"])
    assert scale["ratios"]["total_compilations_2_vs_1"] > 0
    assert all(p["cpu_seconds"] > 0 and p["state_bytes"] > 0  # measured, per worker
               for run in scale["runs"].values() for p in run["per_worker"])
    assert scale["runs"]["2"]["settled_seconds"] is not None  # the run began with the partitions shared out
    assert 0 < scale["ratios"]["events_per_second_2_vs_1_ceiling"]
    assert scale["takeover"]["plans"] == 30 and scale["takeover"]["lost"] == 0
    assert scale["takeover"]["takeover_seconds"] is not None
    assert scale["replicated"]["bytes"] > 0 and scale["restore"]["resources"] == 2_000
    # What the inputs every worker applies cost a lone worker timed alone, and the estimate it gives each of N.
    assert scale["replicated"]["cpu_seconds"] > 0 and scale["replicated"]["change_events"] > 0
    assert all(0 < fig["cpu_estimate_vs_1"] <= 1 for fig in scale["scaling"].values())
    assert path["fanout"]["invalidations_seen"] == path["fanout"]["fanout_plans"] > 600   # announced first
    assert path["fanout"]["bare_producer_seconds"] > 0
    caches = result["caches"]["contenders"]
    assert caches["freshplan"]["stale_serves"] == 0 and caches["flush_all"]["stale_serves"] == 0
    assert caches["ttl_60s"]["stale_serves"] > 0          # the workload does make cached plans stale
    assert {t["measure"].split(" (")[0] for t in result["targets"]} >= {
        "events/s per worker vs bare Faust agent", "subscriber p99, one hot plan", "select p99",
        "subscriber p99, bench workload, 1,000 events/s, vs the same-rate bare relay",
        "subscriber p99, 40-plan spread, 400 events/s, vs the same-rate bare relay",
        "backlog, bench workload, 5,000 events/s",
        "100,000-plan fan-out, last announcement vs bare aiokafka producer", "total recompilations, 2 workers vs 1",
        "events/s, 2 workers vs 1", "take-over after kill -9", "stale serves", "unnecessary invalidations announced",
        "CPU s of each of 2 workers vs 1 worker", "state file of each of 4 workers vs 1 worker",
        "kill -9 of one of 2 workers: every affected plan announced"}
    for t in result["targets"]:                           # each printed with its verdict
        assert ("met   " if t["met"] else "MISSED") + "  " + t["measure"] in out.stdout
    summary = result_file.with_suffix(".md").read_text()
    assert "## Targets" in summary and "bare Faust agent" in summary and "plain_top_k" in summary
    assert "## 1, 2, 4 workers" in summary and "hot Atlas plan, 200/s" in summary
    assert "| serial stage ms |" in summary and "loop stalls > 20 ms |" in summary
    assert "| 40-plan spread, 400/s |" in summary and "| relay p99 ms | p99 vs relay |" in summary
    assert result["gil_cost"]["events"] == 200 and "## The writer beside the event loop" in summary
    plots = list(tmp_path.glob("*.png"))
    assert len(plots) == 5 and all(p.stat().st_size > 5_000 for p in plots)
    assert f"beside the relay: `{result_file.stem}-latency.png`" in summary
    assert f"![{result_file.stem}-latency.png]({result_file.stem}-latency.png)" in summary
    assert (tmp_path / result["quality"]["file"]).exists() and (tmp_path / result["profile"]["file"]).exists()



def _result(stages: dict | None) -> dict:
    return {"targets": [{"measure": "subscriber p99, one hot plan (Atlas), 200 events/s, vs the same-rate bare relay",
                         "met": False}],
            "invalidation_path": {"hot_plan": {"p99_ms": 80.0, "worker_stages": stages}}}


def test_a_missed_hot_plan_target_names_the_workers_own_split_of_the_wait():
    stages = {"batch_wait": {"count": 240, "mean_ms": 27.4, "p50_le_ms": 30.0, "p99_le_ms": 40.0},
              "batch_apply": {"count": 240, "mean_ms": 21.5, "p50_le_ms": 25.0, "p99_le_ms": 30.0}}
    said = " ".join(next_steps(_result(stages)))
    assert "(240 batches)" in said and "waited 27.4 ms on average (p99 <= 40.0 ms)" in said
    assert "a batch took 21.5 ms (p99 <= 30.0 ms)" in said


def test_a_run_without_the_workers_figures_says_nothing_of_them():
    assert not any("Inside the worker" in step for step in next_steps(_result(None)))


def test_the_checkpoint_step_blames_the_log_cap_only_when_the_log_came_near_it():
    def said(**checkpoints) -> str:
        result = _result(None)
        result["invalidation_path"]["worker_checkpoints"] = dict(
            {"idle_checkpoints": 2, "idle_checkpoints_postponed": 0, "wal_limit_bytes": 64 * 2**20}, **checkpoints)
        return " ".join(next_steps(result))

    assert "7.2 MB of its 64 MB cap: far from" in said(wal_bytes=int(7.2 * 2**20))
    assert "checkpoints at its cap, inside a stream" in said(wal_bytes=60 * 2**20)
    assert "checkpoints at its cap, inside a stream" in said(wal_bytes=2**20, idle_checkpoints_postponed=3)


def test_a_missed_scale_out_target_states_the_ceiling_the_replicated_apply_leaves():
    result = {"targets": [{"measure": "events/s, 2 workers vs 1 (each pinned to its own core)", "met": False}],
              "invalidation_path": {"scale_out": {"ratios": {"events_per_second_2_vs_1": 0.94,
                                                             "cpu_busiest_2_vs_1": 0.851,
                                                             "events_per_second_2_vs_1_ceiling": 1.175}}}}
    said = " ".join(next_steps(result))
    assert "The busier of 2 workers used 85% of the single worker's CPU" in said
    assert "at most 1.18x the events/s of one (measured 0.94x" in said
    result["invalidation_path"]["scale_out"]["ratios"] = {"events_per_second_2_vs_1": 0.94}  # no CPU figures
    assert "at most" not in " ".join(next_steps(result))


def test_a_cap_checkpoint_inside_the_hot_stream_is_named_as_its_tail():
    result = _result(None)
    result["invalidation_path"]["worker_checkpoints"] = {"idle_checkpoints": 2, "idle_checkpoints_postponed": 0,
                                                         "wal_bytes": 2**20, "wal_limit_bytes": 64 * 2**20}
    result["invalidation_path"]["hot_plan"]["write_ahead_log"] = {
        "bytes_before": 63 * 2**20, "bytes_after": 2**20, "idle_checkpoints": 0, "cap_checkpoint": True}
    said = " ".join(next_steps(result))
    assert "checkpointed at its log cap inside the hot-plan stream (the log went from 63.0 to 1.0 MB" in said
    assert "far from the size" not in said  # the small log at the end was the checkpoint's doing


def test_a_missed_hot_plan_target_says_how_short_the_relay_needs_the_batch():
    result = _result(None)
    stage = {"events": 1000, "count": 1000, "p50_ms": 20.0, "p95_ms": 30.0, "max_ms": 60.0, "lost": 0}
    result["invalidation_path"]["relay_floor"] = {"worker_batch_ms": 23.4, "stages": [
        dict(stage, stage_ms=0.0, p99_ms=38.2), dict(stage, stage_ms=10.0, p99_ms=47.9),
        dict(stage, stage_ms=20.0, p99_ms=71.0), dict(stage, stage_ms=23.4, p99_ms=80.0)]}
    said = " ".join(next_steps(result))
    assert ("a p99 of 38.2 ms with a 0 ms stage, 47.9 ms with a 10 ms stage, 71.0 ms with a 20 ms stage, 80.0 ms "
            "with a 23.4 ms stage; the hot plan's target is 76.4 ms (twice the unstaged relay's p99)") in said
    assert "The longest stage that kept the relay within it was 20 ms" in said
    assert "the worker's took 23.4 ms" in said
    result["invalidation_path"]["relay_floor"]["stages"][0]["p99_ms"] = 12.0  # a fast relay: 24 ms leaves no stage
    assert "The longest stage that kept the relay within it was 0 ms" in " ".join(next_steps(result))
    result["invalidation_path"]["relay_floor"]["stages"][0]["p99_ms"] = None  # the bare run measured nothing
    assert "bare relay" not in " ".join(next_steps(result))
    result["invalidation_path"].pop("relay_floor")
    assert "bare relay" not in " ".join(next_steps(result))
