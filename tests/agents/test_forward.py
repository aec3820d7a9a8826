"""Forwarding a select to the partition's owner: who owns what, and every way the owner can fail."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import orjson
import pytest
from aiohttp import web

from agents.web.forward import (FORWARDED_HEADER, forward_select, is_forwarded, is_self, owner_url, retry_headers)
from streams.broker import free_port

pytestmark = pytest.mark.timeout(60)


def _app(hosts, canonical="http://127.0.0.1:6066"):
    def metadata():
        if isinstance(hosts, Exception):
            raise hosts
        return hosts
    return SimpleNamespace(assignor=SimpleNamespace(external_topics_metadata=metadata),
                           conf=SimpleNamespace(canonical_url=canonical))


def test_owner_url_reads_the_assignors_host_map():
    app = _app({"http://a:1": {"t-source-changes": [0, 2], "t-clock": [0]}, "http://b:2": {"t-source-changes": [1]}})
    assert owner_url(app, "t-source-changes", 1) == "http://b:2"
    assert owner_url(app, "t-source-changes", 2) == "http://a:1"
    assert owner_url(app, "t-source-changes", 3) is None
    assert owner_url(app, "t-revocations", 0) is None
    assert owner_url(_app(RuntimeError("no consumer yet")), "t-clock", 0) is None
    assert owner_url(_app({}), "t-clock", 0) is None


def test_is_self_compares_host_and_port_and_forwarded_is_a_header():
    app = _app({}, "http://127.0.0.1:6066")
    assert is_self(app, "http://127.0.0.1:6066/") and not is_self(app, "http://127.0.0.1:6067")
    assert not is_self(app, None)
    assert is_forwarded({FORWARDED_HEADER: "1"}) and not is_forwarded({})


@contextlib.asynccontextmanager
async def _server(handler):
    app = web.Application()
    app.router.add_post("/v1/select", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_the_owners_answer_comes_back_with_the_callers_credential_and_the_loop_guard():
    seen = {}

    async def handler(request):
        seen.update(headers=dict(request.headers), body=await request.json())
        return web.json_response({"plan_id": "plan-1"})

    async with _server(handler) as url:
        status, doc = await forward_select(url, {"entity": "Atlas"},
                                           {"Authorization": "Bearer s3cret", "Cookie": "c", "Origin": "x",
                                            "Host": "freshplan.example"}, 5)
    assert (status, doc) == (200, {"plan_id": "plan-1", "served_by": url})
    assert seen["headers"]["Host"] == "freshplan.example"  # the owner's Host guard sees the caller's name
    assert seen["body"] == {"entity": "Atlas"}
    assert seen["headers"]["Authorization"] == "Bearer s3cret" and seen["headers"][FORWARDED_HEADER] == "1"
    assert "Cookie" not in seen["headers"] and "Origin" not in seen["headers"]


async def test_the_owners_refusals_pass_through():
    async def handler(request):
        return web.json_response({"error": {"code": "unknown_field", "pass": "parse", "message": "m"}}, status=400)

    async with _server(handler) as url:
        status, doc = await forward_select(url, {}, {}, 5)
    assert status == 400 and doc["error"]["code"] == "unknown_field" and retry_headers(status, doc) == {}


@pytest.mark.parametrize("answer", [web.Response(text="<html>", status=200), web.json_response([1]),
                                    web.json_response({"error": "boom"}, status=500)])
async def test_an_owner_that_answers_nonsense_is_unavailable(answer):
    async def handler(request):
        return answer

    async with _server(handler) as url:
        status, doc = await forward_select(url, {}, {}, 5)
    assert status == 503 and doc["error"]["code"] == "owner_unavailable"


async def test_a_slow_owner_is_unavailable_with_a_retry_hint():
    release = asyncio.Event()

    async def handler(request):
        await release.wait()
        return web.json_response({"plan_id": "late"})

    async with _server(handler) as url:
        status, doc = await forward_select(url, {}, {}, 0.3)
        release.set()
    assert status == 503 and doc["error"]["code"] == "owner_unavailable" and doc["error"]["pass"] == "forward"
    assert "retry" in doc["error"]["message"] and retry_headers(status, doc) == {"Retry-After": "1"}
    assert "plan_id" not in doc


async def test_an_owner_that_is_gone_is_unavailable():
    status, doc = await forward_select(f"http://127.0.0.1:{free_port()}", {}, {}, 5)
    assert status == 503 and doc["error"]["code"] == "owner_unavailable"
    assert orjson.loads(orjson.dumps(doc)) == doc
