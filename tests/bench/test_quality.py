"""The selection-quality benchmark: fixed denominators, ACL leaks caught, and a replayable result file."""

from __future__ import annotations

import orjson

from bench.quality import evaluate
from bench.quality_corpus import generate
from bench.report import write_json
from bench.suite import quality_payload


def test_the_result_file_replays_byte_for_byte_apart_from_time_and_environment(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    write_json(first, quality_payload(3, "2026-01-01T00:00:00Z", {"python": "x"}))
    write_json(second, quality_payload(3, "2027-06-30T12:00:00Z", {"python": "y", "cpu_count": 64}))
    assert first.read_bytes() != second.read_bytes()   # the envelope differs ...
    replayed = []
    for path in (first, second):
        doc = orjson.loads(path.read_bytes())
        del doc["captured_at"], doc["environment"]
        out = tmp_path / f"stripped-{path.name}"
        write_json(out, doc)
        replayed.append(out.read_bytes())
    assert replayed[0] == replayed[1]                   # ... the payload, every trace included, does not
    assert b'"traces"' in replayed[0] and len(replayed[0]) > 10_000


def test_metrics_use_fixed_denominators_and_count_every_leak():
    result = evaluate(3)
    corpus = generate(3)
    expected_abstain = sum(q.expected == "abstain" for q in corpus.queries)
    assert result["corpus"]["queries"] == len(corpus.queries) == 24 and expected_abstain == 6
    plain, compiled = result["metrics"]["plain_top_k"], result["metrics"]["freshplan_compiled"]
    assert plain["acl_hard_failure"] and plain["acl_leakage_queries"] > 0
    assert plain["cost_per_accepted_decision"] is None or plain["accepted"] > 0   # never a division by zero
    for name in ("freshplan_compiled", "freshplan_evsi"):
        m = result["metrics"][name]
        assert m["acl_leakage_queries"] == 0 and m["unsafe_items_passed"] == 0 and m["queries"] == 24
    # Every trace is judged against the corpus's ground truth, not against freshplan's own answer.
    for trace in result["traces"]:
        for name in ("plain_top_k", "freshplan_compiled"):
            leaked = {d.id for d in corpus.docs if d.id in trace[name]["passed"]
                      and not corpus.permitted(d, trace["tenant"])}
            assert set(trace[name]["acl_leaks"]) == leaked
    assert compiled["decision_accuracy"] == compiled["accepted"] / 24
