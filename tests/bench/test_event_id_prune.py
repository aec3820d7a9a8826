"""The event-id row: a generation dropped forgets exactly the expired ids, as the row-by-row baseline does."""

from __future__ import annotations

from bench.event_id_prune import measure
from bench.summary import event_id_lines


def test_dropping_a_generation_forgets_the_expired_ids_and_leaves_one_older_generation():
    result = measure(total=5_000, expired=700, repeats=1, claims=5)
    assert result["ids_dropped"] == result["ids_deleted"] == 700 and result["generations_after"] == 2
    assert result["older_ids"] == 4_300 and result["claim_ms_with_older"] > 0 and result["claim_ms_without_older"] > 0
    assert result["delete_seconds"] > 0 and result["rotation_seconds"] > 0
    assert "dropping their generation" in "".join(event_id_lines(result))
