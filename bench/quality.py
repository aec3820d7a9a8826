"""Selection quality on the multi-tenant corpus: top-k baselines against freshplan, with fixed denominators."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from agents.invalidation import Invalidator, RawMessage
from agents.query import QueryService
from bench.quality_corpus import DECISION, DECISION_EVSI, PURPOSE, Corpus, Doc, Query, generate
from compiler.relevance import bm25
from state.local_state import LocalState

TOP_K = 3
CONTENDERS = ("plain_top_k", "post_filtered_top_k", "freshplan_compiled", "freshplan_evsi")
# Synthetic cost units (method-internal comparison only): a retrieval call, and tokens handed to the model.
COST_PER_CALL = 0.1
COST_PER_1K_TOKENS = 1.0


def evaluate(seed: int = 3) -> dict:
    """Run every contender on every frozen query; a deterministic payload (no times, no paths)."""
    corpus = generate(seed)
    by_id = {d.id: d for d in corpus.docs}
    with tempfile.TemporaryDirectory(prefix="fpbench-quality-") as tmp:
        state = LocalState.open(Path(tmp) / "quality.duckdb")
        try:
            inv = Invalidator(state, lambda name: name)
            offsets: Counter[str] = Counter()
            messages = []
            for topic, key, value in corpus.events:
                messages.append(RawMessage(topic, 0, offsets[topic], key, value))
                offsets[topic] += 1
            inv.apply(messages)
            query_service = QueryService(state, inv)
            traces = [_trace(q, corpus, by_id, query_service) for q in corpus.queries]
        finally:
            state.close()
    return {"seed": seed, "corpus": {"documents": len(corpus.docs), "tenants": 3,
                                     "queries": len(corpus.queries),
                                     "expected_abstain": sum(q.expected == "abstain" for q in corpus.queries),
                                     "documents_by_kind": dict(sorted(Counter(d.kind for d in corpus.docs).items()))},
            "top_k": TOP_K, "metrics": {c: _metrics(c, traces) for c in CONTENDERS}, "traces": traces}


def _trace(q: Query, corpus: Corpus, by_id: dict[str, Doc], service: QueryService) -> dict:
    pool = sorted((d for d in corpus.docs if d.topic == q.topic), key=lambda d: d.id)
    scores = bm25(q.text, [f"{d.id} {d.content}" for d in pool])
    ranked = [d for _, d in sorted(zip(scores, pool, strict=True), key=lambda p: (-p[0], p[1].id))]
    plain = ranked[:TOP_K]
    filtered = [d for d in ranked[:TOP_K] if corpus.permitted(d, q.tenant)]
    out = {"query": q.id, "tenant": q.tenant, "expected": q.expected, "expected_facts": list(q.facts), "why": q.why,
           "budget_tokens": q.budget_tokens}
    out["plain_top_k"] = _naive(plain, q, corpus)
    out["post_filtered_top_k"] = _naive(filtered, q, corpus)
    for name, decision_type in (("freshplan_compiled", DECISION), ("freshplan_evsi", DECISION_EVSI)):
        plan = service.select({"decision_type": decision_type, "principal": f"analyst-{q.tenant}",
                               "purpose": PURPOSE, "entity": q.topic, "query": q.text,
                               "budget": {"tokens": q.budget_tokens}})
        passed = [by_id[a["resource_id"]] for a in plan["admitted"]]
        answer = plan["state"] == "SUFFICIENT"
        facts = sorted({d.fact for d in passed if "policy_fact" in d.supports and d.fact}) if answer else []
        out[name] = _judge(q, corpus, passed, "answer" if answer else "abstain", facts, calls=1,
                           state=plan["state"], stop=plan["stop_reason"])
    return out


def _naive(items: list[Doc], q: Query, corpus: Corpus) -> dict:
    """A model handed top-k answers with the best-ranked item that states the fact, else abstains."""
    stating = [d for d in items if "policy_fact" in d.supports and d.fact]
    decision = "answer" if stating else "abstain"
    return _judge(q, corpus, items, decision, [stating[0].fact] if stating else [], calls=1)


def _judge(q: Query, corpus: Corpus, passed: list[Doc], decision: str, facts: list[str], calls: int,
           **extra) -> dict:
    leaked = [d.id for d in passed if not corpus.permitted(d, q.tenant)]
    unsafe = [d.id for d in passed if not corpus.admissible(d, q.tenant)]
    tokens = sum(d.tokens for d in passed)
    covered = any(corpus.admissible(d, q.tenant) and "policy_fact" in d.supports for d in passed)
    within = tokens <= q.budget_tokens
    correct = (decision == q.expected and (decision == "abstain" or sorted(facts) == sorted(q.facts))
               and not leaked and within)
    return dict({"decision": decision, "facts": sorted(facts), "passed": [d.id for d in passed],
                 "acl_leaks": leaked, "unsafe": unsafe, "tokens": tokens, "within_budget": within,
                 "covers_required": covered, "accepted": correct,
                 "cost_units": round(calls * COST_PER_CALL + tokens / 1000 * COST_PER_1K_TOKENS, 4)}, **extra)


def _metrics(name: str, traces: list[dict]) -> dict:
    rows = [(t, t[name]) for t in traces]
    n = len(rows)
    answerable = [r for t, r in rows if t["expected"] == "answer"]
    abstained = [(t, r) for t, r in rows if r["decision"] == "abstain"]
    should = [(t, r) for t, r in rows if t["expected"] == "abstain"]
    accepted = sum(r["accepted"] for _, r in rows)
    leaks = sum(bool(r["acl_leaks"]) for _, r in rows)
    cost = round(sum(r["cost_units"] for _, r in rows), 4)
    correct_abstain = sum(t["expected"] == "abstain" for t, _ in abstained)
    return {
        "decision_accuracy": round(accepted / n, 6), "accepted": accepted, "queries": n,
        "acl_leakage_queries": leaks, "acl_hard_failure": leaks > 0,
        "unsafe_items_passed": sum(len(r["unsafe"]) for _, r in rows),
        "proposition_coverage": round(sum(r["covers_required"] for r in answerable) / len(answerable), 6),
        "abstention_precision": round(correct_abstain / len(abstained), 6) if abstained else None,
        "abstention_recall": round(sum(r["decision"] == "abstain" for _, r in should) / len(should), 6),
        "budget_compliance": round(sum(r["within_budget"] for _, r in rows) / n, 6),
        "cost_units": cost, "cost_per_accepted_decision": round(cost / accepted, 6) if accepted else None,
    }
