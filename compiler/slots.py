"""Evidence slots and the plan's overall state and stop reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from schemas.records import Contract, Resource

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

    def as_dict(self) -> dict:
        """Wire shape of the slot."""
        return {"proposition": self.proposition, "state": self.state,
                "resource_ids": list(self.resource_ids), "reason": self.reason,
                "required": self.required}


def fill_slots(admitted: Sequence[Resource], contract: Contract) -> tuple[Slot, ...]:
    """One slot per proposition from admitted, correctly typed evidence."""
    slots = []
    for prop in contract.propositions:
        typed = [r for r in admitted if r.evidence_class in prop.accepted_classes]
        support = [r for r in typed if prop.id in r.supports]
        refute = [r for r in typed if prop.id in r.contradicts]
        groups = {r.provenance_group or r.id for r in support}
        ids = tuple(r.id for r in support + refute)
        if refute:
            reason = "admitted sources disagree" if support else "admitted evidence contradicts it"
            slots.append(Slot(prop.id, CONTRADICTED, ids, reason, prop.required))
        elif len(groups) >= prop.min_independent:
            slots.append(Slot(prop.id, SUPPORTED, ids, "supported by an accepted evidence class",
                              prop.required))
        elif support:
            slots.append(Slot(prop.id, UNKNOWN, ids, f"{len(groups)} of {prop.min_independent} "
                              "independent provenance groups", prop.required))
        else:
            slots.append(Slot(prop.id, UNKNOWN, (), "no admitted resource satisfies the evidence "
                              "contract", prop.required))
    return tuple(slots)


def overall_state(slots: Sequence[Slot], withheld: Sequence[Resource], contract: Contract) -> str:
    """SUFFICIENT, CONFLICT, ENTITLEMENT_BLOCK (evidence exists but may not be used) or INSUFFICIENT."""
    required = [s for s in slots if s.required]
    if any(s.state == CONTRADICTED for s in required):
        return "CONFLICT"
    if all(s.state == SUPPORTED for s in required):
        return "SUFFICIENT"
    gaps = {s.proposition for s in required if s.state == UNKNOWN}
    accepted = {p.id: set(p.accepted_classes) for p in contract.propositions}
    for resource in withheld:
        if any(p in gaps and resource.evidence_class in accepted[p] for p in resource.supports):
            return "ENTITLEMENT_BLOCK"
    return "INSUFFICIENT"


def stop_reason(slots: Sequence[Slot], budget_hit: bool) -> str:
    """Why selection stopped: satisfied, out of budget, or a gap a human must resolve."""
    if all(s.state != UNKNOWN for s in slots if s.required):
        return "contract_satisfied"
    return "budget_exhausted" if budget_hit else "escalate"
