"""HTTP routes: select, plans, receipts, admin, health, readiness, metrics (gatekeeping is in agents.web.gate)."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from dataclasses import dataclass
from importlib import resources
import time
from urllib.parse import quote
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import duckdb
from aiohttp.web import HTTPRequestEntityTooLarge
from faust import web

from agents.web.access import Access
from agents.web.gate import AUDIT, CALLER, principal_refusal
from agents.web.forward import is_forwarded, owner_unavailable, retry_headers, shard_restoring
from agents.web.metrics_port import serve_metrics
from agents.web.peers import NotOwner
from compiler.errors import AttestError, RequestError
from compiler.pipeline import PLAN_ID_HEX
from compiler.request import decode_body
from schemas.freshness import BadToken, covers, read_token
from streams.settings import INPUT_TOPICS, Settings

if TYPE_CHECKING:
    from agents.web.query import QueryService

log = logging.getLogger(__name__)

_PLAN_ID = re.compile(rf"plan-[0-9a-f]{{{PLAN_ID_HEX}}}")


def error(view: web.View, status: int, code: str, message: str, pass_name: str = "request") -> web.Response:
    """A JSON error body with a machine-readable code, the pass that refused, and an actionable sentence."""
    return view.json({"error": {"code": code, "pass": pass_name, "message": message}}, status=status)


@dataclass(frozen=True)
class Api:
    """What the HTTP routes need of a worker, and nothing more: reads never touch the writer's connection."""

    settings: Settings
    """The worker's settings (freshness wait, metrics port)."""
    query: "QueryService"
    """Select limits, plan status, health and the refusal counters."""
    select: Callable[[Any], Awaitable[dict[str, Any]]]
    """Answer a select body (a cache hit on the loop's cursor, a miss compiled by the writer)."""
    applied: Callable[[], dict[str, dict[int, int]]]
    """Next offsets applied per input topic and partition (the replica's, kept in memory as of its last commit)."""
    incarnation: Callable[[], tuple[str | None, int]]
    """(cluster id, rebase epoch) the applied offsets belong to."""
    incarnation_checked: Callable[[], Awaitable[bool]]
    """Wait (up to the freshness wait) until the replica has checked its offsets against the broker."""
    receipt: Callable[[str], dict[str, Any] | None]
    """A stored receipt by id."""
    plan_status: Callable[[str, Callable[[str | None], bool]], Awaitable[dict[str, Any] | None]]
    """A plan id's status (None: unknown here, or of a principal the predicate refuses); raises NotOwner for a
    plan another worker answers for."""
    pause: Callable[[str], list[int]]
    """Stop applying an input topic; returns its partitions."""
    resume: Callable[[str], list[int]]
    """Apply a paused input topic again."""
    check_ready: Callable[[], object]
    """Raise AttestError unless revocations and policies are known and applied within the bound."""
    render_metrics: Callable[[], Awaitable[bytes]]
    """Prometheus exposition text (the file's figures read off the loop)."""
    health: Callable[[], Awaitable[dict[str, Any]]]
    """The /healthz document: the query service's and the worker's figures (the file's read off the loop)."""
    owner_url: Callable[[int], str | None] = lambda partition: None
    """URL of the worker that owns a plan partition (None while unknown, e.g. during a rebalance)."""
    forward: Callable[[str, str, Any, Any], Awaitable[tuple[int, dict[str, Any]]]] | None = None
    """Send a request (URL, path, POST body or None for GET, the caller's headers) to an owner; its answer."""
    owners_known: Callable[[], bool] = lambda: True
    """Whether the consumer group has said which plan partitions this worker owns."""
    restoring: Callable[[], frozenset[int]] = lambda: frozenset()
    """Entity partitions this worker is restoring (their selects are refused with shard_restoring)."""


def register_routes(app, api: Api, access: Access) -> None:
    """Attach the HTTP API of one worker to its Faust web server."""
    guarded = _state_guarded(api)
    _register_select(app, api, access, guarded)
    _register_lookups(app, api, guarded)
    _register_admin(app, api)
    _register_probes(app, api, access)


