"""The bench's apply cost as the event-id ledger and key changes grow, beside the composite-key baseline."""

from __future__ import annotations

from bench.history_cost import measure
from bench.report import targets
from bench.summary import markdown


def test_a_batch_is_timed_on_a_new_file_and_after_the_history_with_the_baseline_beside_it():
    result = measure(history=5_000, batches=3)
    assert result["history"] == 5_000 and result["batch_events"] == 8
    for timings in (result["fresh_file_ms"], result["with_history_ms"]):
        assert timings["new_events"] > 0 and timings["repeated_events"] > 0
    assert set(result["ratio_history_vs_fresh"]) == {"new_events", "repeated_events"}
    assert set(result["composite_keys_baseline_ms"]) == {"1000", "5000"}
    assert all(v > 0 for sizes in result["composite_keys_baseline_ms"].values() for v in sizes.values())
    doc = {"captured_at": "now", "environment": {"cpu_count": 2, "python": "3", "platform": "x"}, "history": result}
    [row] = [r for r in targets(doc) if "event ids and key changes recorded" in r["measure"]]
    assert row["value"] == max(result["ratio_history_vs_fresh"].values())
    assert "## Apply cost as the ledgers grow" in markdown(dict(doc, targets=[row]), [])
