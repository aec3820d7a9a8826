"""The in-process take-over row: parked plans of gained partitions adopted, the stale ones announced, none lost."""

from __future__ import annotations

from bench.report import parked_takeover_row
from bench.summary import takeover_lines
from bench.takeover import measure


def test_a_take_over_of_parked_plans_adopts_the_fresh_and_announces_every_stale_one():
    result = measure(2_000, stale_share=0.05, keys_per_plan=30)
    assert result["plans"] == result["plan_heads"] == 2_000 and result["edges"] == 60_000
    assert result["stale"] == 100 and result["announced"] == 100 and result["queued"] == 100
    assert result["adopted"] == 1_900 and result["lost"] == 0 and result["wrongly_announced"] == 0
    assert set(result["phases"]) == {"judge", "restore", "announce", "commit"}
    assert 0 < sum(result["phases"].values()) <= result["seconds"] + 0.01
    row = parked_takeover_row(result)
    assert row["measure"] == "take-over of 2,000 parked plans (in process)" and row["shown"].endswith(", 0 lost")
    assert "in process" in "".join(takeover_lines(result))


def test_a_lost_invalidation_fails_the_row_whatever_the_time():
    row = parked_takeover_row({"plans": 100_000, "seconds": 3.0, "lost": 2})
    assert not row["met"] and "2 invalidations lost" in row["gap"]
    assert parked_takeover_row({"plans": 100_000, "seconds": 3.0, "lost": 0})["met"]
    assert not parked_takeover_row({"plans": 100_000, "seconds": 12.0, "lost": 0})["met"]
