"""One pass of the 003 queries through a live worker on the embedded broker, compared with the in-process run."""

from __future__ import annotations

import asyncio

import pytest

from bench.quality import CORPUS_NAMES
from bench.quality.fixtures import load_corpus
from bench.quality.freshplan_run import CorpusCatalog, freshplan, leaks, refused, request_of, resource_of, run_of
from bench.quality.judge import judge, metrics
from bench.quality.live import corpus_events, resource_body
from compiler.errors import RequestError
from compiler.pipeline import compile_request
from tests.conftest import eventually
from tests.events import envelope


async def _select(worker, body: dict) -> tuple[int, dict]:
    async with worker.http.post(f"{worker.url}/v1/select", json=body) as resp:
        return resp.status, await resp.json()


async def _live_pass(worker, corpus, fresh: str) -> tuple[list[dict], list[dict]]:
    """Every query through HTTP: (runs read from plan, receipt and status; the plans as served)."""
    runs, plans = [], []
    for q in corpus.queries:
        status, doc = await _select(worker, dict(request_of(q), at_least_as_fresh=fresh))
        if status != 200:
            runs.append(refused(doc["error"]["code"]))
            plans.append(doc)
            continue
        receipt = await worker.get(f"/v1/receipts/{doc['receipt_id']}")
        plan_status = await worker.get(f"/v1/plans/{doc['plan_id']}")
        runs.append(run_of(q, corpus, doc, [receipt, plan_status]))
        plans.append(doc)
    return runs, plans


@pytest.mark.parametrize("name", CORPUS_NAMES)
async def test_the_003_queries_through_a_live_worker_come_out_as_in_process_and_leak_nowhere(worker, name):
    corpus = load_corpus(name)
    catalog = CorpusCatalog(corpus, "adaptive")
    by_id = {d.id: d for d in corpus.docs}
    fresh = await worker.publish_events(*corpus_events(corpus))
    live, served = await asyncio.wait_for(_live_pass(worker, corpus, fresh), 60)

    local = [freshplan(q, corpus, catalog) for q in corpus.queries]
    for q, plan in zip(corpus.queries, served, strict=True):
        try:
            compiled = compile_request(request_of(q), catalog, None).plan
        except RequestError as exc:
            assert plan["error"]["code"] == exc.code, q.id
            continue
        # The same plan, id and trace included: the live catalog holds what the in-process view does.
        assert {k: plan.get(k) for k in compiled} == compiled, q.id
    assert [r["decision"] for r in live] == [r["decision"] for r in local]
    verdicts = [judge(q, r, by_id) for q, r in zip(corpus.queries, live, strict=True)]
    expected = [judge(q, r, by_id) for q, r in zip(corpus.queries, local, strict=True)]
    assert verdicts == expected
    figures = metrics(corpus.queries, live, verdicts, routes=True)
    assert figures == metrics(corpus.queries, local, expected, routes=True)
    assert figures["acl_leakage_queries"] == 0 and figures["answer_decision_accuracy"] >= 0.875

    # Causes: a document edit in each tenant, then a new catalogue version, invalidate the plans.
    edits = [next(d for d in corpus.docs if d.tenant == t) for t in corpus.tenants]
    await worker.publish_events(*[("source-changes", envelope(kind="resource", op="upsert", resource=dict(
        resource_body(resource_of(d)), version=2))) for d in edits])
    await worker.publish_events(*corpus_events(corpus, version=2)[:1])
    answered = [(q, p) for q, p in zip(corpus.queries, served, strict=True) if "plan_id" in p]

    async def statuses():
        docs = [await worker.get(f"/v1/plans/{p['plan_id']}") for _, p in answered]
        return docs if all(d["status"] == "invalidated" for d in docs) else None
    seen = await eventually(statuses, timeout=30, what="every plan invalidated")
    assert any(h["cause"] for d in seen for h in d["history"])  # there are causes to look in
    for (q, _), status in zip(answered, seen, strict=True):
        assert leaks(q, corpus, [status]) == [], q.id
        successor = await worker.get(f"/v1/plans/{status['successor_plan_id']}") if status["successor_plan_id"] \
            else None
        assert successor is None or leaks(q, corpus, [successor]) == [], q.id
