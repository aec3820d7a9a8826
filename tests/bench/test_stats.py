"""Bench statistics: what a worker's histograms observed between two scrapes."""

from __future__ import annotations

from bench.stats import histogram_delta

NAME = "freshplan_batch_apply_seconds"


def _scrape(counts: dict[str, float], total: float) -> dict[str, float]:
    """Cumulative bucket counts as Prometheus renders them."""
    series = {f'{NAME}_bucket{{le="{le}"}}': n for le, n in counts.items()}
    series[f"{NAME}_count"] = counts["+Inf"]
    series[f"{NAME}_sum"] = total
    return series


def test_only_what_was_observed_between_the_scrapes_counts():
    before = _scrape({"0.01": 5, "0.02": 5, "0.05": 5, "+Inf": 5}, 0.03)
    # 100 more: 60 under 10 ms, 39 in (10, 20] ms, one in (20, 50] ms
    after = _scrape({"0.01": 65, "0.02": 104, "0.05": 105, "+Inf": 105}, 0.03 + 1.2)
    assert histogram_delta(before, after, NAME) == {"count": 100, "mean_ms": 12.0, "p50_le_ms": 10.0,
                                                    "p99_le_ms": 20.0}


def test_a_rank_past_the_last_finite_bucket_and_an_empty_interval_have_no_bound():
    before = _scrape({"0.01": 0, "+Inf": 0}, 0.0)
    after = _scrape({"0.01": 0, "+Inf": 2}, 80.0)
    assert histogram_delta(before, after, NAME)["p99_le_ms"] is None
    assert histogram_delta(after, after, NAME) == {"count": 0, "mean_ms": None, "p50_le_ms": None,
                                                   "p99_le_ms": None}
    assert histogram_delta({}, {}, NAME)["count"] == 0
