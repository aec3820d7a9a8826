"""HTTP gatekeeping in the issue's order: Host, Origin, content type, credential, scope; plus the audit line."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping

import orjson
from aiohttp import web

from agents.web.callers import Caller, match
from agents.web.tokens import JwtRefused, JwtVerifier, looks_like_jwt
from streams.settings import Settings

audit_log = logging.getLogger("freshplan.audit")

OPEN = ""
"""Scope of a route anyone may call (details may still depend on the caller)."""
JWT_SCOPES = frozenset({"select", "plans"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
WILDCARD = "*"
"""In a callers file, "any principal"; as a JWT's principal claim, refused."""
WILDCARD_CLAIM = "jwt_principal_wildcard"

CALLER = web.RequestKey("freshplan_caller", Caller)
"""The authenticated caller of a request (absent on open routes called without a credential)."""
AUDIT = web.RequestKey("freshplan_audit", dict)
"""Fields a handler adds to the request's audit line: principal, plan_id, served_from."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def api_routes(settings: Settings) -> dict[str, str]:
    """Route pattern -> scope needed on the API port; any other path is 404."""
    routes = {"/v1/select": "select", "/v1/plans/{plan_id}": "plans", "/v1/receipts/{receipt_id}": "receipts",
              "/v1/admin/consumers": "admin", "/healthz": OPEN, "/readyz": OPEN, "/openapi.json": OPEN}
    if settings.metrics_port is None:
        routes["/metrics"] = metrics_scope(settings)
    return routes


def metrics_scope(settings: Settings) -> str:
    """`status` when FRESHPLAN_METRICS_AUTH=status, else open."""
    return "status" if settings.metrics_auth == "status" else OPEN


def host_name(header: str) -> str:
    """The host of a Host header, lower case, without the port ("[::1]:6066" -> "[::1]")."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None when absent or malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token or not token.isascii():
        return None
    return token


