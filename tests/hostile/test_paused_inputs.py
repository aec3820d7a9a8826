"""Finding 6: a paused input that can take permissions away refuses selects; others mark answers degraded."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import ATLAS_REQUEST

pytestmark = pytest.mark.timeout(180)


async def _set(worker, topic: str, action: str) -> None:
    async with worker.http.post(f"{worker.url}/v1/admin/consumers", json={"topic": topic, "action": action}) as resp:
        assert resp.status == 200, await resp.text()


async def _until(worker, state: str) -> dict:
    for _ in range(100):
        health = await worker.get("/healthz")
        if health["revocations"]["state"] == state:
            return health
        await asyncio.sleep(0.1)
    raise AssertionError(f"guard never {state}: {health['revocations']}")


async def test_paused_policy_versions_refuse_and_paused_sources_degrade(worker):
    loaded = await worker.load("atlas.jsonl")
    plan = await worker.select(ATLAS_REQUEST, loaded)
    assert "degraded" not in plan

    await _set(worker, "policy-versions", "pause")
    health = await _until(worker, "paused")
    assert health["revocations"]["paused"] == ["policy-versions"]
    refused = await worker.select(ATLAS_REQUEST, expect=503)
    assert refused["error"]["code"] == "input_paused" and "policy-versions" in refused["error"]["message"]
    await _set(worker, "policy-versions", "resume")
    await _until(worker, "ok")

    await _set(worker, "source-changes", "pause")
    degraded = await worker.select(ATLAS_REQUEST)
    assert degraded["degraded"] == ["source-changes"] and degraded["plan_id"] == plan["plan_id"]
    await _set(worker, "source-changes", "resume")
    assert "degraded" not in await worker.select(ATLAS_REQUEST)
