"""Finding 9: read load never starves the revocation guard into refusing healthy selects."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from tests.conftest import ATLAS_REQUEST

pytestmark = pytest.mark.timeout(240)
N = 600  # the issue saw refusals at 200; more makes a starved guard certain on a fast machine


async def test_hundreds_of_concurrent_distinct_selects_get_no_refusal(worker):
    loaded = await worker.load("atlas.jsonl")
    await worker.select(ATLAS_REQUEST, loaded)

    async def one(i: int) -> tuple[int, str]:
        body = dict(ATLAS_REQUEST, query=f"covenant waiver question number {i}")  # a plan key of its own
        async with worker.http.post(f"{worker.url}/v1/select", json=body) as resp:
            doc = await resp.json()
            return resp.status, doc.get("served_from") or doc["error"]["code"]

    outcomes = Counter(await asyncio.gather(*[one(i) for i in range(N)]))
    assert outcomes == {(200, "compiled"): N}, outcomes
    assert (await worker.get("/healthz"))["revocations"]["state"] == "ok"