@dataclass
class Gate:
    """Decides who a request comes from and whether it may reach its route."""

    settings: Settings
    callers: Callable[[], tuple[Caller, ...]]
    """The current callers (the callers file's last good version, or the run.json secret)."""
    jwt: JwtVerifier | None = None
    routes: Mapping[str, str] = field(default_factory=dict)
    """Route pattern -> scope; OPEN for anyone."""

    def identify(self, header: str | None) -> tuple[Caller | None, str]:
        """(caller, "") or (None, reason) for an Authorization header."""
        token = bearer(header)
        if token is None:
            return None, "missing" if not header else "malformed"
        caller = match(self.callers(), token)
        if caller is not None:
            return caller, ""
        if self.jwt is not None and looks_like_jwt(token):
            try:
                principal = self.jwt.verify(token)
            except JwtRefused as exc:
                return None, f"jwt_{exc.reason}"
            if principal == WILDCARD:  # an identity provider may let users shape the claim: never "any"
                return None, WILDCARD_CLAIM
            return Caller("jwt", frozenset({principal}), JWT_SCOPES, wildcard_allowed=False), ""
        return None, "unknown_secret"

    def origin_allowed(self, origin: str) -> bool:
        """Whether an Origin header is listed in FRESHPLAN_ALLOWED_ORIGINS."""
        return origin.lower().rstrip("/") in {o.lower().rstrip("/") for o in self.settings.allowed_origins}

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse in the documented order; record one audit line per request."""
        record: dict = {"caller": None, "principal": None, "plan_id": None, "served_from": None}
        request[AUDIT] = record
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else None
        if request.match_info.http_exception is not None:
            route = None  # e.g. a known path with a method it does not take
        response: web.StreamResponse | None = None
        try:
            response = await self._check(request, route, record) or await handler(request)
            origin = request.headers.get("Origin")
            if origin is not None and self.origin_allowed(origin) and not response.prepared:
                response.headers.update(_cors(origin))
            return response
        finally:
            self._audit(request, route, record, response)

    async def _check(self, request: web.Request, route: str | None, record: dict) -> web.StreamResponse | None:
        host = request.headers.get("Host")
        if not host or host_name(host) not in self.settings.hosts:
            return refuse(400, "host_not_allowed", "The Host header names a host this service does not answer "
                          "to (DNS rebinding guard); call it by an allowed name or add the name to "
                          "FRESHPLAN_ALLOWED_HOSTS.")
        origin = request.headers.get("Origin")
        if origin is not None and not self.origin_allowed(origin):
            return refuse(403, "origin_not_allowed", "Requests from web pages are refused unless their origin "
                          "is listed in FRESHPLAN_ALLOWED_ORIGINS.")
        if request.method == "OPTIONS" and origin is not None:
            return web.Response(status=204, headers=_cors(origin))  # a preflight from an allowed origin
        if route not in self.routes:
            if isinstance(request.match_info.http_exception, web.HTTPMethodNotAllowed):
                return refuse(405, "method_not_allowed", "This route does not take that method; see "
                              "/openapi.json.")
            return refuse(404, "not_found", "No such route; see /openapi.json for the API.")
        if request.method in BODY_METHODS and request.content_type != "application/json":
            return refuse(415, "unsupported_media_type", "Send the body as JSON with "
                          "`Content-Type: application/json`.")
        scope = self.routes[route]
        header = request.headers.get("Authorization")
        if scope == OPEN and header is None:
            return None
        caller, reason = self.identify(header)
        record["refusal"] = reason or None
        if reason == WILDCARD_CLAIM:
            return refuse(403, "principal_not_literal", "The JWT's principal claim is \"*\", which names no "
                          "principal; its identity provider must put the end user's own principal in "
                          f"{self.jwt.principal_claim if self.jwt else 'the principal claim'}. Only a callers-file "
                          "entry may be allowed any principal.")
        if caller is None:
            return refuse(401, "unauthenticated", "Send `Authorization: Bearer <secret>` with a secret from the "
                          "callers file (or, for a local `freshplan run`, the secret in its state directory's "
                          "run.json), or a valid end-user JWT.",
                          headers={"WWW-Authenticate": 'Bearer realm="freshplan"'
                                   + ("" if reason == "missing" else ', error="invalid_token"')})
        record["caller"] = caller.id
        request[CALLER] = caller
        if scope != OPEN and scope not in caller.scopes:
            return refuse(403, "scope_missing", f"Caller '{caller.id}' lacks the '{scope}' scope this route "
                          "needs; ask the operator to add it in the callers file.")
        return None

    def _audit(self, request: web.Request, route: str | None, record: dict,
               response: web.StreamResponse | None) -> None:
        status = response.status if response is not None else 500
        outcome = "ok"
        if status >= 400 and isinstance(response, web.Response) and response.body:
            try:
                outcome = orjson.loads(response.body)["error"]["code"]
            except (ValueError, TypeError, KeyError):
                outcome = str(status)
        # Probes (liveness, readiness, scrapes) would drown the audit trail; they are logged at debug,
        # a not-ready answer included (load balancers poll through start-up).
        quiet = self.routes.get(route) == OPEN and record["caller"] is None and (status < 400 or status == 503)
        audit_log.log(logging.DEBUG if quiet else logging.INFO, "%s %s -> %s %s", request.method,
                      route or "unknown", status, outcome,
                      extra=dict(record, route=f"{request.method} {route or 'unknown'}", status=status,
                                 outcome=outcome))


def refuse(status: int, code: str, message: str, headers: dict | None = None) -> web.Response:
    """The service's error body, from the gate (pass `auth`)."""
    body = {"error": {"code": code, "pass": "auth", "message": message}}
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


def _cors(origin: str) -> dict[str, str]:
    return {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": "GET, POST",
            "Access-Control-Allow-Headers": "Authorization, Content-Type", "Vary": "Origin"}


def principal_refusal(caller: Caller | None, body: object) -> web.Response | None:
    """403 when a select names a principal its caller may not ask for (None: allowed or left to the parser)."""
    principal = body.get("principal") if isinstance(body, dict) else None
    if not isinstance(principal, str) or not principal.strip():
        return None  # the request parser refuses a missing principal with 400
    if caller is not None and caller.may_ask_for(principal.strip()):
        return None
    return refuse(403, "principal_not_allowed", "This caller may not ask on behalf of that principal; ask "
                  "for one of the principals the callers file (or the JWT's subject) allows.")
