"""The bench's apply batch cost: writer time and DuckDB statements for 1 and 170 events, and one announcement."""

from __future__ import annotations

from bench.batch_cost import measure
from bench.report import targets
from tests.agents.test_event_apply import ONE_EVENT_STATEMENTS


def test_batches_are_timed_and_their_statements_counted_with_one_announcement_beside_them():
    result = measure(batches=3)
    assert set(result["by_size"]) == {"1", "170"}
    for figures in (*result["by_size"].values(), result["one_plan_announced"]):
        assert figures["median_ms"] > 0 and figures["p90_ms"] >= figures["median_ms"]
    # A batch touching no plan costs the same statements whatever its size; an announcement adds a few.
    assert result["by_size"]["1"]["statements"] == result["by_size"]["170"]["statements"] <= ONE_EVENT_STATEMENTS
    assert result["by_size"]["1"]["statements"] < result["one_plan_announced"]["statements"]
    doc = {"captured_at": "now", "environment": {"cpu_count": 2, "python": "3", "platform": "x"},
           "batch_cost": result}
    rows = [r for r in targets(doc) if r["measure"].startswith("apply batch of")]
    assert len(rows) == 3 and all("statements" in r["measure"] for r in rows)
