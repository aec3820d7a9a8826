"""The restart row: the plans a peer recompiled meanwhile current again, every kept head and stale one announced."""

from __future__ import annotations

from bench.report import restart_row
from bench.restart_cost import measure
from bench.summary import restart_lines


def test_a_restart_makes_the_peers_plans_current_and_announces_what_it_kept_both_ways():
    result = measure(400, repeats=1, changed_share=0.25, stale_share=0.05, keys_per_plan=12)
    assert result["stale"] == 20 and result["lost"] == 0
    for how in ("where_they_lie", "as_records"):  # the baseline reaches the same state
        run = result[how]
        assert run["heads_current"] == 400 and run["announced"] == 420 and run["queued"] == 20, how
        assert run["lost"] == 0 and run["ready_seconds"] >= run["follow_seconds"] > 0
    row = restart_row(result)
    assert row["measure"].startswith("restart with 400 plans") and row["shown"].endswith(", 0 lost")
    assert "as records" in "".join(restart_lines(result))


def test_a_lost_invalidation_fails_the_restart_row_whatever_the_time():
    row = restart_row({"plans": 20_000, "ready_seconds": 1.0, "target_seconds": 3.0, "lost": 1})
    assert not row["met"] and "1 invalidations lost" in row["gap"]
    assert restart_row({"plans": 20_000, "ready_seconds": 1.0, "target_seconds": 3.0, "lost": 0})["met"]
    assert not restart_row({"plans": 20_000, "ready_seconds": 3.5, "target_seconds": 3.0, "lost": 0})["met"]