def _state_guarded(api: Api):
    """A decorator: a failed read of the state file is a 503 state_unreadable, never a 500."""
    def state_guarded(handler):
        @functools.wraps(handler)
        async def guarded(view: web.View, *args: Any, **kwargs: Any) -> web.Response:
            try:
                return await handler(view, *args, **kwargs)
            except duckdb.Error as exc:
                return view.json(api.query.state_failed(exc).as_dict(), status=503)
        return guarded
    return state_guarded


def _register_select(app, api: Api, access: Access, state_guarded) -> None:
    """POST /v1/select: decode, check the caller and the freshness token, answer here or from the owner."""

    @app.page("/v1/select")
    class Select(web.View):
        @state_guarded
        async def post(self, request: web.Request) -> web.Response:
            try:
                body: Any = decode_body(await request.read(), api.query.limits)
            except RequestError as exc:
                return self.json(exc.as_dict(), status=exc.status)
            except HTTPRequestEntityTooLarge:
                return error(self, 413, "body_too_large", "The request body is larger than the server accepts "
                             "(1 MiB); a decision request is a small JSON object with a short query.")
            refused = principal_refusal(request.get(CALLER), body)
            if refused is not None:
                return refused
            if isinstance(body, dict) and isinstance(body.get("principal"), str):
                request[AUDIT]["principal"] = body["principal"].strip()
            wanted = body.get("at_least_as_fresh") if isinstance(body, dict) else None
            if wanted:
                stale = await _freshness_refusal(self, api, access, wanted)
                if stale is not None:
                    return stale
            try:
                result = await api.select(body)
            except NotOwner as exc:
                return await _select_forwarded(self, api, exc, body, request, bool(wanted))
            except RequestError as exc:
                if exc.status == 503:
                    api.query.selects[f"refused.{exc.code}"] += 1
                log.info("select refused: %s (%s)", exc.code, exc.pass_name,
                         extra={"code": exc.code, "pass": exc.pass_name})
                return self.json(exc.as_dict(), status=exc.status)
            request[AUDIT].update(plan_id=result["plan_id"], served_from=result["served_from"])
            log.info("select %s from %s", result["plan_id"], result["served_from"],
                     extra={"plan_id": result["plan_id"], "served_from": result["served_from"],
                            "state": result["state"], "stop_reason": result["stop_reason"]})
            return self.json(result)

        async def get(self, request: web.Request) -> web.Response:
            return error(self, 405, "method_not_allowed", "Use POST with a JSON decision request.")


async def _freshness_refusal(view: web.View, api: Api, access: Access, wanted: Any) -> web.Response | None:
    """The refusal of a select whose at_least_as_fresh this worker cannot meet in time; None when it has."""
    try:  # the MAC first, at once: a made-up token must not hold the request for the freshness wait
        target = read_token(wanted, access.token_keys.accepted())
    except BadToken as exc:
        api.query.selects["refused.token_invalid"] += 1
        return error(view, 400, exc.code, str(exc), "attest")
    # Until the replica has checked the broker, no incarnation is recorded to compare with.
    if not target.same_incarnation(*api.incarnation()) and (
            not await api.incarnation_checked() or not target.same_incarnation(*api.incarnation())):
        return error(view, 409, "token_other_incarnation", "at_least_as_fresh was issued against "
                     "another incarnation of the input topics (the broker or its topics were reset "
                     "since); its offsets mean nothing here. Select without it, or with a token "
                     "issued since the reset.", "attest")
    if not await _wait_until_fresh(api, target.offsets):
        api.query.selects["refused.not_fresh_enough"] += 1
        return error(view, 503, "not_fresh_enough", "This worker has not yet applied the "
                     f"state named by at_least_as_fresh within {api.settings.freshness_wait}s;"
                     " retry shortly.", "attest")
    return None


async def _select_forwarded(view: web.View, api: Api, exc: NotOwner, body: Any, request: web.Request,
                            with_token: bool) -> web.Response:
    """The owner's answer to a select of another worker's entity, passed on (refusals with their retry hints)."""
    status, doc = await _forwarded(api, exc, body, request.headers)
    if status == 400 and with_token and doc.get("error", {}).get("code") == "token_invalid":
        log.error("the owner refused a freshness token this worker accepted: the group's workers do not "
                  "share one token key file (FRESHPLAN_TOKEN_KEY_FILE)",
                  extra={"error_class": "token_keys_not_shared"})
    if status >= 300:
        if status == 503:
            api.query.selects["refused.owner_unavailable"] += 1
        return view.json(doc, status=status, headers=retry_headers(status, doc))
    request[AUDIT].update(plan_id=doc.get("plan_id"), served_from="forwarded")
    return view.json(doc, status=status)


