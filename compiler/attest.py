"""Pass 6, attest: plan id, dependency keys, validity horizon and the receipt."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Sequence

import orjson

from compiler import dependency_keys as dk
from schemas.records import Contract, Resource
from schemas.timefmt import add_or_none

# Validity is inclusive to the second, so a plan changes one second after `valid_to`.
_RESOLUTION = timedelta(seconds=1)


def digest(value: object, prefix: str = "", length: int = 20) -> str:
    """A short stable hash of a JSON-serialisable value."""
    raw = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    return prefix + hashlib.sha256(raw).hexdigest()[:length]


def content_hash(resource: Resource) -> str:
    """sha256 of a resource's content, so receipts can reference it without carrying it."""
    return hashlib.sha256(resource.content.encode()).hexdigest()


def dependency_keys(*, principal_id: str, entity_id: str, entity_name: str, bundle_id: str,
                    contract: Contract, candidates: Sequence[Resource]) -> list[str]:
    """Everything that could change the plan: inputs used or rejected, and absent evidence."""
    keys = {dk.principal(principal_id), dk.policy(bundle_id), dk.contract(contract.decision_type),
            dk.entity(entity_id), dk.alias(entity_name)}
    keys.update(dk.resource(r.id) for r in candidates)
    for prop in contract.propositions:
        keys.add(dk.scope_claim(entity_id, prop.id))
        keys.update(dk.scope_class(entity_id, cls) for cls in prop.accepted_classes)
    return sorted(keys)


def next_change(candidates: Sequence[Resource], contract: Contract, after: datetime,
                policy_change: datetime | None = None) -> datetime | None:
    """The earliest instant after `after` at which the plan's inputs change validity.

    That is when a candidate's applicability or age changes, or `policy_change`: when a later
    version of the policy bundle takes over from the one the plan was compiled under.
    """
    instants = [policy_change]
    for r in candidates:
        if r.valid_from is not None:
            instants.append(r.valid_from)
        # A max_age ages a resource only in its own proposition's slot, from when it was observed.
        since = r.observed_at or r.valid_from
        if since is not None:
            claims = set(r.supports) | set(r.contradicts)
            instants.extend(_second_after(since, p.max_age) for p in contract.propositions
                            if p.max_age is not None and p.id in claims and r.evidence_class in p.accepted_classes)
        if r.valid_to is not None:
            # A valid_to in the last second of 9999 ends after every representable instant: no change.
            instants.append(_second_after(r.valid_to))
    future = [t for t in instants if t is not None and t > after]
    return min(future) if future else None


def _second_after(instant: datetime, span: timedelta = timedelta(0)) -> datetime | None:
    """The first second past `instant + span`, or None when that is past every representable instant."""
    end = add_or_none(instant, span)
    return None if end is None else add_or_none(end, _RESOLUTION)
