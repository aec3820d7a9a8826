"""Pass 4, admit: Cedar first, then source trust, applicability, freshness and typing, with reason classes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Mapping, Sequence

from compiler.policy import Authorisation, CompiledPolicy, authorise
from compiler.slots import group_of
from schemas.records import Contract, Principal, Resource

# Precedence is the order of checks: an item the principal may not use is never
# described by any other reason, so the caller cannot learn it exists.
NOT_AUTHORISED = "not_authorised"
UNTRUSTED_SOURCE = "untrusted_source"
WRONG_SUBJECT = "wrong_subject"
NOT_APPLICABLE = "not_applicable"
STALE = "stale"
WRONG_EVIDENCE_CLASS = "wrong_evidence_class"

Typed = tuple[tuple[Resource, frozenset[str]], ...]


@dataclass(frozen=True)
class Admission:
    """The admitted universe of one request and what was kept out, with why."""

    typed: Typed
    """Admissible resources with the propositions each may (freshly) establish or refute."""
    rejected: tuple[tuple[str, str], ...]
    """(resource id, reason class) for permitted but unusable resources."""
    withheld: tuple[str, ...]
    """Ids Cedar denied; counted to the caller, named only in the receipt."""
    policy_errors: int = 0
    """Candidates withheld because some policy failed to evaluate for them (errors deny)."""
    withheld_typed: Typed = ()
    """Withheld resources that every other gate would have admitted, with their propositions."""


def applicable_at(resource: Resource, when: datetime) -> bool:
    """Whether the resource is in force at `when` and not superseded."""
    if resource.superseded_by:
        return False
    if resource.valid_from is not None and when < resource.valid_from:
        return False
    return resource.valid_to is None or when <= resource.valid_to


def aged_from(resource: Resource) -> datetime | None:
    """The instant a resource's age counts from: when its fact was last confirmed.

    Rows stored before `observed_at` existed fall back to `valid_from`, as they always did.
    """
    return resource.observed_at or resource.valid_from


def typed_propositions(resource: Resource, contract: Contract) -> frozenset[str]:
    """Propositions of the contract this resource's evidence class may speak to."""
    claims = set(resource.supports) | set(resource.contradicts)
    return frozenset(p.id for p in contract.propositions
                     if p.id in claims and resource.evidence_class in p.accepted_classes)


def fresh_propositions(resource: Resource, contract: Contract, when: datetime,
                       typed: frozenset[str] | None = None) -> frozenset[str]:
    """The typed propositions whose own `max_age` the resource's age does not exceed (`typed`: if known)."""
    typed = typed_propositions(resource, contract) if typed is None else typed
    since = aged_from(resource)
    if since is None:
        return typed
    return frozenset(p.id for p in contract.propositions
                     if p.id in typed and (p.max_age is None or when - since <= p.max_age))


def is_stale(resource: Resource, contract: Contract, when: datetime) -> bool:
    """True when the resource could speak to some proposition but is too old for every one of them."""
    return bool(typed_propositions(resource, contract)) and not fresh_propositions(resource, contract, when)


def untrusted(resource: Resource, trusted: Mapping[str, frozenset[str]]) -> bool:
    """A class some source rule reserves to named provenance groups, asserted by another group.

    A source cannot promote itself into a trusted class by labelling its own items (004 seed).
    """
    groups = trusted.get(resource.evidence_class)
    return groups is not None and group_of(resource) not in groups


def _gate(resource: Resource, entity_id: str, contract: Contract, when: datetime,
          trusted: Mapping[str, frozenset[str]]) -> str | frozenset[str]:
    """The reason class that keeps a permitted resource out, or the propositions it may serve."""
    if untrusted(resource, trusted):
        return UNTRUSTED_SOURCE
    if resource.entity != entity_id:
        return WRONG_SUBJECT
    if not applicable_at(resource, when):
        return NOT_APPLICABLE
    # As `is_stale`, with the typed and fresh propositions worked out once.
    typed = typed_propositions(resource, contract)
    props = fresh_propositions(resource, contract, when, typed)
    if typed and not props:
        return STALE
    # Under an EVSI contract an observation model also makes a source usable (it may
    # inform belief without being accepted to establish a proposition).
    if props or resource.evidence_class in (contract.observations or {}):
        return props
    return WRONG_EVIDENCE_CLASS


def admit(candidates: Sequence[Resource], *, entity_id: str, principal: Principal,
          contract: Contract, policy: CompiledPolicy, purpose: str,
          decision_time: datetime, trusted: Mapping[str, frozenset[str]] | None = None,
          known_principal: bool = True, verdict: Authorisation | None = None) -> Admission:
    """Validate every candidate: Cedar in one batch, then trust, subject, time, freshness, class.

    An unknown principal may use nothing: every candidate is withheld without asking Cedar.
    `verdict` is Cedar's answer already asked for these candidates (by a batch of requests).
    """
    if known_principal:
        if verdict is None:
            verdict = authorise(policy, principal, candidates, purpose=purpose,
                                decision_type=contract.decision_type, decision_time=decision_time)
        allowed, errors = verdict.allowed, sum(verdict.errors)
    else:
        allowed, errors = (False,) * len(candidates), 0
    typed: list[tuple[Resource, frozenset[str]]] = []
    withheld_typed: list[tuple[Resource, frozenset[str]]] = []
    rejected: list[tuple[str, str]] = []
    withheld: list[str] = []
    for resource, ok in zip(candidates, allowed, strict=True):
        outcome = _gate(resource, entity_id, contract, decision_time, trusted or {})
        if not ok:
            withheld.append(resource.id)
            if not isinstance(outcome, str):
                withheld_typed.append((resource, outcome))
        elif isinstance(outcome, str):
            rejected.append((resource.id, outcome))
        else:
            typed.append((resource, outcome))
    return Admission(tuple(typed), tuple(sorted(rejected)), tuple(sorted(withheld)), errors,
                     tuple(withheld_typed))
