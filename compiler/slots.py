"""Evidence slots by governed sufficiency: provenance groups, noisy-or, conflict, overall state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from schemas.records import Contract, Proposition, Resource

SUPPORTED, CONTRADICTED, UNKNOWN = "supported", "contradicted", "unknown"


@dataclass(frozen=True)
class Slot:
    """The evidential state of one proposition."""

    proposition: str
    """Proposition id."""
    state: str
    """supported, contradicted or unknown."""
    resource_ids: tuple[str, ...]
    """Admitted resources that speak to it."""
    reason: str
    """Why the slot is in this state, in words."""
    required: bool
    """Whether a gap blocks the decision."""
    support: float = 0.0
    """Noisy-or of the strongest support per provenance group."""
    refute: float = 0.0
    """Noisy-or of the strongest refutation per provenance group."""
    groups: int = 0
    """Independent provenance groups that support it."""
    conflict: bool = False
    """Strong support and strong refutation at once."""

    def as_dict(self) -> dict:
        """Wire shape of the slot."""
        return {"proposition": self.proposition, "state": self.state,
                "resource_ids": list(self.resource_ids), "reason": self.reason,
                "required": self.required, "support": round(self.support, 3),
                "refute": round(self.refute, 3), "independent_groups": self.groups,
                "conflict": self.conflict}


def group_of(resource: Resource) -> str:
    """The provenance group; a resource without one is its own independent source."""
    return resource.provenance_group or f"resource:{resource.id}"


def contribution(resource: Resource, proposition: str) -> float:
    """Signed weight in [-1, 1]: declared per claim, else the source's authority with the claim's sign."""
    declared = resource.attributes.get("contributions")
    if isinstance(declared, dict) and isinstance(declared.get(proposition), (int, float)):
        return max(-1.0, min(1.0, float(declared[proposition])))
    authority = resource.attributes.get("authority", 1.0)
    authority = float(authority) if isinstance(authority, (int, float)) else 1.0
    if proposition in resource.contradicts:
        return -authority
    return authority if proposition in resource.supports else 0.0


def noisy_or(weights: Sequence[float]) -> float:
    """Probability at least one independent source holds: 1 - prod(1 - w)."""
    miss = 1.0
    for w in weights:
        miss *= 1.0 - max(0.0, min(1.0, w))
    return 1.0 - miss


def threshold_of(prop: Proposition, contract: Contract) -> float:
    """The support a proposition needs."""
    return contract.threshold if prop.threshold is None else prop.threshold


def aggregate(resources: Sequence[Resource], prop: Proposition) -> tuple[float, float, int]:
    """(support, refutation, supporting groups) counting each provenance group once."""
    best_for: dict[str, float] = {}
    best_against: dict[str, float] = {}
    for r in resources:
        if r.evidence_class not in prop.accepted_classes:
            continue
        weight = contribution(r, prop.id)
        g = group_of(r)
        if weight > 0:
            best_for[g] = max(best_for.get(g, 0.0), weight)
        elif weight < 0:
            best_against[g] = max(best_against.get(g, 0.0), -weight)
    return noisy_or(list(best_for.values())), noisy_or(list(best_against.values())), len(best_for)


def _by_precedence(speaking: Sequence[Resource], prop: Proposition) -> str | None:
    """Which side the strongest-ranked evidence class takes, when the contract ranks classes."""
    if not prop.precedence:
        return None
    rank = {cls: i for i, cls in enumerate(prop.precedence)}
    worst = len(rank)
    best_for = min((rank.get(r.evidence_class, worst) for r in speaking if contribution(r, prop.id) > 0), default=worst)
    best_against = min((rank.get(r.evidence_class, worst) for r in speaking if contribution(r, prop.id) < 0),
                       default=worst)
    if best_for == best_against:
        return None
    return "support" if best_for < best_against else "refute"


def fill_slots(admitted: Sequence[Resource], contract: Contract,
               usable: Mapping[str, frozenset[str]] | None = None) -> tuple[Slot, ...]:
    """One slot per proposition from admitted, correctly typed evidence.

    `usable` (resource id -> propositions) keeps a resource out of the slots it is too old
    for: a `max_age` applies within its own proposition's slot only.
    """
    slots = []
    for prop in contract.propositions:
        speaking = [r for r in admitted if r.evidence_class in prop.accepted_classes
                    and contribution(r, prop.id) != 0
                    and (usable is None or prop.id in usable.get(r.id, frozenset()))]
        ids = tuple(r.id for r in speaking)
        support, refute, groups = aggregate(speaking, prop)
        need = threshold_of(prop, contract)
        common = dict(required=prop.required, support=support, refute=refute, groups=groups)
        winner = _by_precedence(speaking, prop) if min(support, refute) > contract.conflict_ceiling else None
        if winner == "support":
            slots.append(Slot(prop.id, SUPPORTED, ids, "sources disagree; the higher-precedence class supports it",
                              **common))
        elif winner == "refute":
            slots.append(Slot(prop.id, CONTRADICTED, ids, "sources disagree; the higher-precedence class refutes it",
                              **common))
        elif min(support, refute) > contract.conflict_ceiling:
            slots.append(Slot(prop.id, CONTRADICTED, ids, "admitted sources disagree strongly",
                              conflict=True, **common))
        elif refute >= need and refute > support:
            slots.append(Slot(prop.id, CONTRADICTED, ids, "admitted evidence refutes it", **common))
        elif support >= need and groups >= prop.min_independent:
            slots.append(Slot(prop.id, SUPPORTED, ids, "supported by an accepted evidence class", **common))
        elif speaking:
            slots.append(Slot(prop.id, UNKNOWN, ids, f"support {support:.2f} of {need:.2f} needed from "
                              f"{groups} of {prop.min_independent} independent provenance groups", **common))
        else:
            slots.append(Slot(prop.id, UNKNOWN, (), "no admitted resource satisfies the evidence contract",
                              **common))
    return tuple(slots)


def overall_state(slots: Sequence[Slot], withheld: Sequence[tuple[Resource, frozenset[str]]]) -> str:
    """ENTITLEMENT_BLOCK, then CONFLICT, then INSUFFICIENT, then SUFFICIENT (the 004 seed's order).

    `withheld` holds the items Cedar denied that every other gate would admit, with the
    propositions each may speak to. One the decision needs blocks it, whatever else holds:
    a refutation of a required proposition always (it could overturn the slot), support only
    of a required proposition not yet supported (a redundant copy changes nothing).
    """
    required = {s.proposition: s for s in slots if s.required}
    for resource, props in withheld:
        for p in props & set(required):
            weight = contribution(resource, p)
            if weight < 0 or (weight > 0 and required[p].state != SUPPORTED):
                return "ENTITLEMENT_BLOCK"
    if any(s.conflict for s in required.values()):
        return "CONFLICT"
    if all(s.state == SUPPORTED for s in required.values()):
        return "SUFFICIENT"
    return "INSUFFICIENT"


def stop_reason(slots: Sequence[Slot], budget_hit: bool) -> str:
    """Why selection stopped: satisfied, out of budget, or a gap a human must resolve."""
    if all(s.state != UNKNOWN and not s.conflict for s in slots if s.required):
        return "contract_satisfied"
    return "budget_exhausted" if budget_hit else "escalate"


def settled_stop(state: str, planner_stop: str) -> str:
    """The stop reason a state implies, whichever planner ran: the same words for coverage and EVSI plans.

    SUFFICIENT is a satisfied contract; CONFLICT and ENTITLEMENT_BLOCK need a person; only an
    INSUFFICIENT plan keeps the planner's own reason (budget, no positive value, a gap).
    """
    if state == "SUFFICIENT":
        return "contract_satisfied"
    if state in ("CONFLICT", "ENTITLEMENT_BLOCK"):
        return "escalate"
    return planner_stop
