"""Pass 5, plan: coverage-first greedy selection under the hard budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from compiler.costs import Cost, cost_of, fits
from compiler.request import Budget
from compiler.slots import aggregate, contribution, group_of, threshold_of
from schemas.records import Contract, Resource

BUDGET_EXCEEDED = "budget_exceeded"
NOT_NEEDED = "not_needed_for_contract"


@dataclass(frozen=True)
class Selection:
    """What the planner put into the context and what it left out for budget or need."""

    admitted: tuple[Resource, ...]
    """Selected resources, in selection order."""
    skipped: tuple[tuple[str, str], ...]
    """(resource id, budget_exceeded | not_needed_for_contract)."""
    spent: Cost
    """What the selection spends, per budget dimension."""
    budget_hit: bool
    """Whether a useful item was left out because a limit would be exceeded."""


def select(typed: Sequence[tuple[Resource, frozenset[str]]], relevance: dict[str, float],
           contract: Contract, budget: Budget) -> Selection:
    """Pick items that close the most open propositions first, then by relevance, fewer tokens.

    A proposition stays open until its noisy-or support reaches the threshold from enough
    independent provenance groups; refuting evidence from a new group is always kept.
    """
    props = {p.id: p for p in contract.propositions}
    chosen: dict[str, list[Resource]] = {p: [] for p in props}
    remaining = list(typed)
    admitted: list[Resource] = []
    skipped: list[tuple[str, str]] = []
    spent = Cost()
    budget_hit = False

    # `chosen` changes only between rounds, so within one round (a sort over every remaining
    # item, then the pick) each proposition's openness and seen groups are computed once.
    is_open: dict[str, bool] = {}
    seen_groups: dict[tuple[str, bool], set[str]] = {}

    def open_(p: str) -> bool:
        if p not in is_open:
            support, _, groups = aggregate(chosen[p], props[p])
            is_open[p] = support < threshold_of(props[p], contract) or groups < props[p].min_independent
        return is_open[p]

    # (id of a resource, proposition) -> its contribution; `typed` holds every resource throughout
    weights: dict[tuple[int, str], float] = {}

    def weight_of(resource: Resource, p: str) -> float:
        key = (id(resource), p)
        if key not in weights:
            weights[key] = contribution(resource, p)
        return weights[key]

    def seen(p: str, positive: bool) -> set[str]:
        key = (p, positive)
        if key not in seen_groups:
            seen_groups[key] = {group_of(r) for r in chosen[p] if (weight_of(r, p) > 0) == positive}
        return seen_groups[key]

    def gain(item: tuple[Resource, frozenset[str]]) -> set[str]:
        resource, claims = item
        out = set()
        for p in claims:
            weight = weight_of(resource, p)
            if weight == 0 or group_of(resource) in seen(p, weight > 0):
                continue
            if weight < 0 or open_(p):
                out.add(p)
        return out

    while remaining:
        is_open.clear()
        seen_groups.clear()
        remaining.sort(key=lambda it: (-len(gain(it)), -relevance.get(it[0].id, 0.0),
                                       it[0].tokens, it[0].id))
        resource, claims = remaining.pop(0)
        covered = gain((resource, claims))
        if not covered:
            remaining.insert(0, (resource, claims))
            break
        cost = cost_of(resource)
        if not fits(spent, cost, budget):
            skipped.append((resource.id, BUDGET_EXCEEDED))
            budget_hit = True
            continue
        admitted.append(resource)
        spent = spent + cost
        for p in covered:
            chosen[p].append(resource)
    skipped.extend((r.id, NOT_NEEDED) for r, _ in remaining)
    return Selection(tuple(admitted), tuple(sorted(skipped)), spent, budget_hit)