def _register_lookups(app, api: Api, state_guarded) -> None:
    """GET /v1/plans/{plan_id} and /v1/receipts/{receipt_id}: what a caller may read of its principals'."""

    @app.page("/v1/plans/{plan_id}")
    class PlanStatus(web.View):
        @state_guarded
        async def get(self, request: web.Request, plan_id: str) -> web.Response:
            if not _PLAN_ID.fullmatch(plan_id):  # never issued: no read, no owner asked, however many arrive
                return error(self, 404, "unknown_plan", "No plan has that id: plan ids are 'plan-' and "
                             f"{PLAN_ID_HEX} hex digits, as /v1/select returns them.")
            try:
                status = await api.plan_status(plan_id, _reader(request))
            except NotOwner as exc:
                code, doc = await _forwarded(api, exc, None, request.headers, f"/v1/plans/{quote(plan_id, safe='')}")
                request[AUDIT]["plan_id"] = plan_id
                return self.json(doc, status=code, headers=retry_headers(code, doc))
            except RequestError as exc:
                return self.json(exc.as_dict(), status=exc.status)
            request[AUDIT]["plan_id"] = plan_id
            if status is None and not is_forwarded(request.headers):
                code, doc = await _ask_other_owners(api, f"/v1/plans/{quote(plan_id, safe='')}", request.headers)
                if code != 404:
                    return self.json(doc, status=code, headers=retry_headers(code, doc))
            if status is None:
                return error(self, 404, "unknown_plan", f"No plan '{plan_id}' is known to this worker or the "
                             "owners of the other plan partitions; use a plan_id returned by /v1/select.")
            return self.json(status)

    @app.page("/v1/receipts/{receipt_id}")
    class Receipt(web.View):
        async def get(self, request: web.Request, receipt_id: str) -> web.Response:
            receipt = api.receipt(receipt_id)
            principal = (receipt.get("request") or {}).get("principal") if receipt is not None else None
            if receipt is None or not _reader(request)(principal if isinstance(principal, str) else None):
                return error(self, 404, "unknown_receipt", f"No receipt '{receipt_id}' is known to this "
                             "worker; use a receipt_id from a plan or the receipts topic.")
            request[AUDIT]["plan_id"] = receipt.get("plan_id")
            return self.json(receipt)


def _register_admin(app, api: Api) -> None:
    """POST /v1/admin/consumers: an operator pauses or resumes applying one input topic."""

    @app.page("/v1/admin/consumers")
    class Consumers(web.View):
        async def post(self, request: web.Request) -> web.Response:
            """Pause or resume applying one input topic (maintenance; the revocation guard still watches)."""
            try:
                body: Any = decode_body(await request.read(), api.query.limits)
            except RequestError as exc:  # deep nesting would otherwise overflow the stack of a plain json parse
                return error(self, 400, exc.code, "The body must be a small JSON object: {\"topic\": one of "
                             f"{', '.join(INPUT_TOPICS)}, \"action\": \"pause\" or \"resume\"}}.")
            except HTTPRequestEntityTooLarge:
                return error(self, 413, "body_too_large", "The request body is larger than the server accepts "
                             "(1 MiB); send {\"topic\": ..., \"action\": ...}.")
            topic = body.get("topic") if isinstance(body, dict) else None
            action = body.get("action") if isinstance(body, dict) else None
            if topic not in INPUT_TOPICS or action not in ("pause", "resume"):
                return error(self, 400, "invalid_request", "Send {\"topic\": one of "
                             f"{', '.join(INPUT_TOPICS)}, \"action\": \"pause\" or \"resume\"}}.")
            partitions = api.pause(topic) if action == "pause" else api.resume(topic)
            log.warning("operator %sd %s (%d partitions)", action, topic, len(partitions))
            return self.json({"topic": topic, "action": action, "partitions": partitions})



