"""Judging one run against its frozen label, and the 003 metrics with their fixed denominators."""

from __future__ import annotations

from typing import Sequence

from bench.quality.fixtures import Doc, Query

MAX_RETRIEVAL_STEPS = 2
# Protocol constants of the 003 seed: work units and cost milliunits per trace event (synthetic, not time or money).
WORK = {"route": 1, "retrieve": 3, "assess": 1, "rewrite": 1, "decide": 1, "scope_guard": 1}
WORK_PER_CANDIDATE = 1
COST_MILLI = {"route": 100, "retrieve": 500, "assess": 100, "rewrite": 150, "decide": 150, "scope_guard": 100}
COST_MILLI_PER_CANDIDATE = 50


def charges(events: Sequence[dict]) -> tuple[int, int]:
    """(latency work units, cost milliunits) of a trace."""
    work = sum(WORK[e["kind"]] + WORK_PER_CANDIDATE * e.get("candidates", 0) for e in events)
    cost = sum(COST_MILLI[e["kind"]] + COST_MILLI_PER_CANDIDATE * e.get("candidates", 0) for e in events)
    return work, cost


def judge(query: Query, run: dict, docs: dict[str, Doc]) -> dict:
    """Accepted only when the decision type, the exact fact set, the ACL and the step budget all hold."""
    # Every channel a caller reads: what was retrieved, and whatever else the run found in plan and receipt.
    leaked = sorted({i for i in run["retrieved"] if i not in docs or docs[i].tenant != query.tenant}
                    | set(run.get("leaks", ())))
    failures = []
    if leaked:
        failures.append("acl-leakage")           # a hard failure that no other figure can offset
    if run["decision"] != query.expected:
        failures.append("false-abstain" if query.expected == "answer" else "false-answer")
    elif query.expected == "answer" and sorted(run["facts"]) != sorted(query.expected_facts):
        failures.append("answer-content-mismatch")
    if run["retrieval_steps"] > MAX_RETRIEVAL_STEPS:
        failures.append("retrieval-budget")
    work, cost = charges(run["events"])
    return {"accepted": not failures, "failures": failures, "acl_leaks": len(leaked),
            "relevant_retrieved": sorted(set(query.relevant) & set(run["retrieved"])),
            "work_units": work, "cost_milliunits": cost}


def metrics(queries: Sequence[Query], runs: Sequence[dict], verdicts: Sequence[dict], routes: bool) -> dict:
    """The seed's figures; denominators never shrink for failures, abstentions or blocks."""
    n = len(queries)
    answerable = [i for i, q in enumerate(queries) if q.expected == "answer"]
    relevant_total = sum(len(queries[i].relevant) for i in answerable)
    relevant_hit = sum(len(verdicts[i]["relevant_retrieved"]) for i in answerable)
    complete = sum(len(verdicts[i]["relevant_retrieved"]) == len(queries[i].relevant) for i in answerable)
    abstained = [i for i, r in enumerate(runs) if r["decision"] == "abstain"]
    should = [i for i, q in enumerate(queries) if q.expected == "abstain"]
    routed = [i for i, q in enumerate(queries) if q.expected_route is not None]
    accepted = sum(v["accepted"] for v in verdicts)
    leaks = sum(v["acl_leaks"] > 0 for v in verdicts)
    steps = [r["retrieval_steps"] for r in runs]
    work = sum(v["work_units"] for v in verdicts)
    cost = sum(v["cost_milliunits"] for v in verdicts) / 1000
    correct_abstain = sum(queries[i].expected == "abstain" for i in abstained)
    return {
        "answer_decision_accuracy": _r(accepted / n), "accepted": accepted, "queries": n,
        "relevant_micro_recall": _ratio(relevant_hit, relevant_total), "relevant_retrieved": relevant_hit,
        "relevant_expected": relevant_total,
        "answerable_query_recall": _ratio(complete, len(answerable)), "answerable_complete": complete,
        "route_accuracy": _ratio(sum(runs[i]["route"] == queries[i].expected_route for i in routed), len(routed))
        if routes else None,
        "acl_leakage_queries": leaks, "acl_leakage_rate": _r(leaks / n), "hard_failure": leaks > 0,
        "mean_retrieval_steps": _r(sum(steps) / n), "max_retrieval_steps": max(steps),
        "mean_latency_work_units": _r(work / n), "total_latency_work_units": work,
        "total_cost_units": _r(cost), "unit_accepted_cost": _ratio(cost, accepted),
        "abstentions": len(abstained),
        "abstention_precision": _ratio(correct_abstain, len(abstained)),
        "abstention_recall": _ratio(sum(runs[i]["decision"] == "abstain" for i in should), len(should)),
        "answer_abstain_type_accuracy": _r(sum(r["decision"] == q.expected for q, r in zip(queries, runs,
                                                                                           strict=True)) / n),
    }


def _r(x: float) -> float:
    return round(x, 6)


def _ratio(part: float, whole: float) -> float | None:
    """None when nothing is in the denominator: never 0, infinity or a quietly changed denominator."""
    return round(part / whole, 6) if whole else None
