"""The gate's order: Host (400), Origin (403), content type (415), credential (401), scope (403)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from agents.web.callers import Caller, digest
from agents.web.gate import CALLER, Gate, api_routes, bearer, host_name, principal_refusal
from streams.settings import Settings

GATEWAY = Caller("gateway", frozenset({"sam"}), frozenset({"select"}), digest("gateway-secret-0001"))
OPS = Caller("ops", frozenset(), frozenset({"admin", "status"}), digest("ops-secret-00000001"))


def test_host_names_ignore_the_port():
    assert host_name("LocalHost:6066") == "localhost" and host_name("127.0.0.1") == "127.0.0.1"
    assert host_name("[::1]:6066") == "[::1]" and host_name("evil.test:80") == "evil.test"
    assert Settings().hosts >= {"localhost", "127.0.0.1", "[::1]"}
    assert Settings(allowed_hosts=("freshplan",)).hosts == {"freshplan"}


def test_metrics_can_be_open_behind_status_or_elsewhere():
    assert api_routes(Settings())["/metrics"] == ""
    assert api_routes(Settings(metrics_auth="status"))["/metrics"] == "status"
    assert "/metrics" not in api_routes(Settings(metrics_port=9100))


def test_bearer_parsing():
    assert bearer("Bearer abc") == "abc" and bearer("bearer  abc ") == "abc"
    assert bearer(None) is bearer("") is bearer("Basic abc") is bearer("Bearer") is bearer("Bearer a b") is None
    assert bearer("Bearer caf\u00e9") is None


def test_principal_refusal():
    assert principal_refusal(GATEWAY, {"principal": " sam "}) is None
    assert principal_refusal(GATEWAY, {"principal": "maya"}).status == 403
    assert principal_refusal(None, {"principal": "sam"}).status == 403
    assert principal_refusal(GATEWAY, {"principal": 7}) is None  # the parser answers 400


@pytest.fixture
async def client():
    async def ok(request: web.Request) -> web.Response:
        caller = request.get(CALLER)
        return web.json_response({"caller": caller.id if caller else None})

    gate = Gate(Settings(allowed_origins=("https://app.example",)), lambda: (GATEWAY, OPS), None,
                api_routes(Settings()))
    app = web.Application(middlewares=[gate.middleware])
    for path in ("/v1/select", "/v1/admin/consumers"):
        app.router.add_post(path, ok)
    app.router.add_get("/healthz", ok)
    app.router.add_get("/router/", ok)  # a page the gate does not know: never served
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def call(client, method, path, *, headers=None, data=b"{}", json_body=True):
    headers = dict(headers or {})
    if json_body and method == "POST":
        headers.setdefault("Content-Type", "application/json")
    async with asyncio.timeout(10):
        resp = await client.request(method, path, headers=headers, data=data if method == "POST" else None)
        return resp.status, await resp.json(), resp.headers


async def test_checks_run_in_the_documented_order(client):
    everything_wrong = {"Host": "evil.test", "Origin": "https://evil.test", "Content-Type": "text/plain"}
    assert (await call(client, "POST", "/v1/admin/consumers", headers=everything_wrong))[0] == 400
    del everything_wrong["Host"]
    status, body, _ = await call(client, "POST", "/v1/admin/consumers", headers=everything_wrong)
    assert (status, body["error"]["code"]) == (403, "origin_not_allowed")
    del everything_wrong["Origin"]
    status, body, _ = await call(client, "POST", "/v1/admin/consumers", headers=everything_wrong)
    assert (status, body["error"]["code"]) == (415, "unsupported_media_type")
    status, body, headers = await call(client, "POST", "/v1/admin/consumers")
    assert (status, body["error"]["code"]) == (401, "unauthenticated")
    assert headers["WWW-Authenticate"] == 'Bearer realm="freshplan"'
    status, body, headers = await call(client, "POST", "/v1/admin/consumers",
                                       headers={"Authorization": "Bearer wrong-secret-0000001"})
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]
    gateway = {"Authorization": "Bearer gateway-secret-0001"}
    status, body, _ = await call(client, "POST", "/v1/admin/consumers", headers=gateway)
    assert (status, body["error"]["code"]) == (403, "scope_missing") and "gateway-secret" not in str(body)
    ops = {"Authorization": "Bearer ops-secret-00000001"}
    assert (await call(client, "POST", "/v1/admin/consumers", headers=ops))[:2] == (200, {"caller": "ops"})


async def test_open_routes_unknown_pages_and_allowed_origins(client):
    assert (await call(client, "GET", "/healthz"))[:2] == (200, {"caller": None})
    assert (await call(client, "GET", "/healthz", headers={"Authorization": "Bearer nope-nope-nope-nope"}))[0] == 401
    status, body, _ = await call(client, "GET", "/router/")
    assert (status, body["error"]["code"]) == (404, "not_found")
    status, body, _ = await call(client, "GET", "/v1/select")
    assert (status, body["error"]["code"]) == (405, "method_not_allowed")
    status, body, headers = await call(client, "POST", "/v1/select", headers={
        "Origin": "https://app.example", "Authorization": "Bearer gateway-secret-0001"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "https://app.example"
