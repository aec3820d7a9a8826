"""Real responses of every route validate against the OpenAPI document kept in the repo."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
from jsonschema import Draft202012Validator

from tests.conftest import ATLAS_REQUEST

SPEC = json.loads((Path(__file__).resolve().parents[2] / "agents" / "openapi.json").read_text())


def check(path: str, method: str, status: int, body) -> None:
    response = SPEC["paths"][path][method]["responses"][str(status)]
    if "$ref" in response:
        response = SPEC["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    schema = next(iter(response["content"].values()))["schema"]
    validator = Draft202012Validator({**schema, "components": SPEC["components"]})
    errors = [e.message for e in validator.iter_errors(body)]
    assert not errors, f"{method.upper()} {path} {status}: {errors}"


async def call(worker, method: str, path: str, body=None, headers=None, anonymous=False):
    async with aiohttp.ClientSession(headers=None if anonymous else worker.auth) as http, \
            http.request(method, f"{worker.url}{path}", json=body, headers=headers) as resp:
        text = await resp.text()
        return resp.status, (json.loads(text) if resp.content_type == "application/json" else text)


async def test_every_route_matches_the_document(worker):
    served = (await call(worker, "GET", "/openapi.json"))[1]
    assert served == SPEC
    fresh = await worker.load("atlas.jsonl")
    cases = [
        ("POST", "/v1/select", dict(ATLAS_REQUEST, at_least_as_fresh=fresh), 200),
        ("POST", "/v1/select", ATLAS_REQUEST, 200),
        ("POST", "/v1/select", dict(ATLAS_REQUEST, role="admin"), 400),
        ("POST", "/v1/select", dict(ATLAS_REQUEST, entity="Nobody"), 404),
        ("POST", "/v1/select", dict(ATLAS_REQUEST, purpose="marketing"), 422),
        ("GET", "/v1/select", None, 405),
        ("GET", "/v1/plans/plan-unknown", None, 404),
        ("POST", "/v1/admin/consumers", {"topic": "clock", "action": "pause"}, 200),
        ("POST", "/v1/admin/consumers", {"topic": "clock", "action": "resume"}, 200),
        ("POST", "/v1/admin/consumers", {"topic": "plans", "action": "pause"}, 400),
        ("GET", "/healthz", None, 200),
        ("GET", "/readyz", None, 200),
        ("GET", "/metrics", None, 200),
        ("GET", "/v1/receipts/rcpt-unknown", None, 404),
    ]
    plan_id = receipt_id = None
    for method, path, body, status in cases:
        got, doc = await call(worker, method, path, body)
        assert got == status, (method, path, doc)
        check(template(path), method.lower(), status, doc)
        if path == "/v1/select" and status == 200:
            plan_id, receipt_id = doc["plan_id"], doc["receipt_id"]
    for path in (f"/v1/plans/{plan_id}", f"/v1/receipts/{receipt_id}"):
        got, doc = await call(worker, "GET", path)
        assert got == 200
        check(template(path), "get", 200, doc)
    refused = [
        ("POST", "/v1/select", ATLAS_REQUEST, {}, True, 401),
        ("GET", f"/v1/plans/{plan_id}", None, {}, True, 401),
        ("GET", f"/v1/receipts/{receipt_id}", None, {}, True, 401),
        ("POST", "/v1/admin/consumers", {"topic": "clock", "action": "pause"}, {}, True, 401),
        ("POST", "/v1/select", ATLAS_REQUEST, {"Origin": "https://elsewhere.example"}, False, 403),
        ("POST", "/v1/admin/consumers", {}, {"Host": "rebound.example"}, False, 400),
        ("POST", "/v1/select", None, {"Content-Type": "text/plain"}, False, 415),
        ("GET", "/healthz", None, {}, True, 200),
    ]
    for method, path, body, headers, anonymous, status in refused:
        got, doc = await call(worker, method, path, body, headers, anonymous)
        assert got == status, (method, path, doc)
        check(template(path), method.lower(), status, doc)


def template(path: str) -> str:
    """The document's path for a concrete one."""
    for prefix in ("/v1/plans/", "/v1/receipts/"):
        if path.startswith(prefix):
            return prefix + ("{plan_id}" if "plans" in prefix else "{receipt_id}")
    return path
