"""The bench's bytes per plan: index, and the plan row and receipt that retention bounds."""

from __future__ import annotations

from bench.index_cost import stored_plan_bytes
from bench.summary import markdown
from bench.workload import generate


def test_stored_plan_bytes_counts_plan_and_receipt_per_compiled_plan():
    stored = stored_plan_bytes(generate(plans=20, changes=0))
    assert stored["plans"] == 20
    assert stored["plan_json_bytes_per_plan"] > 500 and stored["receipt_json_bytes_per_plan"] > 500
    assert stored["file_bytes_per_plan"] >= 0
    index = {"memory_per_plan": {"plans": 1, "edges": 10, "file_bytes_per_plan": 1, "buffer_bytes_per_plan": 1},
             "restart": {"plans": 1, "edges": 10, "file_mb": 1, "open_seconds": 1, "first_lookup_seconds": 1,
                         "policy_fanout_plans": 1, "policy_fanout_lookup_seconds": 1, "build_seconds": 1},
             "stored_plan": stored}
    assert f"{stored['receipt_json_bytes_per_plan']} bytes of receipt JSON" in markdown(
        {"captured_at": "now", "environment": {"cpu_count": 2, "python": "3", "platform": "x"}, "targets": [],
         "index": index}, [])
