"""The one builder of `plan-invalidations` records and their full-cause audit receipts."""

from __future__ import annotations

import orjson
import pytest

from schemas.codec import validate
from state.invalidations import Invalidation, reason_for

CAUSE = {"topic": "x-source-changes", "partition": 1, "offset": 7, "event_id": "e-1",
         "dependency_key": "resource:secret-memo"}
WITHHELD = dict(CAUSE, dependency_key="resource:withheld", event_id="withheld")


def test_reasons_follow_the_dependency_key_kind():
    assert [reason_for(k) for k in ("resource:r1", "scope:E/c/p", "principal:maya", "policy:b", "contract:d",
                                    "time:2026-09-01T00:00:00Z", "alias:atlas", "unheard-of:x")] == [
        "source_changed", "scope_changed", "principal_changed", "policy_changed", "contract_changed",
        "time_passed", "source_changed", "source_changed"]


def test_a_plain_invalidation_is_one_record_that_matches_the_topic_schema():
    entry = Invalidation("plan-1", "key-1", "source_changed", CAUSE, "2026-11-30T00:00:00Z", None, "plan-2")
    [(topic, key, value)] = entry.rows("x-plan-invalidations", "x-receipts")
    record = orjson.loads(value)
    validate("plan-invalidations", record)
    assert topic == "x-plan-invalidations" and key == b"plan-1"
    assert record == {"schema_version": 1, "plan_id": "plan-1", "plan_key": "key-1", "reason": "source_changed",
                      "cause": CAUSE, "invalidated_at": "2026-11-30T00:00:00Z", "as_of": None,
                      "successor_plan_id": "plan-2"}
    assert entry.history_entry() == ("plan-1", "source_changed", CAUSE, "plan-2")
    assert Invalidation("plan-1", "key-1", "evicted", CAUSE, "t", None).rows("x-plan-invalidations")[0][1] == b"plan-1"


def test_a_redacted_cause_sends_the_full_one_to_auditors_only():
    entry = Invalidation("plan-1", "key-1", "source_changed", WITHHELD, "2026-11-30T00:00:00Z",
                         "2026-08-30T00:00:00Z", None, full_cause=CAUSE)
    (_, _, public), (topic, key, audit) = entry.rows("x-plan-invalidations", "x-receipts")
    assert b"secret-memo" not in public and orjson.loads(public)["cause"] == WITHHELD
    audit = orjson.loads(audit)
    validate("receipts", audit)
    assert topic == "x-receipts" and key.decode() == audit["receipt_id"].strip() and audit["cause"] == CAUSE
    assert audit["receipt_id"] == entry.audit()["receipt_id"]  # stable: a repeat announces the same receipt
    with pytest.raises(ValueError):
        entry.rows("x-plan-invalidations")  # a full cause must go somewhere, never be dropped silently
