"""The 003 evaluation: both contenders through the compiler, fixed denominators, leakage in every channel, replay."""

from __future__ import annotations

import dataclasses

import orjson

from bench import quality
from bench.quality import contenders, freshplan_run
from bench.quality.fixtures import CORPORA, load_corpus, load_docs, load_queries
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
    assert len(docs[0]["traces"]) == 24 and len(docs[0]["corpora"]["clinics"]["traces"]) == 20


def test_the_fixtures_follow_the_seed_and_the_metrics_keep_their_denominators():
    docs, queries = load_docs(), load_queries()
    assert len(docs) == 39 and {d.tenant for d in docs} == {"atlas", "boreal", "cinder"}
    assert sum(q.expected == "abstain" for q in queries) == 6 and len(queries) == 24
    assert sum(len(q.relevant) for q in queries) == 19
    meal = [d.facts for d in docs if d.id.endswith("finance-meal")]
    assert len(meal) == 3 and len(set(meal)) == 3
    result = quality.evaluate()
    for part in (result, result["corpora"]["clinics"]):
        plain, fixed, adaptive = (part["metrics"][n] for n in ("plain_top_k", "fixed_one_shot", "adaptive"))
        assert plain["hard_failure"] and plain["acl_leakage_queries"] > 0
        for m in (plain, fixed, adaptive):
            assert m["queries"] == part["protocol"]["queries"]
            assert m["answer_decision_accuracy"] == round(m["accepted"] / m["queries"], 6)
            assert m["unit_accepted_cost"] == (round(m["total_cost_units"] / m["accepted"], 6) if m["accepted"]
                                               else None)
        assert fixed["max_retrieval_steps"] == 1 and adaptive["max_retrieval_steps"] <= 2
        assert {row["query"] for row in part["losses"]} == {t["query"] for t in part["traces"]
                                                            if not t["adaptive"]["accepted"]}


def test_the_two_corpora_share_no_document_tenant_or_rule():
    a, b = load_corpus("policies"), load_corpus("clinics")
    assert not set(a.tenants) & set(b.tenants) and not {d.id for d in a.docs} & {d.id for d in b.docs}
    assert not set(a.routes) & set(b.routes)
    assert not {w for r in a.rewrites for w in r["when"]} & {w for r in b.rewrites for w in r["when"]}


def test_each_contender_is_charged_the_candidates_its_compiler_run_scored():
    corpus = load_corpus("policies")
    catalog = freshplan_run.CorpusCatalog(corpus, "adaptive")
    q = next(q for q in corpus.queries if q.id == "q04-atlas-pto")       # a rewrite, then a second retrieval
    run = freshplan_run.freshplan(q, corpus, catalog)
    retrieves = [e for e in run["events"] if e["kind"] == "retrieve"]
    assert run["retrieval_steps"] == 2 and any(e["kind"] == "rewrite" for e in run["events"])
    people = sum(d.route == "people" and d.tenant == "atlas" for d in corpus.docs)
    assert [e["candidates"] for e in retrieves] == [people, people]     # the routed pool, twice
    cross = next(q for q in corpus.queries if q.id == "q19-cross-tenant")
    stopped = freshplan_run.freshplan(cross, corpus, catalog)
    assert stopped["retrieval_steps"] == 0 and [e["kind"] for e in stopped["events"]] == ["scope_guard", "decide"]


def test_the_adaptive_controller_meets_the_targets_on_both_corpora_and_beats_one_shot():
    result = quality.evaluate()
    for part in (result, result["corpora"]["clinics"]):
        adaptive = part["metrics"]["adaptive"]
        assert adaptive["answer_decision_accuracy"] >= 0.875 and adaptive["abstention_precision"] == 1.0
        assert adaptive["abstention_recall"] >= 0.833 and adaptive["acl_leakage_queries"] == 0
        m = part["metrics"]
        assert m["adaptive"]["accepted"] > m["fixed_one_shot"]["accepted"]
        assert m["adaptive"]["acl_leakage_queries"] == m["fixed_one_shot"]["acl_leakage_queries"] == 0


def test_a_correct_answer_from_another_tenants_document_is_still_a_hard_failure():
    docs = {d.id: d for d in load_docs()}
    q = next(q for q in load_queries() if q.id == "q02-boreal-meal")
    run = {"decision": "answer", "facts": list(q.expected_facts), "retrieved": ["atlas-finance-meal"],
           "route": "finance", "retrieval_steps": 1, "events": [{"kind": "decide"}]}
    verdict = judge(q, run, docs)
    assert not verdict["accepted"] and verdict["failures"] == ["acl-leakage"]
    m = metrics([q], [run], [verdict], routes=True)
    assert m["hard_failure"] and m["accepted"] == 0 and m["unit_accepted_cost"] is None   # never 0 or inf
    # A leak in a channel other than the retrieved list (a plan or receipt naming the document) counts too.
    hidden = dict(run, retrieved=[], leaks=["atlas-finance-meal"])
    assert judge(q, hidden, docs)["failures"] == ["acl-leakage"]


