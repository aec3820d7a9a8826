"""The 002 seed's synthetic benchmark: contaminated top-k against compiling before ranking."""

from __future__ import annotations

from datetime import datetime, timezone

from bench.baselines import admissible_ids, plain_top_k, post_filtered_top_k, score
from compiler.pipeline import compile_request
from tests.catalog_double import MemoryCatalog

REQUEST = {"decision_type": "credit.review.topk", "principal": "topk-analyst",
           "purpose": "annual_credit_review", "entity": "TOPK-ATLAS-01",
           "decision_time": "2026-08-30T00:00:00Z", "budget": {"tokens": 1000}}


def test_synthetic_benchmark_matches_the_seed():
    catalog = MemoryCatalog.from_scenario("synthetic-topk.jsonl")
    plan = compile_request(REQUEST, catalog, datetime(2026, 8, 30, tzinfo=timezone.utc))
    contract, _ = catalog.contract("credit.review.topk")
    corpus = list(catalog.resources.values())
    relevance = {r.id: r.attributes["relevance"] for r in corpus}
    safe = admissible_ids(plan.plan)
    compiled = [catalog.resources[a["resource_id"]] for a in plan.plan["admitted"]]

    assert score(plain_top_k(corpus, relevance, 5), contract, safe).as_dict() == {
        "items_passed": 5, "unsafe_items": 4, "coverage_percent": 75}
    assert score(post_filtered_top_k(corpus, relevance, 5, safe), contract, safe).as_dict() == {
        "items_passed": 1, "unsafe_items": 0, "coverage_percent": 25}
    assert score(compiled, contract, safe).as_dict() == {
        "items_passed": 4, "unsafe_items": 0, "coverage_percent": 100}
