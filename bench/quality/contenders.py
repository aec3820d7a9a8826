"""The two lexical contenders of the 003 protocol: plain top-k without ACL, and fixed one-shot with ACL first."""

from __future__ import annotations

from typing import Sequence

from bench.quality.fixtures import Doc, Query
from bench.quality.lexical import SUPPORT_THRESHOLD, out_of_scope, rank, route


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


def fixed_one_shot(query: Query, docs: Sequence[Doc]) -> dict:
    """Route once, stop on another tenant's name, filter by tenant, retrieve once, decide once."""
    chosen = route(query.text)
    events = [event("route", query=query.text, route=chosen)]
    foreign = out_of_scope(query.text, query.tenant)
    if foreign:
        # The trace says that a scope stop happened, not which tenant triggered it.
        events += [event("scope_guard", stop="tenant-scope-mismatch"), event("decide", outcome="abstain")]
        return {"decision": "abstain", "facts": [], "retrieved": [], "route": chosen, "retrieval_steps": 0,
                "stop_reason": "tenant-scope-mismatch", "events": events}
    allowed = [d for d in docs if d.tenant == query.tenant]          # the ACL gate comes before any scoring
    pool = [d for d in allowed if chosen is None or d.route == chosen]
    ranked = rank(query.text, pool)
    events.append(event("retrieve", step=1, query=query.text, route=chosen, candidates=len(ranked),
                        ranking=[[d.id, s] for d, s in ranked]))
    return _decide(ranked, events, route_taken=chosen, steps=1)


def _decide(ranked: list[tuple[Doc, int]], events: list[dict], route_taken: str | None, steps: int) -> dict:
    top = ranked[0][1] if ranked else 0
    supported = top >= SUPPORT_THRESHOLD
    events.append(event("assess", top_score=top, supported=supported))
    decision = "answer" if supported else "abstain"
    events.append(event("decide", outcome=decision))
    return {"decision": decision, "facts": sorted(ranked[0][0].facts) if supported else [],
            "retrieved": [d.id for d, _ in ranked], "route": route_taken, "retrieval_steps": steps,
            "stop_reason": "support-sufficient" if supported else "weak-support", "events": events}
