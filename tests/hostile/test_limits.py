"""Finding 7 of issue 10 through the broker and HTTP: hostile values get a 4xx with a code, or work."""

from __future__ import annotations

import orjson

from tests.conftest import ATLAS_REQUEST
from tests.events import resource

LIVE = dict(ATLAS_REQUEST, decision_time="now")


async def post_raw(worker, body: bytes) -> tuple[int, dict]:
    async with worker.http.post(f"{worker.url}/v1/select", data=body,
                                headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.json()


def with_budget(text: str) -> bytes:
    return orjson.dumps(ATLAS_REQUEST)[:-1] + b', "budget": {' + text.encode() + b"}}"


async def test_hostile_requests_get_a_4xx_with_a_code(worker):
    fresh = await worker.load("atlas.jsonl")
    await worker.select(ATLAS_REQUEST, fresh)
    cases = [
        (with_budget('"tokens": 18446744073709551616'), 422, "budget_too_large"),     # 2^64
        (with_budget('"tokens": 9223372036854775808'), 422, "budget_too_large"),      # 2^63
        (with_budget('"tokens": 1' + "0" * 40), 422, "budget_too_large"),
        (with_budget('"money": NaN'), 400, "malformed_json"),
        (with_budget('"privacy": Infinity'), 400, "malformed_json"),
        (orjson.dumps(dict(ATLAS_REQUEST, decision_time="0001-01-01T00:00:00+14:00")), 400, "invalid_field"),
        (orjson.dumps(dict(ATLAS_REQUEST, decision_time="9999-12-31T23:59:59-01:00")), 400, "invalid_field"),
        (orjson.dumps(dict(ATLAS_REQUEST, query="q" * 5000)), 422, "field_too_large"),
        (b'{"query": ' + b"[" * 40 + b"]" * 40 + b"}", 400, "body_too_deep"),
        (b"[" * 200_000 + b"]" * 200_000, 400, "malformed_json"),
        (orjson.dumps(ATLAS_REQUEST)[:-1] + b', "query": "\\ud800"}', 400, "malformed_json"),   # lone surrogate
    ]
    for body, status, code in cases:
        got, doc = await post_raw(worker, body)
        assert (got, doc["error"]["code"]) == (status, code), (body[:80], doc)
        assert doc["error"]["message"] and doc["error"]["pass"]
    limit = (await post_raw(worker, cases[0][0]))[1]["error"]["message"]
    assert "FRESHPLAN_MAX_BUDGET_TOKENS" in limit
    assert "4096" in (await post_raw(worker, cases[7][0]))[1]["error"]["message"]
    assert (await worker.get("/healthz"))["status"] == "ok" and worker.proc.poll() is None


async def test_a_resource_valid_until_the_end_of_time_is_legal(worker):
    fresh = await worker.load("atlas.jsonl")
    live = await worker.select(LIVE, fresh)                     # a live plan that the new resource touches
    topic, far = resource("approved-waiver-W2", valid_to="9999-12-31T23:59:59Z")
    _, bad = resource("waiver-W3", valid_to="9999-12-31T23:59:59-01:00")
    fresh = await worker.publish_events((topic, far), (topic, bad))
    after = await worker.select(LIVE, fresh)
    assert after["plan_id"] != live["plan_id"]
    assert next(s for s in after["slots"] if s["proposition"] == "waiver_valid")["state"] == "supported"
    letters = await worker.records("dead-letters", lambda rs: len(rs) >= 1)
    assert [r["error_class"] for r in letters] == ["invalid_value"]
    assert "9999-12-31T23:59:59-01:00" not in letters[0]["message"]
    counters = (await worker.get("/healthz"))["counters"]
    assert "dead_letters.processing_error" not in counters
    assert (await worker.select(dict(LIVE, principal="omar")))["state"]  # another live plan on the entity
