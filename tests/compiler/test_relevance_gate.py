"""Relevance is part of support: a question no evidence speaks to abstains, and the trace names only usable items."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import orjson

from compiler.pipeline import compile_request
from tests.catalog_double import MemoryCatalog
from tests.conftest import ATLAS_REQUEST

NOW = datetime(2026, 8, 30, 9, tzinfo=timezone.utc)
TYPE = "credit.review.continuation"


def with_contract(**changes) -> MemoryCatalog:
    catalog = MemoryCatalog.from_scenario("atlas.jsonl")
    contract, policy = catalog.contracts[TYPE]
    catalog.contracts[TYPE] = (replace(contract, **changes), policy)
    return catalog


def test_a_question_no_evidence_speaks_to_abstains_with_every_slot_unknown():
    plan = compile_request(dict(ATLAS_REQUEST, query="Does the company pay for pet dental insurance?"),
                           MemoryCatalog.from_scenario("atlas.jsonl"), NOW).plan
    assert plan["state"] == "INSUFFICIENT" and plan["stop_reason"] == "no_relevant_evidence"
    assert plan["admitted"] == [] and {s["state"] for s in plan["slots"]} == {"unknown"}
    assert {r["resource_id"] for r in plan["rejected"] if r["reason"] == "not_relevant"} == {
        "facility-F102", "policy-P3", "workflow-E88"}


def test_without_a_question_or_with_a_relevant_one_the_seed_outcome_stands():
    catalog = MemoryCatalog.from_scenario("atlas.jsonl")
    asked = compile_request(ATLAS_REQUEST, catalog, NOW).plan
    silent = compile_request(dict(ATLAS_REQUEST, query=""), catalog, NOW).plan
    for plan in (asked, silent):
        assert {a["resource_id"] for a in plan["admitted"]} == {"facility-F102", "workflow-E88", "policy-P3"}


def test_a_catalogue_threshold_keeps_each_item_to_its_own_relevance():
    # Two of the admitted three share words with the question; the workflow event shares none.
    plan = compile_request(ATLAS_REQUEST, with_contract(min_relevance=0.5), NOW).plan
    assert {a["resource_id"] for a in plan["admitted"]} == {"facility-F102", "policy-P3"}
    assert {"resource_id": "workflow-E88", "reason": "not_relevant"} in plan["rejected"]
    assert plan["state"] == "INSUFFICIENT"
    high = compile_request(ATLAS_REQUEST, with_contract(min_relevance=50.0), NOW).plan
    assert high["stop_reason"] == "no_relevant_evidence" and high["admitted"] == []


def test_the_trace_reaches_plan_and_receipt_without_withheld_ids():
    compiled = compile_request(ATLAS_REQUEST, with_contract(controller={"min_coverage": 0.2}), NOW)
    plan, receipt = compiled.plan, compiled.receipt
    assert plan["retrieval"] == receipt["retrieval"] and plan["retrieval"]["stop"] == "support_sufficient"
    ranked = {r["resource_id"] for e in plan["retrieval"]["trace"] for r in e.get("ranking", [])}
    assert ranked and ranked <= {"facility-F102", "policy-P3", "rm-note-N7", "workflow-E88", "boreal-facility-F7"}
    assert "investigation-X9" not in orjson.dumps(plan).decode()


def test_a_document_near_the_question_but_covering_little_of_it_does_not_answer_it():
    # The Atlas question has eight topic terms; no single candidate covers half of them.
    plan = compile_request(ATLAS_REQUEST, with_contract(controller={}), NOW).plan
    assert plan["stop_reason"] == "no_relevant_evidence" and plan["retrieval"]["stop"] == "no_rewrite"
    assess = next(e for e in plan["retrieval"]["trace"] if e["step"] == "assess")
    assert assess["min_coverage"] == 0.5 and max(assess["coverage"].values()) < 0.5


def test_a_request_about_an_entity_outside_the_principals_scope_stops_before_retrieval():
    from bench.quality.fixtures import load_corpus
    from bench.quality.freshplan_run import CorpusCatalog, request_of

    corpus = load_corpus("policies")
    catalog = CorpusCatalog(corpus)
    q = next(q for q in corpus.queries if q.id == "q02-boreal-meal")
    own = compile_request(request_of(q), catalog, None).plan
    assert own["state"] == "SUFFICIENT"
    foreign = compile_request(dict(request_of(q), principal="analyst-atlas"), catalog, None)
    plan = foreign.plan
    assert plan["stop_reason"] == "out_of_scope" and plan["withheld"] == 0 and plan["admitted"] == []
    assert plan["rejected"] == [] and plan["retrieval"]["trace"] == []
    assert "boreal-" not in orjson.dumps([plan, foreign.receipt]).decode()
    assert "principal:analyst-atlas" in foreign.dependencies     # a new tenant attribute recompiles it
    unknown = compile_request(dict(request_of(q), principal="nobody"), catalog, None).plan
    assert unknown["stop_reason"] == "out_of_scope" and unknown["withheld"] == 0
