"""Pure arithmetic of the subscriber-side benchmarks."""

from __future__ import annotations

import pytest

from bench.stats import (Announcement, Published, backlog_built, exposition, histogram_delta,
                         invalidation_latencies, lost_invalidations, named_latencies, owns_all, percentiles,
                         split_between, stalls_during, successor_latencies, unapplied)


def _a(at: float, offset: int, key: str = "K", event: str = "", successor: str | None = None,
       partition: int = 2, plan_id: str = "") -> Announcement:
    return Announcement(at, key, "source-changes", partition, offset, event or f"e{offset}", successor, plan_id)


def test_percentiles_in_milliseconds_with_count_and_max():
    out = percentiles([i / 1000 for i in range(1, 101)])   # 1 ms .. 100 ms
    assert out["count"] == 100 and out["max_ms"] == 100.0
    assert out["p50_ms"] == pytest.approx(50.5) and out["p99_ms"] == pytest.approx(99.01)
    assert percentiles([0.25]) == {"count": 1, "p50_ms": 250.0, "p95_ms": 250.0, "p99_ms": 250.0, "max_ms": 250.0}
    assert percentiles([])["p99_ms"] is None


def test_named_latency_counts_the_first_announcement_naming_each_sent_event():
    sent = {"a": 10.0, "b": 11.0, "quiet": 12.0}
    seen = [_a(10.5, 0, event="a"), _a(10.2, 0, event="a", key="other"), _a(11.3, 1, event="b"),
            _a(13.0, 9, event="not-ours")]
    assert sorted(round(x, 3) for x in named_latencies(sent, seen)) == [0.2, 0.3]


def _p(at: float, plan_id: str, as_of: int, key: str = "K") -> Published:
    return Published(at, key, plan_id, as_of)


def test_a_folded_batch_is_covered_when_the_version_it_made_stale_is_announced():
    sends = [(o, 90.0 + o) for o in range(10, 16)]          # offsets 10..15 sent at 100..105
    # Batch 10-12 names its first event and announces v0; batch 13-15 names its last and announces p1.
    seen = [_a(103.0, 10, successor="p1", plan_id="v0"), _a(106.0, 15, successor="p2", plan_id="p1")]
    published = [_p(103.0, "p1", 13), _p(106.0, "p2", 16)]
    waits, uncovered = invalidation_latencies(sends, seen, published, "K", 2, ("v0", 10))
    assert uncovered == 0
    assert waits == pytest.approx([3.0, 2.0, 1.0, 3.0, 2.0, 1.0])
    assert successor_latencies(sends, published, "K") == pytest.approx([3.0, 2.0, 1.0, 3.0, 2.0, 1.0])


def test_announced_first_a_send_to_a_plan_already_announced_has_nothing_left_to_hear():
    sends = [(10, 100.0), (11, 101.0), (12, 102.0), (13, 103.0), (14, 104.0)]
    seen = [_a(100.5, 10, plan_id="v0"), _a(103.2, 13, plan_id="p1")]   # no successor named
    published = [_p(102.5, "p1", 13)]                       # compiled after 10..12, before 13
    waits, uncovered = invalidation_latencies(sends, seen, published, "K", 2, ("v0", 0))
    assert uncovered == 0 and waits == pytest.approx([0.5, 0.0, 0.0, 0.2, 0.0])
    assert successor_latencies(sends, published, "K") == pytest.approx([2.5, 1.5, 0.5])  # 13, 14: none yet


def test_a_version_never_announced_leaves_every_later_send_uncovered():
    sends = [(10, 100.0), (13, 103.0), (14, 104.0)]
    seen = [_a(100.5, 10, plan_id="v0"), _a(99.0, 13, plan_id="p1", key="other"),
            _a(99.0, 13, plan_id="p1", partition=3)]        # another plan; another partition seen too early
    waits, uncovered = invalidation_latencies(sends, seen, [_p(102.5, "p1", 13)], "K", 2, ("v0", 0))
    assert waits == pytest.approx([0.5]) and uncovered == 2


def test_an_identical_successor_published_again_must_be_announced_again():
    sends = [(10, 100.0), (13, 103.0)]
    seen = [_a(100.5, 10, plan_id="v0")]                    # the first announcement of v0 predates its republish
    published = [_p(102.5, "v0", 13)]
    assert invalidation_latencies(sends, seen, published, "K", 2, ("v0", 0))[1] == 1
    seen.append(_a(103.4, 13, plan_id="v0"))
    waits, uncovered = invalidation_latencies(sends, seen, published, "K", 2, ("v0", 0))
    assert uncovered == 0 and waits == pytest.approx([0.5, 0.4])


def test_unapplied_and_backlog():
    produced = {"source-changes": {0: 10, 1: 5}, "clock": {0: 3}}
    applied = {"source-changes": {"0": 7, "1": 5}}           # healthz keys partitions as strings
    assert unapplied(produced, applied) == 3 + 0 + 3
    assert not backlog_built(100, 1000) and backlog_built(101, 1000)
    assert not backlog_built(1, 5) and backlog_built(2, 5)


