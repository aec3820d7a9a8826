"""Builders of input events used across tests (wire shapes from the design)."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson

_ids = itertools.count(1)
T0 = "2026-08-30T09:00:00Z"
CREDIT = {"allowed_roles": ["credit_analyst"], "allowed_purposes": ["annual_credit_review"]}


def envelope(**body) -> dict:
    return {"event_id": f"test-{next(_ids)}", "schema_version": 1, "occurred_at": T0, **body}


def resource(rid: str, *, entity: str = "ATLAS-IN-01", version: int = 1, cls: str = "approved_waiver",
             supports=("waiver_valid",), valid_from: str = "2026-08-29T00:00:00Z",
             valid_to: str | None = "2026-09-30T23:59:59Z", tokens: int = 100,
             content: str = "Waiver W2 approved by the credit committee.", **extra) -> tuple[str, dict]:
    body = {"id": rid, "version": version, "entity": entity, "title": rid, "content": content,
            "tokens": tokens, "evidence_class": cls, "supports": list(supports), "contradicts": [],
            "valid_from": valid_from, "valid_to": valid_to, "superseded_by": None,
            "provenance_group": "credit-committee", "sensitivity": "internal", "attributes": CREDIT}
    body.update(extra)
    return "source-changes", envelope(kind="resource", op="upsert", resource=body)


def revoke_role(principal: str, role: str, **extra) -> tuple[str, dict]:
    return "revocations", envelope(principal=principal, revoke="role", value=role,
                                   effective_at=T0, issued_by="iam", **extra)


def tick(now: str) -> tuple[str, dict]:
    return "clock", envelope(now=now)


def policy_version(version: int, effective_at: str, bundle: str = "atlas.jsonl", **changes) -> tuple[str, dict]:
    """The scenario's first policy bundle as a later version (its Cedar marked, so its hash differs)."""
    line = (Path(__file__).resolve().parent.parent / "scenarios" / bundle).read_text().splitlines()[0]
    event = orjson.loads(line)["event"]
    body = {k: v for k, v in event.items() if k not in ("event_id", "schema_version", "occurred_at")}
    body.update(version=version, effective_at=effective_at, cedar=body["cedar"] + f"\n// version {version}\n")
    body.update(changes)
    return "policy-versions", envelope(**body)


def principal(pid: str, roles=("credit_analyst",), delegation_version: int = 3, **attributes) -> tuple[str, dict]:
    return "source-changes", envelope(kind="principal", op="upsert", principal={
        "id": pid, "roles": list(roles), "attributes": {"unit": "corporate-credit", **attributes},
        "delegation_version": delegation_version})


def regrant(pid: str, delegation_version: int, at: str = "2026-08-30T10:00:00Z", **attributes) -> tuple[str, dict]:
    """A principal upsert made after the revocations of T0, so it re-grants what it lists."""
    topic, event = principal(pid, delegation_version=delegation_version, **attributes)
    return topic, dict(event, occurred_at=at)
