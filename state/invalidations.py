"""The `plan-invalidations` record and its full-cause audit receipt, built in one place for every caller."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, replace

import orjson

from schemas.outbound import Cause
from schemas.quick_init import quick_init

Row = tuple[str, bytes, bytes]  # (broker-side topic, key, value) as the outbox queues it

REASONS = {"resource": "source_changed", "scope": "scope_changed", "principal": "principal_changed",
           "policy": "policy_changed", "contract": "contract_changed", "time": "time_passed",
           "entity": "source_changed", "alias": "source_changed"}
"""The reason an invalidation gives, by the kind of dependency key that caused it."""


def reason_for(dep_key: str) -> str:
    """The reason implied by a dependency key's kind (`resource:...` -> source_changed)."""
    return REASONS.get(dep_key.split(":", 1)[0], "source_changed")


@quick_init
@dataclass(frozen=True, slots=True)
class Touch:
    """How an input event reached a plan: the event and the first dependency key of the plan's it changed."""

    dependency_key: str
    """The key, as the plan's dependency index holds it (`resource:<id>`, `principal:<id>`, `time:<instant>`...)."""
    cause: Cause
    """The event: its logical input topic, position, event id and broker timestamp."""


RECEIPT_PREFIX = "rcpt-inv-"
RECEIPT_HEX = 20
"""An audit receipt's id: the prefix and this many hex digits of the SHA-256 of its body's JSON."""


@dataclass(frozen=True, slots=True)
class Template:
    """The JSON text of an invalidation's records with its plan id and plan key cut out (see `Invalidation.template`).

    A record is `record[0] + json(plan id) + record[1] + json(plan key) + record[2]`; an audit
    receipt's body is `audit[0] + json(plan id) + audit[1]`, its id `RECEIPT_PREFIX` and the first
    `RECEIPT_HEX` hex digits of the body's SHA-256, and the receipt the body with `receipt_id` last.
    """

    record: tuple[str, str, str]
    """The `plan-invalidations` record around the plan id and the plan key."""
    audit: tuple[str, str] | None
    """The audit receipt's body around the plan id (None: nothing withheld, no receipt)."""


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
        audit = self._audit_body()
        if audit is not None:
            audit["receipt_id"] = RECEIPT_PREFIX + hashlib.sha256(orjson.dumps(audit)).hexdigest()[:RECEIPT_HEX]
        return audit

    def _audit_body(self) -> dict | None:
        """The audit receipt before its id (which is a hash of this body's JSON)."""
        if self.full_cause is None or self.full_cause is self.cause:
            return None
        return {"schema_version": 1, "kind": "invalidation", "plan_id": self.plan_id, "reason": self.reason,
                "cause": self.full_cause, "invalidated_at": self.invalidated_at,
                "successor_plan_id": self.successor_plan_id}

    def template(self) -> "Template | None":
        """This invalidation's JSON around its plan id and key: what every plan of a fan-out group shares.

        None if the cause itself holds the placeholders (it cannot: they are random).
        """
        plan_id, plan_key = f"\x00{uuid.uuid4().hex}", f"\x00{uuid.uuid4().hex}"
        entry = replace(self, plan_id=plan_id, plan_key=plan_key)
        id_json, key_json = orjson.dumps(plan_id).decode(), orjson.dumps(plan_key).decode()
        head, _, rest = orjson.dumps(entry.record()).decode().partition(id_json)
        mid, _, tail = rest.partition(key_json)
        audit = entry._audit_body()
        around = None if audit is None else orjson.dumps(audit).decode().split(id_json)
        if not tail or id_json in tail or key_json in tail or (around is not None and len(around) != 2):
            return None
        return Template((head, mid, tail), None if around is None else (around[0], around[1]))

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
