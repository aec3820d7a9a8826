"""Pass 1, parse: turn a request document into a DecisionRequest and its plan key."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from compiler.errors import ParseError
from schemas.timefmt import format_instant, parse_instant

_FIELDS = {"decision_type", "principal", "purpose", "entity", "decision_time", "query", "budget",
           "at_least_as_fresh"}
_CONTROL = ("decision_type", "principal", "purpose", "entity")
_BUDGET = {"tokens": int, "calls": int, "latency_ms": int, "privacy": float, "money": float}
_SETTING = {"tokens": "FRESHPLAN_MAX_BUDGET_TOKENS", "calls": "FRESHPLAN_MAX_BUDGET_CALLS"}


@dataclass(frozen=True, slots=True)
class Limits:
    """Largest request fields accepted; beyond them a select is refused with 422 naming the limit."""

    query_bytes: int = 4096
    """Longest `query` in UTF-8 bytes (ranking text, not a document)."""
    tokens: int = 1_000_000_000
    """Largest `budget.tokens`."""
    calls: int = 1_000_000
    """Largest `budget.calls`."""
    latency_ms: int = 86_400_000
    """Largest `budget.latency_ms` (a day)."""
    privacy: float = 1e12
    """Largest `budget.privacy`."""
    money: float = 1e12
    """Largest `budget.money`."""
    depth: int = 32
    """Deepest nesting of a JSON request body."""


@dataclass(frozen=True, slots=True)
class Budget:
    """Hard limits of one selection; None means unlimited."""

    tokens: int | None = None
    """Most context tokens the plan may admit."""
    calls: int | None = None
    """Most retrieval calls (admitted items) the plan may make."""
    latency_ms: int | None = None
    """Latency allowance, carried for the EVSI planner."""
    privacy: float | None = None
    """Privacy exposure allowance, carried for the EVSI planner."""
    money: float | None = None
    """Monetary allowance, carried for the EVSI planner."""

    def as_dict(self) -> dict[str, Any]:
        """The budget with unset limits omitted."""
        return {k: getattr(self, k) for k in _BUDGET if getattr(self, k) is not None}


@dataclass(frozen=True, slots=True)
class DecisionRequest:
    """One decision to compile; control fields come from the authenticated caller only."""

    decision_type: str
    """Decision type in the catalogue, e.g. `credit.review.continuation`."""
    principal: str
    """Principal id the plan is compiled for."""
    purpose: str
    """Purpose of use, checked by Cedar and the contract."""
    entity: str
    """Entity id or alias the decision is about."""
    decision_time: datetime | None = None
    """Explicit decision instant; None means a live decision at the service's now."""
    query: str = ""
    """Free text, used only for ranking within slots, never for control."""
    budget: Budget = Budget()
    """Hard limits of the selection."""

    @property
    def live(self) -> bool:
        """True when the decision follows the clock."""
        return self.decision_time is None

    def as_dict(self) -> dict[str, Any]:
        """The request as it appears in receipts and plan keys."""
        return {"decision_type": self.decision_type, "principal": self.principal,
                "purpose": self.purpose, "entity": self.entity,
                "decision_time": "now" if self.live else format_instant(self.decision_time),
                "query": self.query, "budget": self.budget.as_dict()}


def parse_request(doc: Any, limits: Limits | None = None) -> DecisionRequest:
    """Validate a select body; unknown fields and missing control fields are errors.

    `limits` applies to new requests; stored requests recompile without them, so that lowering
    a limit drops no plan.
    """
    if not isinstance(doc, dict):
        raise ParseError("invalid_request", "The request body must be a JSON object.")
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise ParseError("unknown_field", f"Unknown field(s) {', '.join(unknown)}; allowed fields are "
                         f"{', '.join(sorted(_FIELDS))}.")
    for name in _CONTROL:
        value = doc.get(name)
        if not isinstance(value, str) or not value.strip():
            raise ParseError("missing_field", f"Field '{name}' is required and must be a non-empty "
                             "string taken from the authenticated workflow, not from query text.")
        _utf8(name, value)
    query = doc.get("query") or ""
    if not isinstance(query, str):
        raise ParseError("invalid_field", "Field 'query' must be a string.")
    size = len(_utf8("query", query))
    if limits is not None and size > limits.query_bytes:
        raise ParseError("field_too_large", f"Field 'query' is {size} bytes; the limit is {limits.query_bytes} "
                         "bytes (FRESHPLAN_MAX_QUERY_BYTES). Send a short question, not a document.", status=422)
    when = doc.get("decision_time")
    decision_time = None
    if when not in (None, "now"):
        try:
            decision_time = parse_instant(when)
        except ValueError as exc:
            raise ParseError("invalid_field", f"Field 'decision_time': {exc}.") from None
    return DecisionRequest(decision_type=doc["decision_type"].strip(), principal=doc["principal"].strip(),
                           purpose=doc["purpose"].strip(), entity=doc["entity"].strip(),
                           decision_time=decision_time, query=query,
                           budget=_parse_budget(doc.get("budget"), limits))


def _utf8(name: str, value: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ParseError("invalid_field", f"Field '{name}' is not valid Unicode text (it contains an unpaired "
                         "surrogate escape).") from None


def _parse_budget(raw: Any, limits: Limits | None) -> Budget:
    if raw is None:
        return Budget()
    if not isinstance(raw, dict):
        raise ParseError("invalid_field", "Field 'budget' must be an object such as {\"tokens\": 760}.")
    unknown = sorted(set(raw) - set(_BUDGET))
    if unknown:
        raise ParseError("unknown_field", f"Unknown budget dimension(s) {', '.join(unknown)}; use "
                         f"{', '.join(_BUDGET)}.")
    values: dict[str, Any] = {}
    for name, kind in _BUDGET.items():
        value = raw.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not math.isfinite(value)) or value < 0 or (
                kind is int and int(value) != value):
            raise ParseError("invalid_field", f"Budget '{name}' must be a finite non-negative "
                             f"{'integer' if kind is int else 'number'}.")
        limit = getattr(limits, name, None)
        if limit is not None and value > limit:
            where = f" ({_SETTING[name]})" if name in _SETTING else ""
            raise ParseError("budget_too_large", f"Budget '{name}' exceeds the maximum of {limit}{where}; "
                             "lower it, or omit it for no limit.", status=422)
        values[name] = kind(value)
    return Budget(**values)


def plan_key(request: DecisionRequest, entity_id: str) -> str:
    """Hash of the request's dimensions with the resolved entity: what a plan cache is keyed by."""
    dims = dict(request.as_dict(), entity=entity_id)
    return "pk-" + hashlib.sha256(orjson.dumps(dims, option=orjson.OPT_SORT_KEYS)).hexdigest()[:20]


def decode_body(raw: bytes, limits: Limits = Limits()) -> Any:
    """Decode a JSON request body; anything but strict JSON nested at most `limits.depth` deep is refused."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # Also NaN, Infinity, integers past 64 bits and nesting past orjson's own bound: not JSON here.
        raise ParseError("malformed_json", "The request body is not valid JSON; send a JSON object with "
                         "decision_type, principal, purpose and entity.") from None
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limits.depth:
                raise ParseError("body_too_deep", f"The request body nests deeper than {limits.depth} levels; "
                                 "a decision request is a flat object.")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return doc
