"""Which owned plans an applied batch touched, each under the first event and dependency key that reached it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from compiler import dependency_keys as dk
from schemas.outbound import Cause
from schemas.quick_init import quick_init
from state.dependency_index import DependencyIndex
from state.invalidations import Touch


@quick_init
@dataclass(frozen=True, slots=True)
class AppliedEvent:
    """One event of a batch as the writer applied it."""

    keys: list[str]
    """The dependency keys it changed, in the order the catalog gave them."""
    cause: Cause
    """The event: its logical input topic, position, event id and broker timestamp."""
    due: dict[str, str] = field(default_factory=dict)
    """Plan key -> the `time:` key a clock tick reached (filled by `mark_due` for the batch's first such tick)."""


def mark_due(index: DependencyIndex, ticks: list[tuple[datetime, int]], applied: list[AppliedEvent]) -> None:
    """Plans whose validity horizon a tick reached, each under the first tick in the batch that reached it.

    `ticks` holds (now, place in `applied`). One index read for the latest tick: a horizon that tick reached, an
    earlier one may have too.
    """
    if not ticks:
        return
    for plan_key, time_key in index.due(max(now for now, _ in ticks)).items():
        horizon = dk.time_of(time_key)
        first = next((n for now, n in ticks if horizon is None or now >= horizon), ticks[-1][1])
        applied[first].due[plan_key] = time_key


def touched_plans(index: DependencyIndex, applied: list[AppliedEvent]) -> dict[str, Touch]:
    """Plan keys touched by the batch, each with the first dependency key and event that touched it."""
    first: dict[str, tuple[tuple[int, int], Cause]] = {}  # key -> (event order, key's place in it), event
    touched: dict[str, tuple[tuple[int, int], str, Cause]] = {}
    for order, event in enumerate(applied):
        for place, key in enumerate(event.keys):
            first.setdefault(key, ((order, place), event.cause))
        for plan_key, time_key in event.due.items():
            touched.setdefault(plan_key, ((order, -1), time_key, event.cause))  # before any key of its event
    # The earliest event wins, and within it its first key: the same cause whatever order the edges come in
    # (a batch applied again after a crash names the cause it named before).
    for plan_key, dep_key in index.affected_pairs(list(first)):
        order, cause = first[dep_key]
        if plan_key not in touched or order < touched[plan_key][0]:
            touched[plan_key] = (order, dep_key, cause)
    return {k: Touch(dep_key, cause) for k, (_, dep_key, cause) in touched.items()}
