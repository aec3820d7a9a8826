"""The lexical negative control of the 003 protocol: plain top-k over every tenant, no scope guard, no ACL."""

from __future__ import annotations

from typing import Sequence

from bench.quality.fixtures import Doc, Query
from bench.quality.lexical import SUPPORT_THRESHOLD, rank


def event(kind: str, **fields) -> dict:
    """One trace event; its kind and candidate count are what work and cost are charged on."""
    return {"kind": kind, **fields}


def plain_top_k(query: Query, docs: Sequence[Doc]) -> dict:
    """Negative control: score every tenant's documents, take the top k, answer from the best.

    No scope guard and no ACL: whatever leaks is the point of running it.
    """
    ranked = rank(query.text, docs)
    events = [event("retrieve", step=1, query=query.text, route=None, candidates=len(ranked),
                    ranking=[[d.id, s] for d, s in ranked])]
    return _decide(ranked, events, route_taken=None, steps=1)


def _decide(ranked: list[tuple[Doc, int]], events: list[dict], route_taken: str | None, steps: int) -> dict:
    top = ranked[0][1] if ranked else 0
    supported = top >= SUPPORT_THRESHOLD
    events.append(event("assess", top_score=top, supported=supported))
    decision = "answer" if supported else "abstain"
    events.append(event("decide", outcome=decision))
    return {"decision": decision, "facts": sorted(ranked[0][0].facts) if supported else [],
            "retrieved": [d.id for d, _ in ranked], "route": route_taken, "retrieval_steps": steps,
            "stop_reason": "support-sufficient" if supported else "weak-support", "events": events}
