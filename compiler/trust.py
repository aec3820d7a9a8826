"""Source trust: which provenance groups may assert the evidence classes a contract treats as authoritative."""

from __future__ import annotations

from typing import Mapping

from schemas.records import Contract, PolicyBundle

Trust = Mapping[str, frozenset[str]]  # evidence class -> provenance groups that may assert it


def authoritative_classes(contract: Contract) -> frozenset[str]:
    """Classes some proposition accepts as its one authoritative source (`min_independent` 1).

    One such item settles the proposition alone, so a forged label would decide it; where a
    proposition needs several independent groups, independence is the defence instead.
    """
    return frozenset(c for p in contract.propositions if p.min_independent <= 1 for c in p.accepted_classes)


def bundle_trust(bundle: PolicyBundle) -> Trust | None:
    """The groups the bundle's `sources` name for each class; None when the bundle opts out."""
    if not bundle.source_trust:
        return None
    out: dict[str, set[str]] = {}
    for group, classes in bundle.sources.items():
        for cls in classes:
            out.setdefault(cls, set()).add(group)
    return {cls: frozenset(groups) for cls, groups in out.items()}


def rules_for(contract: Contract, own: Trust | None, named: Trust) -> Trust:
    """The trust a plan of this contract applies.

    `own` is the governing bundle version's rules (None: it opted out); `named` is every
    bundle's rules, which restrict any class they list, as they always did. An authoritative
    class takes only its own bundle's groups: none named means no group may assert it.
    """
    if own is None:
        return named
    rules = dict(named)
    for cls in authoritative_classes(contract):
        rules[cls] = own.get(cls, frozenset())
    return rules


def unsourced(bundle: PolicyBundle) -> dict[str, tuple[str, ...]]:
    """Per decision type, the authoritative classes no rule of the bundle names (what a load warns of)."""
    own = bundle_trust(bundle)
    if own is None:
        return {}
    out = {}
    for contract in bundle.contracts:
        missing = sorted(authoritative_classes(contract) - set(own))
        if missing:
            out[contract.decision_type] = tuple(missing)
    return out
