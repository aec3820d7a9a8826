"""Pass 5, plan: coverage-first greedy selection under the hard budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from compiler.request import Budget
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
    tokens: int
    """Tokens spent."""
    budget_hit: bool
    """Whether a useful item was left out because a limit would be exceeded."""


def _group(resource: Resource) -> str:
    # A resource without a provenance group is its own independent source.
    return resource.provenance_group or f"resource:{resource.id}"


def select(typed: Sequence[tuple[Resource, frozenset[str]]], relevance: dict[str, float],
           contract: Contract, budget: Budget) -> Selection:
    """Pick items that cover the most unmet propositions first, then by relevance, fewer tokens."""
    need = {p.id: p.min_independent for p in contract.propositions}
    groups: dict[str, set[str]] = {p: set() for p in need}
    remaining = list(typed)
    admitted: list[Resource] = []
    skipped: list[tuple[str, str]] = []
    tokens = 0
    budget_hit = False

    def gain(item: tuple[Resource, frozenset[str]]) -> set[str]:
        resource, props = item
        return {p for p in props if len(groups[p]) < need[p] and _group(resource) not in groups[p]}

    while remaining:
        remaining.sort(key=lambda it: (-len(gain(it)), -relevance.get(it[0].id, 0.0),
                                       it[0].tokens, it[0].id))
        resource, props = remaining.pop(0)
        covered = gain((resource, props))
        if not covered:
            remaining.insert(0, (resource, props))
            break
        over_tokens = budget.tokens is not None and tokens + resource.tokens > budget.tokens
        over_calls = budget.calls is not None and len(admitted) + 1 > budget.calls
        if over_tokens or over_calls:
            skipped.append((resource.id, BUDGET_EXCEEDED))
            budget_hit = True
            continue
        admitted.append(resource)
        tokens += resource.tokens
        for p in covered:
            groups[p].add(_group(resource))
    skipped.extend((r.id, NOT_NEEDED) for r, _ in remaining)
    return Selection(tuple(admitted), tuple(sorted(skipped)), tokens, budget_hit)