def test_leakage_is_looked_for_in_plan_and_receipt_not_only_in_what_was_admitted():
    corpus = load_corpus("policies")
    q = next(q for q in corpus.queries if q.id == "q02-boreal-meal")

    class Leaky(freshplan_run.CorpusCatalog):
        def candidates(self, entity_id, contract):   # a catalog that wrongly offers another tenant's documents
            return sorted(self.resources.values(), key=lambda r: r.id)

    run = freshplan_run.freshplan(q, corpus, Leaky(corpus, "adaptive"))
    assert run["leaks"] and all(not i.startswith("boreal-") for i in run["leaks"] if i != "withheld-count")


def test_expected_sets_are_not_derived_from_what_freshplan_reads():
    for directory in CORPORA.values():
        raw = (directory / "corpus.json").read_text() + (directory / "queries.json").read_text()
        for word in (freshplan_run.PROPOSITION, freshplan_run.EVIDENCE_CLASS, freshplan_run.DECISION, "supports",
                     "evidence_class", "provenance"):
            assert word not in raw
    corpus = load_corpus("policies")
    relabelled = dataclasses.replace(corpus, docs=tuple(dataclasses.replace(d, facts=(f"label-{i}",))
                                                        for i, d in enumerate(corpus.docs)),
                                     queries=tuple(dataclasses.replace(q, expected="answer" if q.expected == "abstain"
                                                                       else "abstain", expected_facts=(), relevant=())
                                                   for q in corpus.queries))
    records = [freshplan_run.resource_of(d) for d in corpus.docs]
    assert records == [freshplan_run.resource_of(d) for d in relabelled.docs]
    for mode in freshplan_run.MODES:
        ours, theirs = freshplan_run.CorpusCatalog(corpus, mode), freshplan_run.CorpusCatalog(relabelled, mode)
        for original, flipped in zip(corpus.queries, relabelled.queries, strict=True):
            a = freshplan_run.freshplan(original, corpus, ours)
            b = freshplan_run.freshplan(flipped, relabelled, theirs)
            assert [a[k] for k in ("decision", "retrieved", "stop_reason")] == [
                b[k] for k in ("decision", "retrieved", "stop_reason")]


def test_freshplan_never_sees_another_tenants_document():
    result = quality.evaluate()
    for part in (result, result["corpora"]["clinics"]):
        for trace in part["traces"]:
            for mode in freshplan_run.MODES:
                assert all(i.startswith(trace["tenant"] + "-") for i in trace[mode]["retrieved"])
                assert trace[mode]["acl_leaks"] == 0


def test_the_summary_puts_the_seed_figures_beside_this_run_and_names_the_losses():
    from bench.quality.report import markdown

    doc = quality.document("2026-01-01T00:00:00Z", {})
    lines = markdown(dict({k: doc[k] for k in ("protocol", "metrics", "seed_figures", "losses", "corpora",
                                                "payload_sha256")}, file="x-quality.json"))
    text = "\n".join(lines)
    assert "| seed fixed one-shot | seed adaptive stateful |" in text and "corpus `clinics`" in text
    assert doc["payload_sha256"] in text and "plain_top_k failed it" in text
    for loss in doc["losses"] + doc["corpora"]["clinics"]["losses"]:
        assert loss["query"] in text


def test_the_negative_control_scores_every_tenant():
    q = next(q for q in load_queries() if q.id == "q02-boreal-meal")
    run = contenders.plain_top_k(q, load_docs())
    assert any(not i.startswith("boreal-") for i in run["retrieved"])


def test_leakage_is_found_in_a_cause_or_dependency_key_as_well_as_a_quoted_id():
    corpus = load_corpus("policies")
    q = next(q for q in corpus.queries if q.tenant == "atlas")
    other = next(d.id for d in corpus.docs if d.tenant == "boreal")
    own = next(d.id for d in corpus.docs if d.tenant == "atlas")
    assert freshplan_run.leaks(q, corpus, [{"cause": {"dependency_key": f"resource:{other}"}}]) == [other]
    assert freshplan_run.leaks(q, corpus, [{"rejected": [{"resource_id": other}]}]) == [other]
    assert freshplan_run.leaks(q, corpus, [{"withheld": 2}]) == ["withheld-count"]
    assert freshplan_run.leaks(q, corpus, [{"cause": {"dependency_key": f"resource:{own}"}},
                                           {"id": f"{other}-draft"}]) == []  # own ids and longer names are not
