"""Answer selects from local state: serve a fresh plan from the store or compile one."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from compiler.pipeline import compile_request
from compiler.request import Limits, parse_request, plan_key
from compiler.resolve import resolve_entity
from schemas.freshness import encode_token
from agents.invalidation import Invalidator
from state.local_state import LocalState


class QueryService:
    """The read path: plan key lookup, then cache or compile."""

    def __init__(self, state: LocalState, invalidator: Invalidator, guard=None) -> None:
        self.state = state
        self.invalidator = invalidator
        self.guard = guard  # a LagWatcher; None only where no broker exists (unit tests)
        self.on_compile = None  # seconds per compilation on the read path
        self.selects: Counter[str] = Counter()  # per process; the read path writes nothing it need not
        self.limits = Limits()  # largest request fields a select accepts
        self.selected: set[str] = set()  # plan keys selected since the last retention pass (stamped there)

    def token(self) -> str:
        """Freshness token of the state as it is now."""
        store = self.state.store
        return encode_token(store.next_offsets(), *store.incarnation())

    def select(self, doc: Any) -> dict[str, Any]:
        """Return the plan for a select body; raises RequestError for bad requests."""
        state = self.state
        if isinstance(doc, dict):
            doc = {k: v for k, v in doc.items() if k != "at_least_as_fresh"}
        request = parse_request(doc, self.limits)
        degraded: list[str] = []
        if self.guard is not None:
            self.guard.check()
            degraded = self.guard.degraded()
        entity_id = resolve_entity(request.entity, state.catalog.entity_matches(request.entity))
        key = plan_key(request, entity_id)
        self.selected.add(key)
        plan = state.plans.fresh_plan(key)
        served_from = "cache"
        if plan is None:
            now = state.store.now()
            started = time.perf_counter()
            compiled = compile_request(request, state.catalog, now)
            if self.on_compile:
                self.on_compile(time.perf_counter() - started)
            with state.store.transaction():
                # Read-path counters stay in memory: a counter write would cost as much as the plan.
                self.invalidator.store_compiled([compiled], now, self.selects)
            plan = compiled.plan
            served_from = "compiled"
        self.selects[f"selects.{served_from}"] += 1
        out = dict(plan, freshness_token=self.token(), served_from=served_from)
        if degraded:
            out["degraded"] = degraded  # paused inputs that can make this answer less current
        return out

    def take_selected(self) -> set[str]:
        """The plan keys selected since the last call (for the retention pass to stamp)."""
        taken, self.selected = self.selected, set()
        return taken

    def plan_status(self, plan_id: str) -> dict[str, Any] | None:
        """Public status of a plan id (an evicted one is invalidated, reason `evicted`), or None when unknown."""
        return self.state.plans.status(plan_id) or self.state.retention.evicted_status(plan_id)

    def health(self) -> dict[str, Any]:
        """Liveness plus what the worker has applied."""
        store = self.state.store
        now = store.now()
        return {"status": "ok", "now": now and now.isoformat().replace("+00:00", "Z"),
                "applied_offsets": store.next_offsets(), "freshness_token": self.token(),
                "plans": self.state.plans.counts(), "index_edges": self.state.index.size(),
                "outbox": self.state.outbox.size(), "retention": self.state.retention.sizes(),
                "counters": dict(Counter(store.counters()) + self.selects),
                "revocations": self.guard.status().as_dict() if self.guard else None,
                "lag": self.guard.lags() if self.guard else {},
                "last_events": self.invalidator.last_event}
