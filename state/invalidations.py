"""The `plan-invalidations` record and its full-cause audit receipt, built in one place for every caller."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson

Row = tuple[str, bytes, bytes]  # (broker-side topic, key, value) as the outbox queues it

REASONS = {"resource": "source_changed", "scope": "scope_changed", "principal": "principal_changed",
           "policy": "policy_changed", "contract": "contract_changed", "time": "time_passed",
           "entity": "source_changed", "alias": "source_changed"}
"""The reason an invalidation gives, by the kind of dependency key that caused it."""


def reason_for(dep_key: str) -> str:
    """The reason implied by a dependency key's kind (`resource:...` -> source_changed)."""
    return REASONS.get(dep_key.split(":", 1)[0], "source_changed")


@dataclass(frozen=True, slots=True)
class Invalidation:
    """One plan announced invalidated: what subscribers of `plan-invalidations` are told."""

    plan_id: str
    """The invalidated plan."""
    plan_key: str
    """Its plan key."""
    reason: str
    """Why (source_changed, policy_changed, stale_on_arrival, state_rebuilt, evicted, ...)."""
    cause: dict
    """The cause as subscribers may see it (a withheld resource is not named)."""
    invalidated_at: str
    """Wall-clock stamp (RFC 3339)."""
    as_of: str | None
    """Event time of the state that invalidated it (None when unknown)."""
    successor_plan_id: str | None = None
    """The plan that replaces it, when already compiled."""
    full_cause: dict | None = None
    """The unredacted cause, for auditors on `receipts`, when `cause` withholds part of it."""

    def record(self) -> dict:
        """The `plan-invalidations` record."""
        return {"schema_version": 1, "plan_id": self.plan_id, "plan_key": self.plan_key, "reason": self.reason,
                "cause": self.cause, "invalidated_at": self.invalidated_at, "as_of": self.as_of,
                "successor_plan_id": self.successor_plan_id}

    def audit(self) -> dict | None:
        """The `receipts` record carrying the full cause, when the public record withholds part of it."""
        if self.full_cause is None or self.full_cause is self.cause:
            return None
        audit = {"schema_version": 1, "kind": "invalidation", "plan_id": self.plan_id, "reason": self.reason,
                 "cause": self.full_cause, "invalidated_at": self.invalidated_at,
                 "successor_plan_id": self.successor_plan_id}
        audit["receipt_id"] = "rcpt-inv-" + hashlib.sha256(orjson.dumps(audit)).hexdigest()[:20]
        return audit

    def rows(self, invalidations_topic: str, receipts_topic: str | None = None) -> list[Row]:
        """The outbox rows: the record keyed by plan id, then the audit receipt (if any) keyed by its id."""
        rows = [(invalidations_topic, self.plan_id.encode(), orjson.dumps(self.record()))]
        audit = self.audit()
        if audit is not None:
            if receipts_topic is None:
                raise ValueError("a redacted invalidation needs the receipts topic for its full cause")
            rows.append((receipts_topic, audit["receipt_id"].encode(), orjson.dumps(audit)))
        return rows

    def history_entry(self) -> tuple[str, str, dict, str | None]:
        """(plan id, reason, public cause, successor) as `PlanStore.invalidate_many` stores it."""
        return (self.plan_id, self.reason, self.cause, self.successor_plan_id)
