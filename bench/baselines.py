"""What a team would otherwise build: plain top-k and post-filtered top-k, scored like the compiler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from schemas.records import Contract, Resource

SAFE_SKIPS = {"budget_exceeded", "not_needed_for_contract", "not_worth_it"}


@dataclass(frozen=True)
class Outcome:
    """How a retrieval order did against the decision's contract."""

    items_passed: int
    """Items handed to the model."""
    unsafe_items: int
    """Items outside the admissible universe (forbidden, inapplicable, wrong subject or class)."""
    coverage_percent: int
    """Share of the contract's propositions that some passed item speaks to."""

    def as_dict(self) -> dict[str, int]:
        """Plain dict for reports."""
        return {"items_passed": self.items_passed, "unsafe_items": self.unsafe_items,
                "coverage_percent": self.coverage_percent}


def admissible_ids(plan: dict) -> set[str]:
    """Resources the compiler found admissible for this request (used or merely not needed)."""
    return ({a["resource_id"] for a in plan["admitted"]}
            | {r["resource_id"] for r in plan["rejected"] if r["reason"] in SAFE_SKIPS})


def score(items: Sequence[Resource], contract: Contract, safe: set[str]) -> Outcome:
    """Items passed, unsafe items, and proposition coverage of a retrieval result."""
    props = {p.id for p in contract.propositions}
    covered = set().union(*(set(r.supports) | set(r.contradicts) for r in items)) & props if items else set()
    unsafe = sum(r.id not in safe for r in items)
    return Outcome(len(items), unsafe, round(100 * len(covered) / len(props)))


def plain_top_k(corpus: Sequence[Resource], relevance: dict[str, float], k: int) -> list[Resource]:
    """The k most relevant items, whoever asks."""
    return sorted(corpus, key=lambda r: (-relevance[r.id], r.id))[:k]


def post_filtered_top_k(corpus: Sequence[Resource], relevance: dict[str, float], k: int,
                        safe: set[str]) -> list[Resource]:
    """Top-k first, then drop what the request may not use: safe, but recall is lost."""
    return [r for r in plain_top_k(corpus, relevance, k) if r.id in safe]
