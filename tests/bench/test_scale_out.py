"""1 vs 2 workers: the ratios and the edits that must invalidate every plan."""

from __future__ import annotations

import orjson

from bench.scale_out import _poll_interval, cpu_bound, ratios, touch_every_entity
from bench.workload import generate


def _run(eps: float, *compilations: int) -> dict:
    return {"events_per_second": eps, "per_worker": [{"compilations": c} for c in compilations],
            "total_compilations": sum(compilations)}


def test_ratios_of_two_workers_to_one():
    # Replicated today: each worker recompiles everything, so twice the work and no speed-up.
    assert ratios(_run(500, 100), _run(480, 100, 100)) == {
        "events_per_second_2_vs_1": 0.96, "total_compilations_2_vs_1": 2.0, "busiest_worker_share_of_1": 1.0}
    # Partitioned: the split the issue asks for.
    assert ratios(_run(500, 100), _run(900, 52, 50)) == {
        "events_per_second_2_vs_1": 1.8, "total_compilations_2_vs_1": 1.02, "busiest_worker_share_of_1": 0.52}
    assert ratios(_run(0, 0), _run(1, 1, 1))["total_compilations_2_vs_1"] is None


def test_the_cpu_every_worker_repeats_caps_what_a_second_worker_can_add():
    one = {"seconds": 4.0, "per_worker": [{"cpu_seconds": 4.0}]}
    # Recompiling (a quarter of the work) split in two; the replicated apply done by both.
    two = {"per_worker": [{"cpu_seconds": 3.5}, {"cpu_seconds": 3.4}]}
    assert cpu_bound(one, two) == {"cpu_busiest_2_vs_1": 0.875, "events_per_second_2_vs_1_ceiling": 1.143}
    # Where /proc could not tell, no figure rather than a wrong one.
    assert cpu_bound(one, {"per_worker": [{"cpu_seconds": None}, {"cpu_seconds": 3.4}]}) == {}
    assert cpu_bound({"seconds": 4.0, "per_worker": [{}]}, two) == {}
    single = dict(_run(500, 100), seconds=4.0, per_worker=[{"compilations": 100, "cpu_seconds": 4.0}])
    pair = dict(_run(480, 50, 50), per_worker=[{"compilations": 50, "cpu_seconds": 3.5},
                                               {"compilations": 50, "cpu_seconds": 3.4}])
    assert ratios(single, pair)["events_per_second_2_vs_1_ceiling"] == 1.143


def test_take_over_edits_touch_every_planned_entity_once_with_a_new_version():
    workload = generate(plans=12, changes=10, seed=3)
    keys = {f"{b['principal']}@{b['entity']}": f"key-{i}" for i, b in enumerate(workload.requests)}
    edits, expected = touch_every_entity(workload, keys, version=9_000_000)
    bodies = [orjson.loads(v)["resource"] for _, _, v in edits]
    assert sorted(b["entity"] for b in bodies) == sorted({r["entity"] for r in workload.requests})
    assert {b["version"] for b in bodies} == {9_000_000} and all(b["id"].endswith("-r0") for b in bodies)
    assert expected == set(keys.values())


def test_the_wait_for_a_throughput_run_polls_slowly_while_far_from_done():
    # Each poll is a /healthz on the worker's own (pinned) core: far from done it must be rare.
    assert _poll_interval(10_000, None, 0.0) == 0.02  # first look
    assert _poll_interval(10_000, 10_000, 0.5) == 0.1  # nothing applied yet
    assert _poll_interval(8_000, 10_000, 1.0) == 0.5  # 2,000/s with 8,000 left: 4 s to go
    assert _poll_interval(100, 10_000, 1.0) == 0.02  # nearly done: the end is timed to 20 ms
    assert _poll_interval(0, 10_000, 1.0) == 0.02
