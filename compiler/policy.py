"""Cedar policy bundles parsed once into handles, and batch authorisation of candidates."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

import cedarpy

from compiler.errors import PolicyError
from schemas.records import PolicyBundle, Principal, Resource
from schemas.timefmt import epoch_seconds


@dataclass(frozen=True)
class CompiledPolicy:
    """A parsed policy bundle: reuse it for every request of this version."""

    bundle_id: str
    """Bundle id."""
    version: int
    """Bundle version."""
    digest: str
    """sha256 of the Cedar text, for receipts."""
    effective_at: datetime | None
    """Decisions before this instant cannot be governed by this version."""
    policy_set: Any
    """The cedarpy PolicySet handle."""


def compile_policy(bundle: PolicyBundle) -> CompiledPolicy:
    """Parse a bundle's Cedar text; raise PolicyError when it does not parse."""
    try:
        handle = cedarpy.PolicySet.from_str(bundle.cedar)
    except ValueError as exc:
        raise PolicyError(f"Cedar bundle {bundle.bundle_id} v{bundle.version} does not parse: {exc}") from None
    digest = hashlib.sha256(bundle.cedar.encode()).hexdigest()
    return CompiledPolicy(bundle.bundle_id, bundle.version, digest, bundle.effective_at, handle)


def _cedar_value(value: Any) -> Any:
    """Cedar has no floats or nulls; tuples become sets, floats become strings."""
    if isinstance(value, (list, tuple)):
        return [_cedar_value(v) for v in value if v is not None]
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: _cedar_value(v) for k, v in value.items() if v is not None}
    if isinstance(value, float):
        return str(value)
    return value


def principal_entity(principal: Principal) -> dict:
    """The Cedar entity of a principal: its attributes plus `roles` as a set."""
    attrs = _cedar_value(dict(principal.attributes))
    attrs["roles"] = list(principal.roles)
    attrs["delegation_version"] = principal.delegation_version
    return {"uid": {"type": "User", "id": principal.id}, "attrs": attrs, "parents": []}


def resource_entity(resource: Resource) -> dict:
    """The Cedar entity of a resource: its attributes plus entity, evidence class, sensitivity."""
    attrs = _cedar_value(dict(resource.attributes))
    attrs.update(entity=resource.entity, evidence_class=resource.evidence_class,
                 sensitivity=resource.sensitivity)
    return {"uid": {"type": "Resource", "id": resource.id}, "attrs": attrs, "parents": []}


def authorise(policy: CompiledPolicy, principal: Principal, resources: Sequence[Resource], *,
              purpose: str, decision_type: str, decision_time: datetime) -> list[bool]:
    """Cedar's decision for `use` of each resource, in one batch; errors deny."""
    if not resources:
        return []
    entities = [principal_entity(principal)] + [resource_entity(r) for r in resources]
    context = {"purpose": purpose, "decision_type": decision_type,
               "decision_time": epoch_seconds(decision_time)}
    user = {"type": "User", "id": principal.id}
    action = {"type": "Action", "id": "use"}
    requests = [{"principal": user, "action": action, "resource": {"type": "Resource", "id": r.id},
                 "context": context} for r in resources]
    results = cedarpy.is_authorized_batch(requests, policy.policy_set, entities)
    return [result.decision == cedarpy.Decision.Allow for result in results]
