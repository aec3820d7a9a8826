"""What each stored plan admitted and may disclose, remembered by plan id on the writer: a plan id digests both."""

from __future__ import annotations

from typing import Callable, Collection, Sequence

from compiler.pipeline import CompiledPlan
from state.local_state import LocalState

ADMITTED_MEMO = "plans.admitted"  # plan id -> resource ids it admitted (`Store.cached`)
DISCOVERABLE_MEMO = "plans.discoverable"  # plan id -> resource ids its principal may learn of (`Store.cached`)
ENTRIES = 20_000  # per memo; a full memo starts again empty
DISCOVERABLE_ENTRIES = ENTRIES


def admitted_in(plan: dict) -> set[str]:
    """Resource ids a plan admitted (as `PlanStore.admitted` reads them)."""
    return {item["resource_id"] for item in plan.get("admitted") or ()}


def discoverable_in(plan: dict) -> set[str]:
    """Resource ids a plan's principal may learn of: what it admitted or rejected (as `PlanStore.discoverable`)."""
    return {item["resource_id"] for part in ("admitted", "rejected") for item in plan.get(part) or ()}


def remember(state: LocalState, plans: Sequence[CompiledPlan]) -> None:
    """Keep both facts of plans the writer stores, so that the batches after it need no read of their JSON."""
    _keep(state, ADMITTED_MEMO, {p.plan_id: admitted_in(p.plan) for p in plans})
    _keep(state, DISCOVERABLE_MEMO, {p.plan_id: discoverable_in(p.plan) for p in plans})


def admitted(state: LocalState, plan_ids: Collection[str]) -> dict[str, set[str]]:
    """Resource ids each of these plans admitted: remembered, or read from the file (and remembered)."""
    return _facts(state, ADMITTED_MEMO, plan_ids, state.plans.admitted)


def discoverable(state: LocalState, plan_ids: Collection[str]) -> dict[str, set[str]]:
    """Resource ids each of these plans' principal may learn of: remembered, or read from the file (and remembered)."""
    return _facts(state, DISCOVERABLE_MEMO, plan_ids, state.plans.discoverable)


def _facts(state: LocalState, memo: str, plan_ids: Collection[str],
           read: Callable[[list[str]], dict[str, set[str]]]) -> dict[str, set[str]]:
    known = state.store.cached(memo, dict)
    found = {plan_id: known[plan_id] for plan_id in plan_ids if plan_id in known}
    missing = sorted(set(plan_ids) - set(found))
    if missing:
        fresh = read(missing)
        _keep(state, memo, fresh)
        found.update(fresh)  # taken before the memo may have been cleared to make room for `fresh`
    return found


def _keep(state: LocalState, memo: str, facts: dict[str, set[str]]) -> None:
    known = state.store.cached(memo, dict)
    if len(known) + len(facts) > ENTRIES:
        known.clear()
    known.update(facts)
