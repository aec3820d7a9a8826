"""The 003 evaluation: plain top-k, fixed one-shot and the adaptive controller, on two corpora written apart."""

from __future__ import annotations

import hashlib

import orjson

from bench.quality.contenders import plain_top_k
from bench.quality.fixtures import Corpus, load_corpus
from bench.quality.freshplan_run import MIN_RELEVANCE, MODES, CorpusCatalog, freshplan
from bench.quality.judge import COST_MILLI, MAX_RETRIEVAL_STEPS, WORK, judge, metrics

CONTENDERS = ("plain_top_k", *MODES)
CORPUS_NAMES = ("policies", "clinics")
# The 003 seed's own published results (its 2026-07-15 artefact, sha256 7ea15ce2...), for side-by-side
# reading only: they come from the seed's corpus and its controller, not from this run.
SEED_FIGURES = {
    "fixed_one_shot": {"answer_decision_accuracy": 0.625, "accepted": 15, "relevant_micro_recall": 0.736842,
                       "relevant_retrieved": 14, "answerable_query_recall": 0.722222, "route_accuracy": 0.956522,
                       "acl_leakage_queries": 0, "mean_retrieval_steps": 0.958333, "max_retrieval_steps": 1,
                       "mean_latency_work_units": 7.791667, "total_latency_work_units": 187,
                       "total_cost_units": 21.05, "unit_accepted_cost": 1.403333, "abstentions": 10,
                       "abstention_precision": 0.4, "abstention_recall": 0.666667,
                       "answer_abstain_type_accuracy": 0.666667},
    "adaptive_stateful": {"answer_decision_accuracy": 0.875, "accepted": 21, "relevant_micro_recall": 0.947368,
                          "relevant_retrieved": 18, "answerable_query_recall": 0.944444,
                          "route_accuracy": 0.956522, "acl_leakage_queries": 0, "mean_retrieval_steps": 1.208333,
                          "max_retrieval_steps": 2, "mean_latency_work_units": 10.916667,
                          "total_latency_work_units": 262, "total_cost_units": 29.65,
                          "unit_accepted_cost": 1.411905, "abstentions": 4, "abstention_precision": 1.0,
                          "abstention_recall": 0.666667, "answer_abstain_type_accuracy": 0.916667},
}
ENVELOPE = ("captured_at", "environment", "payload_sha256")


def evaluate_corpus(corpus: Corpus) -> dict:
    """Every contender on every query of one corpus: protocol, metrics, losses and traces."""
    docs, queries = corpus.docs, corpus.queries
    by_id = {d.id: d for d in docs}
    catalogs = {mode: CorpusCatalog(corpus, mode) for mode in MODES}
    runners = {"plain_top_k": lambda q: plain_top_k(q, docs),
               **{mode: (lambda q, m=mode: freshplan(q, corpus, catalogs[m])) for mode in MODES}}
    runs = {name: [run(q) for q in queries] for name, run in runners.items()}
    verdicts = {name: [judge(q, r, by_id) for q, r in zip(queries, runs[name], strict=True)] for name in runs}
    results = {name: metrics(queries, runs[name], verdicts[name], routes=name != "plain_top_k")
               for name in CONTENDERS}
    traces = [{"query": q.id, "tenant": q.tenant, "expected": q.expected, "expected_facts": list(q.expected_facts),
               **{name: dict(runs[name][i], **verdicts[name][i]) for name in CONTENDERS}}
              for i, q in enumerate(queries)]
    protocol = {"seed": "003", "corpus": corpus.name, "documents": len(docs), "tenants": len(corpus.tenants),
                "queries": len(queries), "expected_abstain": sum(q.expected == "abstain" for q in queries),
                "relevant_expected": sum(len(q.relevant) for q in queries if q.expected == "answer"),
                "min_relevance": MIN_RELEVANCE, "max_retrieval_steps": MAX_RETRIEVAL_STEPS, "work_units": WORK,
                "cost_milliunits": COST_MILLI, "fixtures_sha256": corpus.digest}
    return {"protocol": protocol, "metrics": results, "losses": losses(traces), "traces": traces}


def evaluate() -> dict:
    """The deterministic payload (no times, paths or machine): the first corpus at top level, both under corpora."""
    corpora = {name: evaluate_corpus(load_corpus(name)) for name in CORPUS_NAMES}
    first = corpora[CORPUS_NAMES[0]]
    return {**first, "seed_figures": SEED_FIGURES,
            "corpora": {n: c for n, c in corpora.items() if n != CORPUS_NAMES[0]}}


def losses(traces: list[dict]) -> list[dict]:
    """Each query the adaptive controller gets wrong, with its failure and what the compiler reported."""
    return [{"query": t["query"], "expected": t["expected"], "decision": t["adaptive"]["decision"],
             "failures": t["adaptive"]["failures"], "state": t["adaptive"].get("state"),
             "stop_reason": t["adaptive"]["stop_reason"], "controller_stop": t["adaptive"].get("controller_stop")}
            for t in traces if not t["adaptive"]["accepted"]]


def payload_hash(doc: dict) -> str:
    """SHA-256 of the payload without its envelope (capture time, environment, the hash itself)."""
    body = {k: v for k, v in doc.items() if k not in ENVELOPE}
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def document(captured_at: str, env: dict) -> dict:
    """The replayable result file: the payload, its hash, and the envelope the hash leaves out."""
    body = evaluate()
    return {"captured_at": captured_at, "environment": env, "payload_sha256": payload_hash(body), **body}
