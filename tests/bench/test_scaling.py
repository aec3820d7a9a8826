"""1, 2 and 4 workers on one workload: the figures against 1 worker, and what a run through the broker reports."""

from __future__ import annotations

from pathlib import Path

from bench import scaling
from bench.plots import scale_plot
from bench.report import scale_rows
from bench.summary import scale_lines


def _run(n: int, eps: float, cpu: list[float | None], stored: list[int | None]) -> dict:
    return {"workers": n, "pinned": n <= 2, "events_per_second": eps,
            "per_worker": [{"cpu_seconds": c, "state_bytes": b, "state_used_bytes": b and b // 2}
                           for c, b in zip(cpu, stored, strict=True)]}


def test_every_worker_is_compared_with_the_single_worker_and_its_share_of_state():
    runs = {"1": _run(1, 1000, [4.0], [100]), "2": _run(2, 1800, [2.0, 2.2], [60, 58]),
            "4": _run(4, 1500, [1.0, 1.2, None, 1.1], [40, 41, 39, 42])}
    figures = scaling.scaling(runs, replicated_bytes=20)
    assert figures["1"]["events_per_second_vs_1"] == 1.0 and figures["1"]["state_bound_vs_1"] == 1.0
    two = figures["2"]
    assert two["events_per_second_vs_1"] == 1.8 and two["cpu_seconds_vs_1"] == [0.5, 0.55]
    assert two["cpu_busiest_vs_1"] == 0.55 and two["state_bytes_vs_1"] == [0.6, 0.58]
    assert two["state_largest_vs_1"] == 0.6 and two["state_bound_bytes"] == 60 and two["state_bound_vs_1"] == 0.6
    four = figures["4"]
    assert four["cpu_seconds_vs_1"] == [0.25, 0.3, None, 0.275]
    assert four["cpu_busiest_vs_1"] is None  # one worker's CPU unknown: no claim about the busiest
    assert four["state_bound_vs_1"] == 0.4 and four["state_largest_vs_1"] == 0.42
    assert scaling.scaling(runs, None)["2"]["state_bound_vs_1"] is None  # no replicated part: no bound
    # The same bound on the blocks in use (a file keeps the blocks its checkpoints freed).
    used = scaling.scaling(runs, replicated_bytes=20, replicated_used=10)
    assert used["2"]["state_used_largest_vs_1"] == 0.6 and used["2"]["state_used_bound_vs_1"] == 0.6
    assert used["4"]["state_used_bound_vs_1"] == 0.4 and figures["2"]["state_used_bound_vs_1"] is None


def test_the_replicated_inputs_cpu_gives_an_estimate_for_each_worker_of_n():
    runs = {"1": _run(1, 1000, [4.0], [100]), "2": _run(2, 1800, [2.0, 2.2], [60, 58]),
            "4": _run(4, 1500, [1.0, 1.2, 1.3, 1.1], [40, 41, 39, 42])}
    for run in runs.values():
        for p in run["per_worker"]:
            p["cpu_seconds_unwatched"] = p["cpu_seconds"]
    figures = scaling.scaling(runs, 20, replicated_cpu=1.0)  # a quarter of one worker's 4 s, timed alone
    assert figures["1"]["cpu_estimate_vs_1"] == 1.0 and figures["2"]["cpu_estimate_vs_1"] == 0.625
    assert figures["4"]["cpu_estimate_vs_1"] == 0.438  # 0.25 + 0.75 / 4
    assert scaling.scaling(runs, 20)["4"]["cpu_estimate_vs_1"] is None  # not measured: no estimate
    assert scaling.cpu_estimate(9.0, 4.0, 2) == 1.0  # more than the whole: all of it


def test_the_report_says_which_runs_could_not_be_pinned():
    assert "cannot each be pinned" not in scaling.pinning([1, 2], 2)
    said = scaling.pinning([1, 2, 4], 2)
    assert said.startswith("1 and 2 worker(s) ran pinned") and "4 workers cannot each be pinned on 2 core(s)" in said


def check_scale_run(result: dict, said: str, directory: Path) -> None:
    """What a scale run through the broker must report: every size of cluster against 1 worker, each kill -9 with
    nothing lost, the restore, and the summary and plot made of it (`freshplan bench --quick` runs one)."""
    plans, events = result["workload"]["plans"], result["workload"]["events"]
    assert list(result["runs"]) == list(result["scaling"]) == ["1", "2", "4"]
    for n, run in result["runs"].items():
        assert run["workers"] == int(n) == len(run["per_worker"]) and run["events"] == events
        assert run["total_compilations"] == sum(p["compilations"] for p in run["per_worker"])
        assert all(p["state_bytes"] > 0 and p["state"]["wal_bytes"] == 0 for p in run["per_worker"])  # clean stops
        assert all(0 < p["state_used_bytes"] <= p["state"]["file_bytes"] for p in run["per_worker"])
        assert all(p["cpu_seconds"] is not None for p in run["per_worker"])
        # The bench's /healthz polls are timed on each worker and left out of the figure the target reads.
        assert all(0 < p["status_cpu_seconds"] and p["cpu_seconds_unwatched"] <= p["cpu_seconds"]
                   for p in run["per_worker"])
        assert len(result["scaling"][n]["cpu_seconds_vs_1"]) == len(result["scaling"][n]["state_bytes_vs_1"]) == int(n)
    assert result["scaling"]["1"]["events_per_second_vs_1"] == 1.0
    assert result["replicated"]["events"] > 0 and result["replicated"]["bytes"] > 0
    assert result["ratios"]["total_compilations_2_vs_1"] is not None

    take = result["takeover"]
    assert take["lost"] == 0 and take["plans"] == plans
    assert take["announced_all_seconds"] is not None and take["standby_replicas"] == 0
    assert take["assigned_seconds"] is not None
    standby = result["takeover_standby"]
    assert standby["lost"] == 0 and standby["plans"] == take["plans"] and standby["standby_replicas"] == 1
    if result["sharded"]:  # without a copy the survivor restored what it gained; with one it restored nothing
        assert take["restore"] is not None and take["restore"]["partitions"]
        assert standby["restore"] is None

    restore = result["restore"]
    if result["sharded"]:  # a build that partitions state: the joiner restored its half
        assert restore["measured"] and restore["restored_seconds"] is not None
        assert restore["joiner"]["resources"] >= restore["resources"] and restore["joiner"]["restoring"] == []
    else:
        assert restore["measured"] is False and restore["reason"].startswith("not measurable on this build")
        assert all(p["shard"] is None for run in result["runs"].values() for p in run["per_worker"])
    if result["cores"] < 4:
        assert "cannot each be pinned" in result["pinning"] and not result["runs"]["4"]["pinned"]
        assert "cannot each be pinned" in said  # said while it ran, too

    rows = {r["measure"]: r for r in scale_rows(result)}
    killed = f"kill -9 of one of 2 workers: every affected plan announced ({plans} plans)"
    assert {"CPU s of each of 2 workers vs 1 worker (same input, the bench's /healthz polls left out)",
            "CPU s of each of 4 workers vs 1 worker (same input, the bench's /healthz polls left out)",
            "state file of each of 2 workers vs 1 worker", "state file of each of 4 workers vs 1 worker",
            killed} <= set(rows)
    assert rows[killed]["shown"].endswith(", 0 lost")
    assert rows["kill -9 of one of 2 workers, each with a standby copy of the other's: every affected plan announced "
                f"({plans} plans)"]["shown"].endswith(", 0 lost")
    text = "\n".join(scale_lines(result))
    assert "## 1, 2, 4 workers" in text and "{" not in text and "Replicated part:" in text
    assert "Phases, no standby copies" in text and "Phases, standby copies" in text
    assert ("not measurable on this build" in text) != result["sharded"]
    directory.mkdir(exist_ok=True)
    assert (directory / scale_plot(result, directory, "scale.png")).stat().st_size > 5_000