def _register_probes(app, api: Api, access: Access) -> None:
    """The OpenAPI document, metrics, health and readiness routes."""
    document = resources.files("agents").joinpath("openapi.json").read_bytes()

    @app.page("/openapi.json")
    class OpenApi(web.View):
        async def get(self, request: web.Request) -> web.Response:
            return self.bytes(document, headers={"Content-Type": "application/json"})

    if api.settings.metrics_port is None:
        @app.page("/metrics")
        class Metrics(web.View):
            async def get(self, request: web.Request) -> web.Response:
                try:
                    text = await api.render_metrics()
                except RequestError as exc:  # the state file cannot be read (StateError): no figures to give
                    return error(self, exc.status, exc.code, exc.message, exc.pass_name)
                return self.bytes(text,
                                  headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
    else:
        @app.task
        async def metrics_port() -> None:
            await serve_metrics(api.settings, access, api.render_metrics)

    @app.page("/healthz")
    class Health(web.View):
        async def get(self, request: web.Request) -> web.Response:
            caller = request.get(CALLER)
            if caller is None or "status" not in caller.scopes:
                # Liveness for anyone; the details need the status scope.
                unreadable = api.query.unreadable is not None
                return self.json({"status": "state_unreadable" if unreadable else "ok"},
                                 status=503 if unreadable else 200)
            doc = await api.health()
            return self.json(doc, status=200 if doc["status"] == "ok" else 503)

    @app.page("/readyz")
    class Ready(web.View):
        async def get(self, request: web.Request) -> web.Response:
            try:
                api.check_ready()
            except AttestError as exc:
                return error(self, 503, exc.code, exc.message, "ready")
            if not api.owners_known():
                return error(self, 503, "owner_unavailable", "The consumer group has not yet said which plan "
                             "partitions this worker owns; it is ready once the rebalance completes.", "ready")
            return self.json({"status": "ready"})


def _reader(request: web.Request) -> Callable[[str | None], bool]:
    """Whether the request's caller may see a plan or receipt of a principal (no caller: nothing)."""
    caller = request.get(CALLER)
    return caller.may_read if caller is not None else (lambda principal: False)


async def _forwarded(api: Api, exc: NotOwner, body: Any, headers,
                     path: str = "/v1/select") -> tuple[int, dict[str, Any]]:
    """The owner's answer to a select (or, body None, a GET of `path`) for another worker's entity."""
    if exc.partition in api.restoring():
        return shard_restoring(exc.partition)
    if is_forwarded(headers):  # the sender thought this worker owned it: ownership is moving
        return owner_unavailable("is moving to another worker (a rebalance is under way)")
    url = api.owner_url(exc.partition)
    if url is None or api.forward is None:
        return owner_unavailable("is not known yet (a rebalance is under way)")
    api.query.selects["selects.forwarded" if body is not None else "plan_status.forwarded"] += 1
    return await api.forward(url, path, body, headers)


async def _ask_other_owners(api: Api, path: str, headers) -> tuple[int, dict[str, Any]]:
    """A plan unknown here may be another owner's (compiled there, superseded before this worker parked it).

    The first owner that knows it answers; 404 when none does; owner_unavailable when one that
    might cannot be asked. Only partitions this worker does not own are asked, each owner once.
    """
    urls = {api.owner_url(p) for p in api.query.peers.foreign_partitions()}
    if not urls:
        return 404, {}
    unavailable = None in urls or api.forward is None
    for url in sorted(u for u in urls if u is not None):
        if api.forward is None:
            break
        api.query.selects["plan_status.forwarded"] += 1
        code, doc = await api.forward(url, path, None, headers)
        if code != 404 and not (code == 503 and doc.get("error", {}).get("code") == "owner_unavailable"):
            return code, doc
        unavailable = unavailable or code == 503
    return owner_unavailable("cannot be asked whether it knows this plan") if unavailable else (404, {})


async def _wait_until_fresh(api: Api, target: dict) -> bool:
    deadline = time.monotonic() + api.settings.freshness_wait
    while True:
        if covers(api.applied(), target):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
