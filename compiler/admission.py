"""Pass 4, admit: Cedar first, then applicability and evidence typing, with reason classes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from compiler.policy import CompiledPolicy, authorise
from schemas.records import Contract, Principal, Resource

# Precedence is the order of checks: an item the principal may not use is never
# described by any other reason, so the caller cannot learn it exists.
NOT_AUTHORISED = "not_authorised"
WRONG_SUBJECT = "wrong_subject"
NOT_APPLICABLE = "not_applicable"
STALE = "stale"
WRONG_EVIDENCE_CLASS = "wrong_evidence_class"


@dataclass(frozen=True)
class Admission:
    """The admitted universe of one request and what was kept out, with why."""

    typed: tuple[tuple[Resource, frozenset[str]], ...]
    """Admissible resources with the propositions each may establish or refute."""
    rejected: tuple[tuple[str, str], ...]
    """(resource id, reason class) for permitted but unusable resources."""
    withheld: tuple[str, ...]
    """Ids Cedar denied; counted to the caller, named only in the receipt."""
    policy_errors: int = 0
    """Candidates withheld because some policy failed to evaluate for them (errors deny)."""


def applicable_at(resource: Resource, when: datetime) -> bool:
    """Whether the resource is in force at `when` and not superseded."""
    if resource.superseded_by:
        return False
    if resource.valid_from is not None and when < resource.valid_from:
        return False
    return resource.valid_to is None or when <= resource.valid_to


def typed_propositions(resource: Resource, contract: Contract) -> frozenset[str]:
    """Propositions of the contract this resource's evidence class may speak to."""
    claims = set(resource.supports) | set(resource.contradicts)
    return frozenset(p.id for p in contract.propositions
                     if p.id in claims and resource.evidence_class in p.accepted_classes)


def is_stale(resource: Resource, contract: Contract, when: datetime) -> bool:
    """True when every proposition it could serve has a max_age the evidence exceeds."""
    claims = set(resource.supports) | set(resource.contradicts)
    windows = [p.max_age for p in contract.propositions if p.id in claims]
    if not windows or any(w is None for w in windows) or resource.valid_from is None:
        return False
    return all(when - resource.valid_from > w for w in windows)


def admit(candidates: Sequence[Resource], *, entity_id: str, principal: Principal,
          contract: Contract, policy: CompiledPolicy, purpose: str,
          decision_time: datetime) -> Admission:
    """Validate every candidate: Cedar in one batch, then subject, time, freshness, class."""
    verdict = authorise(policy, principal, candidates, purpose=purpose,
                        decision_type=contract.decision_type, decision_time=decision_time)
    typed: list[tuple[Resource, frozenset[str]]] = []
    rejected: list[tuple[str, str]] = []
    withheld: list[str] = []
    for resource, ok in zip(candidates, verdict.allowed, strict=True):
        if not ok:
            withheld.append(resource.id)
        elif resource.entity != entity_id:
            rejected.append((resource.id, WRONG_SUBJECT))
        elif not applicable_at(resource, decision_time):
            rejected.append((resource.id, NOT_APPLICABLE))
        elif is_stale(resource, contract, decision_time):
            rejected.append((resource.id, STALE))
        else:
            props = typed_propositions(resource, contract)
            # Under an EVSI contract an observation model also makes a source usable (it may
            # inform belief without being accepted to establish a proposition).
            if props or resource.evidence_class in (contract.observations or {}):
                typed.append((resource, props))
            else:
                rejected.append((resource.id, WRONG_EVIDENCE_CLASS))
    return Admission(tuple(typed), tuple(sorted(rejected)), tuple(sorted(withheld)), sum(verdict.errors))
