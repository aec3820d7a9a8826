"""The visible cost vector of using a resource: hard limits first, then a declared penalty."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from compiler.request import Budget
from schemas.records import Resource

DIMENSIONS = ("calls", "tokens", "latency_ms", "privacy", "money")


@dataclass(frozen=True, slots=True)
class Cost:
    """What one observation spends, per budget dimension."""

    calls: float = 0
    """Retrieval calls."""
    tokens: float = 0
    """Context tokens."""
    latency_ms: float = 0
    """Expected latency."""
    privacy: float = 0
    """Privacy exposure points."""
    money: float = 0
    """Monetary cost."""

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(*(getattr(self, d) + getattr(other, d) for d in DIMENSIONS))

    def as_dict(self) -> dict[str, float]:
        """Non-zero dimensions, rounded for display."""
        return {d: round(getattr(self, d), 6) for d in DIMENSIONS if getattr(self, d)}


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def cost_of(resource: Resource) -> Cost:
    """One call, the resource's tokens, and any declared latency, privacy and money costs."""
    attrs = resource.attributes
    return Cost(calls=1, tokens=resource.tokens, latency_ms=_number(attrs.get("latency_ms")),
                privacy=_number(attrs.get("privacy_points")), money=_number(attrs.get("money")))


def fits(spent: Cost, extra: Cost, budget: Budget) -> bool:
    """True when adding `extra` keeps every limited dimension within the budget."""
    for d in DIMENSIONS:
        limit = getattr(budget, d)
        if limit is not None and getattr(spent, d) + getattr(extra, d) > limit + 1e-9:
            return False
    return True


def penalty(cost: Cost, weights: Mapping[str, float]) -> float:
    """The declared scalar penalty of a cost: a weighted sum, visible in the plan."""
    return sum(_number(weights.get(d)) * getattr(cost, d) for d in DIMENSIONS)