def test_lost_invalidations_are_expected_plans_never_announced():
    assert lost_invalidations({"a", "b", "c"}, ["b", "b", "x"]) == ["a", "c"]
    assert lost_invalidations({"a"}, {"a"}) == []


def test_owns_all_needs_every_partition_of_every_topic():
    topics = ["source-changes", "clock"]
    assert owns_all({"source-changes": [0, 1], "clock": [1, 0]}, topics, 2)
    assert not owns_all({"source-changes": [0, 1], "clock": [0]}, topics, 2)
    assert not owns_all({"source-changes": [0, 1]}, topics, 2)


HISTOGRAM = "freshplan_batch_apply_seconds"


def _scrape(counts: dict[str, float], total: float) -> dict[str, float]:
    """Cumulative bucket counts as Prometheus renders them."""
    series = {f'{HISTOGRAM}_bucket{{le="{le}"}}': n for le, n in counts.items()}
    series[f"{HISTOGRAM}_count"] = counts["+Inf"]
    series[f"{HISTOGRAM}_sum"] = total
    return series


def test_only_what_was_observed_between_the_scrapes_counts():
    before = _scrape({"0.01": 5, "0.02": 5, "0.05": 5, "+Inf": 5}, 0.03)
    # 100 more: 60 under 10 ms, 39 in (10, 20] ms, one in (20, 50] ms
    after = _scrape({"0.01": 65, "0.02": 104, "0.05": 105, "+Inf": 105}, 0.03 + 1.2)
    assert histogram_delta(before, after, HISTOGRAM) == {"count": 100, "mean_ms": 12.0, "p50_le_ms": 10.0,
                                                    "p99_le_ms": 20.0}


def test_a_rank_past_the_last_finite_bucket_and_an_empty_interval_have_no_bound():
    before = _scrape({"0.01": 0, "+Inf": 0}, 0.0)
    after = _scrape({"0.01": 0, "+Inf": 2}, 80.0)
    assert histogram_delta(before, after, HISTOGRAM)["p99_le_ms"] is None
    assert histogram_delta(after, after, HISTOGRAM) == {"count": 0, "mean_ms": None, "p50_le_ms": None,
                                                   "p99_le_ms": None}
    assert histogram_delta({}, {}, HISTOGRAM)["count"] == 0


def test_exposition_text_is_read_as_series_with_their_labels():
    text = ('# HELP freshplan_plans Stored plans by status\n# TYPE freshplan_plans gauge\n'
            'freshplan_plans{status="fresh"} 3.0\nfreshplan_index_edges 12.0\n\n')
    assert exposition(text) == {'freshplan_plans{status="fresh"}': 3.0, "freshplan_index_edges": 12.0}


def test_a_group_is_settled_once_every_partition_has_exactly_one_worker():
    topics = ("source-changes", "revocations")
    half = [{"source-changes": [0, 1], "revocations": [0, 1]}, {"source-changes": [2, 3], "revocations": [2, 3]}]
    assert split_between(half, topics, 4)
    assert split_between([{"source-changes": [0, 1, 2, 3], "revocations": [3, 2, 1, 0]}], topics, 4)
    assert not split_between([half[0], {}], topics, 4)  # the second worker has nothing yet: still joining
    assert not split_between([half[0], {"source-changes": [1, 2, 3], "revocations": [2, 3]}], topics, 4)  # twice
    assert not split_between([half[0], {"source-changes": [2, 3]}], topics, 4)  # a topic not yet assigned


def _stall_scrape(counts: dict[str, float]) -> dict[str, float]:
    name = "freshplan_loop_stall_seconds"
    series = {f'{name}_bucket{{le="{le}"}}': n for le, n in counts.items()}
    series[f"{name}_count"] = counts["+Inf"]
    return series


def test_stalls_between_two_scrapes_count_samples_over_the_budget_and_bound_the_longest():
    before = _stall_scrape({"0.01": 10, "0.02": 10, "0.05": 12, "0.1": 12, "+Inf": 12})
    # 300 more samples: 295 within 20 ms, 4 in (20, 50] ms, one in (50, 100] ms
    after = _stall_scrape({"0.01": 300, "0.02": 305, "0.05": 311, "0.1": 312, "+Inf": 312})
    assert stalls_during(before, after) == {"samples": 300, "over_budget": 5, "budget_ms": 20.0, "max_le_ms": 100.0}
    quiet = _stall_scrape({"0.01": 400, "0.02": 400, "0.05": 402, "0.1": 402, "+Inf": 402})
    assert stalls_during(before, quiet)["over_budget"] == 0 and stalls_during(before, quiet)["max_le_ms"] == 10.0
    beyond = _stall_scrape({"0.01": 10, "0.02": 10, "0.05": 12, "0.1": 12, "+Inf": 13})
    assert stalls_during(before, beyond)["max_le_ms"] is None and stalls_during(before, beyond)["over_budget"] == 1
    assert stalls_during({}, {}) == {"samples": 0, "over_budget": 0, "budget_ms": 20.0, "max_le_ms": None}
