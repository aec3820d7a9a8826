"""Pass 1, parse: turn a request document into a DecisionRequest and its plan key."""

from __future__ import annotations

import hashlib
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


def parse_request(doc: Any) -> DecisionRequest:
    """Validate a select body; unknown fields and missing control fields are errors."""
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
    query = doc.get("query") or ""
    if not isinstance(query, str):
        raise ParseError("invalid_field", "Field 'query' must be a string.")
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
                           budget=_parse_budget(doc.get("budget")))


def _parse_budget(raw: Any) -> Budget:
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
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
                kind is int and int(value) != value):
            raise ParseError("invalid_field", f"Budget '{name}' must be a non-negative "
                             f"{'integer' if kind is int else 'number'}.")
        values[name] = kind(value)
    return Budget(**values)


def plan_key(request: DecisionRequest, entity_id: str) -> str:
    """Hash of the request's dimensions with the resolved entity: what a plan cache is keyed by."""
    dims = dict(request.as_dict(), entity=entity_id)
    return "pk-" + hashlib.sha256(orjson.dumps(dims, option=orjson.OPT_SORT_KEYS)).hexdigest()[:20]
