"""Through the broker and HTTP: callers authenticated, bound to principals, kept in their lane."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys

import aiohttp
import orjson
import pytest

from streams.broker import free_port
from tests.conftest import ATLAS_REQUEST, ROOT, launch
from tests.jwt_keys import AUDIENCE, ISSUER, make_signers, unsigned, write_jwks

SECRETS = {"support-gateway": "gateway-secret-0001", "credit-desk": "desk-secret-000001",
           "ops": "ops-secret-00000001", "auditor": "auditor-secret-0001", "sam-desk": "sam-desk-secret-0001"}
SIGNERS = make_signers()


def caller(cid: str, principals: list[str], scopes: list[str]) -> dict:
    return {"id": cid, "secret_sha256": hashlib.sha256(SECRETS[cid].encode()).hexdigest(),
            "principals": principals, "scopes": scopes}


CALLERS = [caller("support-gateway", ["sam", "lee"], ["select", "plans"]),
           caller("credit-desk", ["*"], ["select", "plans", "receipts"]),
           caller("ops", [], ["admin", "status"]),
           caller("sam-desk", ["sam"], ["select", "plans", "receipts"])]


def as_(cid: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRETS[cid]}"}


def jwt_(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
async def guarded(broker, tmp_path_factory):
    """One worker with a callers file, end-user JWTs and /metrics on its own port."""
    directory = tmp_path_factory.mktemp("guarded")
    callers_file = directory / "callers.json"
    callers_file.write_text(json.dumps({"callers": CALLERS}, indent=2))
    jwks = write_jwks(directory / "jwks.json", *SIGNERS)
    metrics_port = free_port()
    async with launch(broker, directory, FRESHPLAN_CALLERS_FILE=str(callers_file),
                      FRESHPLAN_JWT_JWKS_FILE=str(jwks), FRESHPLAN_JWT_ISSUER=ISSUER,
                      FRESHPLAN_JWT_AUDIENCE=AUDIENCE, FRESHPLAN_METRICS_PORT=str(metrics_port),
                      FRESHPLAN_TOKEN=SECRETS["credit-desk"]) as running:
        running.metrics_url = f"http://127.0.0.1:{metrics_port}"
        running.callers_file = callers_file
        running.fresh = await running.load("atlas.jsonl")
        await running.select(ATLAS_REQUEST, running.fresh)  # applied: each test may select at once, run alone too
        yield running


async def call(worker, method: str, path: str, headers: dict | None = None, body=None,
               base: str | None = None, **kwargs) -> tuple[int, dict, object]:
    """One request with only the given headers (no default credential)."""
    async with aiohttp.ClientSession() as http, asyncio.timeout(30):
        async with http.request(method, f"{base or worker.url}{path}", headers=headers, json=body, **kwargs) as resp:
            raw = await resp.read()
            doc = orjson.loads(raw) if resp.content_type == "application/json" else {"text": raw.decode()}
            return resp.status, doc, resp.headers


def code(result) -> tuple[int, str | None]:
    status, doc, _ = result
    return status, doc.get("error", {}).get("code")


async def test_every_v1_route_needs_a_secret(guarded):
    for method, path in [("POST", "/v1/select"), ("GET", "/v1/plans/p-1"), ("GET", "/v1/receipts/rcpt-1"),
                         ("POST", "/v1/admin/consumers")]:
        body = {} if method == "POST" else None
        status, doc, headers = await call(guarded, method, path, body=body)
        assert (status, doc["error"]["code"]) == (401, "unauthenticated") and headers["WWW-Authenticate"].startswith(
            "Bearer"), (path, doc)
    for header in ("Bearer not-a-known-secret-000", "Basic dXNlcjpwYXNz", "Bearer", "Bearer a.b.c",
                   f"Bearer {SECRETS['ops']}x"):
        status, doc, headers = await call(guarded, "POST", "/v1/select", {"Authorization": header}, ATLAS_REQUEST)
        assert status == 401 and "error" in doc and SECRETS["ops"] not in json.dumps(doc), header


async def test_callers_stay_within_their_principals_and_scopes(guarded):
    gateway = await call(guarded, "POST", "/v1/select", as_("support-gateway"), ATLAS_REQUEST)  # principal maya
    assert code(gateway) == (403, "principal_not_allowed")
    own = await call(guarded, "POST", "/v1/select", as_("support-gateway"), dict(ATLAS_REQUEST, principal=" sam ",
                                                                                   at_least_as_fresh=guarded.fresh))
    # Past the gate; the catalog has no sam, answered as a principal without rights (nothing admitted).
    assert code(own) == (200, None) and own[1]["admitted"] == []
    assert code(await call(guarded, "POST", "/v1/admin/consumers", as_("support-gateway"),
                           {"topic": "clock", "action": "resume"})) == (403, "scope_missing")
    assert code(await call(guarded, "POST", "/v1/select", as_("ops"), ATLAS_REQUEST)) == (403, "scope_missing")
    assert (await call(guarded, "POST", "/v1/admin/consumers", as_("ops"),
                       {"topic": "clock", "action": "resume"}))[0] == 200

    status, plan, _ = await call(guarded, "POST", "/v1/select", as_("credit-desk"),
                                 dict(ATLAS_REQUEST, at_least_as_fresh=guarded.fresh))
    assert status == 200, plan
    assert code(await call(guarded, "GET", f"/v1/receipts/{plan['receipt_id']}", as_("support-gateway"))) == (
        403, "scope_missing")
    status, receipt, _ = await call(guarded, "GET", f"/v1/receipts/{plan['receipt_id']}", as_("credit-desk"))
    assert status == 200 and receipt["plan_id"] == plan["plan_id"] and receipt["rejected"]
    assert all(set(item) <= {"resource_id", "reason", "version"} for item in receipt["rejected"]), receipt
    assert code(await call(guarded, "GET", "/v1/receipts/rcpt-none", as_("credit-desk"))) == (404, "unknown_receipt")
    assert (await call(guarded, "GET", f"/v1/plans/{plan['plan_id']}", as_("credit-desk")))[0] == 200

    assert (await call(guarded, "GET", "/healthz"))[1] == {"status": "ok"}  # liveness only
    assert (await call(guarded, "GET", "/healthz", as_("credit-desk")))[1] == {"status": "ok"}  # no status scope
    assert "revocations" in (await call(guarded, "GET", "/healthz", as_("ops")))[1]
    # This test's own anonymous request: the audit lines checked below must not rely on another test's.
    assert code(await call(guarded, "GET", "/v1/receipts/rcpt-anonymous")) == (401, "unauthenticated")

    lines = [orjson.loads(line) for line in guarded.log_path.read_text().splitlines() if line.startswith("{")]
    audit = [line for line in lines if line.get("logger") == "freshplan.audit"]
    served = [a for a in audit if a.get("plan_id") == plan["plan_id"] and a["route"] == "POST /v1/select"]
    assert served and served[0]["caller"] == "credit-desk" and served[0]["principal"] == "maya"
    assert served[0]["outcome"] == "ok" and served[0]["served_from"] in ("compiled", "cache")
    assert any(a["caller"] == "support-gateway" and a["outcome"] == "principal_not_allowed" for a in audit)
    assert any(a["caller"] is None and a["outcome"] == "unauthenticated" for a in audit)
    log = guarded.log_path.read_text()
    assert not any(secret in log for secret in SECRETS.values())


async def test_every_post_route_answers_a_deep_or_broken_body_with_a_code(guarded):
    deep, closed = b"[" * 100_000, b"[" * 40 + b"]" * 40  # past orjson's own bound; past ours (32)
    for path, headers in (("/v1/admin/consumers", as_("ops")), ("/v1/select", as_("credit-desk"))):
        for body, wanted in ((deep, "malformed_json"), (closed, "body_too_deep"), (b"{oops", "malformed_json")):
            status, doc, _ = await call(guarded, "POST", path, dict(headers, **{"Content-Type": "application/json"}),
                                        data=body)
            assert (status, doc["error"]["code"]) == (400, wanted), (path, body[:10], doc)
            assert len(doc["error"]["message"]) > 30
    assert guarded.proc.poll() is None


def _unknown(doc: dict, known_id: str, unknown_id: str) -> dict:
    return json.loads(json.dumps(doc).replace(known_id, unknown_id))


async def test_plans_and_receipts_of_other_principals_are_unknown_to_a_caller(guarded):
    rsa, _ = SIGNERS
    status, plan, _ = await call(guarded, "POST", "/v1/select", as_("credit-desk"),
                                 dict(ATLAS_REQUEST, at_least_as_fresh=guarded.fresh))
    assert status == 200 and plan["request"]["principal"] == "maya", plan
    plan_id, receipt_id = plan["plan_id"], plan["receipt_id"]
    nobody_plan, nobody_receipt = "plan-" + "f" * 20, "rcpt-" + "f" * 20
    unknown_plan = await call(guarded, "GET", f"/v1/plans/{nobody_plan}", as_("credit-desk"))
    unknown_receipt = await call(guarded, "GET", f"/v1/receipts/{nobody_receipt}", as_("credit-desk"))
    assert code(unknown_plan) == (404, "unknown_plan") and code(unknown_receipt) == (404, "unknown_receipt")

    # A caller limited to sam, and a JWT for sam: maya's plan and receipt answer as ids nobody issued.
    for headers in (as_("sam-desk"), as_("support-gateway"), jwt_(rsa.token("sam"))):
        status, doc, _ = await call(guarded, "GET", f"/v1/plans/{plan_id}", headers)
        assert status == 404 and _unknown(doc, plan_id, nobody_plan) == unknown_plan[1], doc
    status, doc, _ = await call(guarded, "GET", f"/v1/receipts/{receipt_id}", as_("sam-desk"))
    assert status == 404 and _unknown(doc, receipt_id, nobody_receipt) == unknown_receipt[1], doc
    assert "withheld" not in json.dumps(doc) and "maya" not in json.dumps(doc)

    # The principal's own JWT and an auditor whose principals cover it still read them.
    status, doc, _ = await call(guarded, "GET", f"/v1/plans/{plan_id}", jwt_(rsa.token("maya")))
    assert status == 200 and doc["plan_id"] == plan_id, doc
    status, doc, _ = await call(guarded, "GET", f"/v1/receipts/{receipt_id}", as_("credit-desk"))
    assert status == 200 and doc["plan_id"] == plan_id
    # sam's own plan and receipt are sam-desk's to read.
    status, own, _ = await call(guarded, "POST", "/v1/select", as_("sam-desk"), dict(ATLAS_REQUEST, principal="sam"))
    assert status == 200, own
    assert (await call(guarded, "GET", f"/v1/plans/{own['plan_id']}", as_("sam-desk")))[0] == 200
    assert (await call(guarded, "GET", f"/v1/receipts/{own['receipt_id']}", as_("sam-desk")))[0] == 200
    assert code(await call(guarded, "GET", f"/v1/plans/{own['plan_id']}", jwt_(rsa.token("maya")))) == (
        404, "unknown_plan")


async def test_end_user_jwts_name_the_only_principal(guarded):
    rsa, ec = SIGNERS
    assert (await call(guarded, "POST", "/v1/select", jwt_(ec.token("maya")), ATLAS_REQUEST))[0] == 200
    assert (await call(guarded, "POST", "/v1/select", jwt_(rsa.token("maya")), ATLAS_REQUEST))[0] == 200
    assert code(await call(guarded, "POST", "/v1/select", jwt_(rsa.token("sam")), ATLAS_REQUEST)) == (
        403, "principal_not_allowed")
    stranger = make_signers()[1]
    for bad in (rsa.token("maya", lifetime=-30), stranger.token("maya"), unsigned("maya"),
                rsa.token("maya", aud="another-service")):
        assert code(await call(guarded, "POST", "/v1/select", jwt_(bad), ATLAS_REQUEST)) == (401, "unauthenticated")
    assert code(await call(guarded, "POST", "/v1/admin/consumers", jwt_(ec.token("maya")),
                           {"topic": "clock", "action": "pause"})) == (403, "scope_missing")


async def test_a_jwt_whose_principal_claim_is_the_wildcard_is_refused(guarded):
    rsa, ec = SIGNERS
    for claim in ("*", " * "):
        for method, path, body in (("POST", "/v1/select", dict(ATLAS_REQUEST, principal="*")),
                                   ("POST", "/v1/select", ATLAS_REQUEST), ("GET", "/v1/plans/plan-" + "0" * 20, None)):
            status, doc, _ = await call(guarded, method, path, jwt_(ec.token(claim)), body)
            assert (status, doc["error"]["code"]) == (403, "principal_not_literal"), (claim, path, doc)
            assert "callers-file" in doc["error"]["message"] and "plan_id" not in doc
    assert code(await call(guarded, "POST", "/v1/select", jwt_(rsa.token("sub-of-maya", preferred_username="*")),
                           ATLAS_REQUEST)) == (403, "principal_not_allowed")  # only the configured claim counts
    assert (await call(guarded, "POST", "/v1/select", jwt_(rsa.token("maya")), ATLAS_REQUEST))[0] == 200


async def test_browsers_rebinding_and_faust_pages_are_kept_out(guarded):
    form = await call(guarded, "POST", "/v1/admin/consumers", {"Origin": "https://evil.example",
                                                               "Content-Type": "text/plain"},
                      data=b'{"topic": "clock", "action": "pause"}')
    assert code(form) == (403, "origin_not_allowed")
    plain = await call(guarded, "POST", "/v1/admin/consumers", dict(as_("ops"), **{"Content-Type": "text/plain"}),
                       data=b'{"topic": "clock", "action": "pause"}')
    assert code(plain) == (415, "unsupported_media_type")
    assert code(await call(guarded, "GET", "/healthz", {"Host": "attacker.example"})) == (400, "host_not_allowed")
    assert code(await call(guarded, "POST", "/v1/select", dict(as_("ops"), Host="rebound.example:6066"),
                           ATLAS_REQUEST)) == (400, "host_not_allowed")
    assert (await call(guarded, "GET", "/healthz", {"Host": "localhost:1"}))[0] == 200  # port ignored
    for page in ("/router/", "/table/", "/graph/", "/", "/performance/", "/stats/", "/assignment/"):
        assert code(await call(guarded, "GET", page, as_("ops"))) == (404, "not_found"), page
    assert code(await call(guarded, "GET", "/metrics")) == (404, "not_found")  # moved to its own port
    status, doc, _ = await call(guarded, "GET", "/metrics", base=guarded.metrics_url)
    assert status == 200 and "freshplan_consumer_lag_events" in doc["text"]


async def test_callers_file_edits_apply_and_bad_edits_keep_the_last_good_file(guarded):
    auditor = caller("auditor", [], ["receipts"])
    assert code(await call(guarded, "GET", "/v1/receipts/rcpt-x", as_("auditor"))) == (401, "unauthenticated")
    guarded.callers_file.write_text(json.dumps({"callers": CALLERS + [auditor]}, indent=2))

    async def until_status(headers, wanted):
        for _ in range(100):  # 5 s
            if (await call(guarded, "GET", "/v1/receipts/rcpt-x", headers))[0] == wanted:
                return True
            await asyncio.sleep(0.05)
        return False

    assert await until_status(as_("auditor"), 404)  # authenticated now: the receipt is simply unknown
    guarded.callers_file.write_text('{"callers": [\n  {"id": "ops", "scopes": ["admin"]\n')
    for _ in range(100):
        if "callers file change ignored" in guarded.log_path.read_text():
            break
        await asyncio.sleep(0.05)
    log = guarded.log_path.read_text()
    assert "callers file change ignored" in log and "line 3" in log
    assert code(await call(guarded, "GET", "/v1/receipts/rcpt-x", as_("auditor"))) == (404, "unknown_receipt")
    guarded.callers_file.write_text(json.dumps({"callers": CALLERS}, indent=2))
    assert await until_status(as_("auditor"), 401)


async def test_readyz_is_503_while_revocations_are_unknown_and_200_after(broker, tmp_path):
    async with launch(broker, tmp_path, wait=False) as starting:
        seen: list[tuple[int, str | None]] = []
        async with asyncio.timeout(60):
            while not seen or seen[-1][0] != 200:
                assert starting.proc.poll() is None, starting.log_path.read_text()[-3000:]
                try:
                    result = code(await call(starting, "GET", "/readyz"))
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
                    continue
                if not seen or seen[-1] != result:
                    seen.append(result)
                await asyncio.sleep(0.05)
        # The HTTP API answers well before the first revocation poll (group join takes seconds).
        assert seen[0] == (503, "revocations_unknown") and seen[-1] == (200, None), seen
        assert (await starting.select(ATLAS_REQUEST, await starting.load("atlas.jsonl")))["plan_id"]


def test_a_malformed_callers_file_stops_run_naming_line_and_field(tmp_path):
    bad = json.loads(json.dumps(CALLERS))
    bad[1]["scopes"] = ["select", "recepits"]
    path = tmp_path / "callers.json"
    path.write_text(json.dumps({"callers": bad}, indent=2))
    text = path.read_text()
    line = text.count("\n", 0, text.rindex('"scopes"', 0, text.index('"recepits"'))) + 1
    env = {"PATH": "/usr/bin:/bin", "FRESHPLAN_CALLERS_FILE": str(path), "FRESHPLAN_STATE_DIR": str(tmp_path / "s"),
           "FRESHPLAN_WEB_PORT": str(free_port())}
    out = subprocess.run([sys.executable, "-m", "agents.cli", "run"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2, out
    assert f"{path} line {line}: callers[1].scopes" in out.stderr, out.stderr
    bad[1]["scopes"] = ["select"]
    bad[2]["id"] = "credit-desk"
    path.write_text(json.dumps({"callers": bad}, indent=2))
    out = subprocess.run([sys.executable, "-m", "agents.cli", "run"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "callers[2].id duplicates" in out.stderr, out.stderr
    assert all(c["secret_sha256"] not in out.stderr + out.stdout for c in CALLERS)
