"""The 003 evaluation: fixed denominators, ACL leaks as hard failures, labels independent of freshplan, replay."""

from __future__ import annotations

import dataclasses

import orjson

from bench import quality
from bench.quality import contenders, freshplan_run
from bench.quality.fixtures import CORPUS_FILE, QUERIES_FILE, load_docs, load_queries
from bench.quality.judge import judge, metrics
from bench.report import write_json
from bench.suite import quality_payload


def test_the_result_file_replays_apart_from_capture_time_and_environment(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    write_json(first, quality_payload("2026-01-01T00:00:00Z", {"python": "x"}))
    write_json(second, quality_payload("2027-06-30T12:00:00Z", {"python": "y", "cpu_count": 64}))
    assert first.read_bytes() != second.read_bytes()   # the envelope differs ...
    docs = [orjson.loads(p.read_bytes()) for p in (first, second)]
    stripped = [{k: v for k, v in d.items() if k not in ("captured_at", "environment")} for d in docs]
    assert stripped[0] == stripped[1]                   # ... the payload, every trace included, does not
    assert docs[0]["payload_sha256"] == quality.payload_hash(docs[1]) == quality.payload_hash(stripped[0])
    assert len(docs[0]["traces"]) == 24 and docs[0]["seed_figures"]["fixed_one_shot"]["accepted"] == 15


def test_the_fixtures_follow_the_seed_and_the_metrics_keep_their_denominators():
    docs, queries = load_docs(), load_queries()
    assert len(docs) == 39 and {d.tenant for d in docs} == {"atlas", "boreal", "cinder"}
    assert sum(q.expected == "abstain" for q in queries) == 6 and len(queries) == 24
    assert [q.id for q in queries if len(q.relevant) == 2] == ["q21-atlas-composite"]
    assert sum(len(q.relevant) for q in queries) == 19
    # Conflicting facts: the same topic states a different fact in each tenant.
    meal = [d.facts for d in docs if d.id.endswith("finance-meal")]
    assert len(meal) == 3 and len(set(meal)) == 3
    result = quality.evaluate()
    plain, fixed, fresh = (result["metrics"][n] for n in ("plain_top_k", "fixed_one_shot", "freshplan"))
    assert plain["hard_failure"] and plain["acl_leakage_queries"] > 0
    assert not fixed["hard_failure"] and not fresh["hard_failure"]
    for m in (plain, fixed, fresh):
        assert m["queries"] == 24 and m["relevant_expected"] == 19
        assert m["answer_decision_accuracy"] == round(m["accepted"] / 24, 6)
        assert m["unit_accepted_cost"] == (round(m["total_cost_units"] / m["accepted"], 6) if m["accepted"]
                                           else None)
    cross = next(t for t in result["traces"] if t["query"] == "q19-cross-tenant")
    assert cross["fixed_one_shot"]["retrieval_steps"] == 0
    assert not any(e["kind"] == "retrieve" for e in cross["fixed_one_shot"]["events"])
    assert fixed["mean_retrieval_steps"] == round(23 / 24, 6)
    assert {row["query"] for row in result["losses"]} == {t["query"] for t in result["traces"]
                                                          if not t["freshplan"]["accepted"]}


def test_a_correct_answer_from_another_tenants_document_is_still_a_hard_failure():
    docs = {d.id: d for d in load_docs()}
    q = next(q for q in load_queries() if q.id == "q02-boreal-meal")
    run = {"decision": "answer", "facts": list(q.expected_facts), "retrieved": ["atlas-finance-meal"],
           "route": "finance", "retrieval_steps": 1, "events": [{"kind": "decide"}]}
    verdict = judge(q, run, docs)
    assert not verdict["accepted"] and verdict["failures"] == ["acl-leakage"]
    m = metrics([q], [run], [verdict], routes=True)
    assert m["hard_failure"] and m["accepted"] == 0 and m["unit_accepted_cost"] is None   # never 0 or inf


def test_expected_sets_are_not_derived_from_what_freshplan_reads():
    raw = CORPUS_FILE.read_text() + QUERIES_FILE.read_text()
    for word in (freshplan_run.PROPOSITION, freshplan_run.EVIDENCE_CLASS, freshplan_run.DECISION, "supports",
                 "evidence_class", "provenance"):
        assert word not in raw
    docs, queries = load_docs(), load_queries()
    relabelled = [dataclasses.replace(d, facts=(f"label-{i}",)) for i, d in enumerate(docs)]
    assert [freshplan_run.resource_of(d) for d in docs] == [freshplan_run.resource_of(d) for d in relabelled]
    shuffled = [dataclasses.replace(q, expected="answer" if q.expected == "abstain" else "abstain",
                                    expected_facts=(), relevant=()) for q in queries]
    catalog = freshplan_run.CorpusCatalog(docs)
    for original, flipped in zip(queries, shuffled, strict=True):
        a = freshplan_run.freshplan(original, docs, catalog)
        b = freshplan_run.freshplan(flipped, relabelled, freshplan_run.CorpusCatalog(relabelled))
        assert (a["decision"], a["retrieved"], a["stop_reason"]) == (b["decision"], b["retrieved"], b["stop_reason"])
        c, d = contenders.fixed_one_shot(original, docs), contenders.fixed_one_shot(flipped, docs)
        assert (c["decision"], c["retrieved"]) == (d["decision"], d["retrieved"])


def test_freshplan_never_sees_another_tenants_document():
    result = quality.evaluate()
    for trace in result["traces"]:
        assert all(i.startswith(trace["tenant"] + "-") for i in trace["freshplan"]["retrieved"])
        assert all(i.startswith(trace["tenant"] + "-") for i in trace["fixed_one_shot"]["retrieved"])


def test_the_summary_puts_the_seed_figures_beside_this_run_and_names_freshplans_losses():
    from bench.quality.report import markdown

    doc = quality.document("2026-01-01T00:00:00Z", {})
    lines = markdown(dict({k: doc[k] for k in ("protocol", "metrics", "seed_figures", "losses",
                                                "payload_sha256")}, file="x-quality.json"))
    text = "\n".join(lines)
    assert "| seed fixed one-shot | seed adaptive stateful |" in text
    assert "| Answer decision accuracy |" in text and "| 0.625 | 0.875 |" in text
    assert doc["payload_sha256"] in text and "plain_top_k failed it" in text
    for loss in doc["losses"]:
        assert loss["query"] in text
