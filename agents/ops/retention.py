"""The retention timer: one bounded pass of `state.retention` per interval, logged and counted."""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable, Protocol

from agents.plans.plan_writer import wall_now
from state.local_state import LocalState
from state.retention import PassResult, RetentionPolicy, Topics

log = logging.getLogger(__name__)

BATCH = 1000
"""Most plan keys, plan rows and receipts one pass removes, each: a pass stays a few milliseconds."""


class Selections(Protocol):
    """What the query service keeps of the plan keys it served since the last pass (`QueryService`)."""

    selected: set[str]

    def take_selected(self) -> set[str]:
        """The plan keys served since the last call, forgotten there."""


class RetentionTimer:
    """Stamps what this worker served, evicts what nobody here selected, expires old rows, receipts and event ids.

    Only a plan's owner serves it (selects for another owner's entity are forwarded), so the
    owner's stamps are the whole story and the owner alone evicts and announces `evicted`. An
    eviction has no input event: it only tells caches to drop a plan that the next select
    compiles again (with the same plan id when nothing changed). With the announcement the
    owner tombstones the plan key on `plans` and on `plan-dependencies`; every worker's plan
    feed forgets the parked record, so a later owner does not take an evicted plan over.
    """

    def __init__(self, state: LocalState, query: Selections, policy: RetentionPolicy, topics: Topics) -> None:
        self.state = state
        self.query = query
        self.policy = policy
        self.topics = topics

    def run_once(self) -> PassResult | None:
        """One pass at the current event time; None before the first clock tick or if the pass failed."""
        selected = self.query.take_selected()
        result = self._pass(selected)
        if result is None:
            self.query.selected |= selected  # stamped by a later pass
        return result

    async def run(self, run: Callable[..., Awaitable[Any]]) -> PassResult | None:
        """As `run_once`, the pass itself run by `run` (the writer thread); selects are taken on this loop."""
        selected = self.query.take_selected()
        result = await run(self._pass, selected)
        if result is None:
            self.query.selected |= selected
        return result

    def _pass(self, selected: set[str]) -> PassResult | None:
        store = self.state.store
        now = store.now()
        if now is None:
            return None  # no event time yet: nothing can have aged, and stamps wait for a tick
        try:
            with store.transaction():
                result = self.state.retention.run_pass(now, self.policy, selected, self.topics, wall_now())
        except Exception:  # noqa: BLE001 - housekeeping must never stop a worker; the next pass retries
            log.exception("retention pass failed; nothing was removed")
            return None
        ids = result.event_ids
        removed = len(result.evicted) + result.plan_rows_expired + result.receipts_expired + ids.generations_dropped
        log.log(logging.INFO if removed or ids.opened else logging.DEBUG,
                "retention pass: %d plans evicted, %d old plan rows and %d receipts expired, %d event ids forgotten "
                "(%d generations dropped%s), %d selects stamped",
                len(result.evicted), result.plan_rows_expired, result.receipts_expired, ids.ids_dropped,
                ids.generations_dropped, ", a new one opened" if ids.opened else "", len(selected),
                extra={"plans_evicted": len(result.evicted), "plan_rows_expired": result.plan_rows_expired,
                       "receipts_expired": result.receipts_expired, "event_ids_expired": ids.ids_dropped,
                       "event_id_generations_dropped": ids.generations_dropped})
        return result
