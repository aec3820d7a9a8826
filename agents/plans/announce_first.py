"""Announce touched plans in the apply batch's transaction; successors are compiled later by the backlog."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING

import orjson

from agents.plans import plan_facts
from compiler.dependency_keys import resource_id
from schemas.outbound import Cause
from state.catalog_snapshot import CatalogSnapshot
from state.fan_out import Announcement, FanOut

if TYPE_CHECKING:
    from agents.plans.plan_writer import PlanWriter, Touched
    from state.local_state import LocalState

log = logging.getLogger(__name__)

FEW = 1024
"""Fan-outs of up to this many touched plans not announced yet are written row by row: `FanOut` stages
three tables and costs about ten statements whatever the size, where rows cost one insert per table and a
Python pass. Measured in process, a whole apply batch editing resources of fresh plans (median ms, row
by row against column-wise): 156 plans 63 against 83, 400 plans 123 against 149, about 1,500 plans 276
against 420, about 3,000 plans 415 against 415. With 64 here, the start of a 1,000 events/s stream (every
plan fresh, batches touching 65-200) took the column-wise path at about 105 ms a batch."""

READ_FIRST = 4096
"""Up to this many touched plans, their heads are read first: a batch of a stream touches the same plans
again and again (each principal change all of its principal's), and those announced already, waiting
for their successors, are skipped before choosing how to write the few left (1,000 events/s on the
bench workload: about 200 touched and 7 to announce per batch)."""

LOGGED_ONE_BY_ONE = 16
"""Up to this many plans announced row by row are logged a line each; more, a line per event (as column-wise)."""

COMPILE_FIRST = 16
"""Plans touched only through a resource they left out (not admitted) are recompiled before anything is
announced when a batch has at most this many: about half come out identical on the bench's workload,
and announcing those would be over-invalidation. More are announced first: compiles must not hold a batch."""

def announce_first(writer: PlanWriter, touched: Touched, now: datetime | None, counts: Counter[str],
                   standby: bool, announced: frozenset[str] = frozenset()) -> Touched:
    """Announce touched plans not announced yet, mark them invalidated and queue their successors.

    Returns the touched plans the caller must recompile at once instead (nothing written for them):
    all of them when their heads are no more than the writer's `eager_limit`; else those touched
    through a resource they did not admit, when few (`COMPILE_FIRST`). A new version of a resource
    a plan admitted always changes the plan (its id digests admitted versions), so announcing it
    before compiling costs no precision; any other change is announced first only when compiling
    first would hold the batch too long, or when it is not a resource's. Plans in `announced` (told
    stale early) are always announced here: compiled again they could come out identical and be adopted.
    """
    if not touched:
        return {}
    if len(touched) <= READ_FIRST:
        heads = writer.state.plans.heads_stamped(list(touched))
        if sum(head.status != "invalidated" for head in heads.values()) <= FEW:
            return _row_by_row(writer, touched, now, counts, standby, heads, announced)
    return _column_wise(writer, touched, now, counts, standby, announced)


def _left_out(state: LocalState, touched: Touched, heads: dict) -> set[str]:
    """Plan keys with a fresh head touched through a `resource:` key of a resource that head did not admit."""
    through = {k: resource_id(touch.dependency_key) for k, touch in touched.items()
               if k in heads and heads[k].status != "invalidated" and resource_id(touch.dependency_key) is not None}
    if not through:
        return set()
    admitted = plan_facts.admitted(state, {heads[k].plan_id for k in through})
    return {k for k, rid in through.items() if rid not in admitted.get(heads[k].plan_id, ())}


def _row_by_row(writer: PlanWriter, touched: Touched, now: datetime | None, counts: Counter[str],
                standby: bool, heads: dict, told: frozenset[str]) -> Touched:
    """A few plans to announce: one `Invalidation` each, as the eager path builds them, in one write per table."""
    state = writer.state
    if len(heads) <= writer.eager_limit:
        compile_now = {k: v for k, v in touched.items() if k not in told}
    else:
        left_out = _left_out(state, touched, heads) - told
        compile_now = {k: touched[k] for k in left_out} if len(left_out) <= COMPILE_FIRST else {}
    touched = {k: v for k, v in touched.items() if k not in compile_now}
    visible = writer.discoverable(touched, heads)
    view = None
    announced, sources, queued, memo, events = [], [], [], {}, Counter()
    quiet = sum(k in heads and heads[k].status != "invalidated" for k in touched) > LOGGED_ONE_BY_ONE
    for plan_key, touch in touched.items():
        dep_key, cause = touch.dependency_key, touch.cause
        head = heads.get(plan_key)
        if head is None or head.status == "invalidated":  # announced already: its successor is queued
            continue
        old_id, request = head.plan_id, head.request
        took_over = False
        if dep_key.startswith("time:"):  # only a crossed time key can hand the plan to another bundle version
            view = view or CatalogSnapshot(state.catalog)
            took_over = view.policy_took_over(dep_key, orjson.loads(request), now)
        announced.append(writer.caused(old_id, plan_key, dep_key, cause, None, now, memo, visible.get(old_id),
                                       "policy_changed" if took_over else None, quiet=quiet))
        sources.append((cause.topic, cause.partition, cause.offset))
        queued.append(plan_key)
        events[cause.event_id] += 1
    writer.announce(announced, sources, standby)
    state.plans.invalidate_many([e.history_entry() for e in announced], now)
    state.queue.add_many(queued)
    writer.queue_pending = writer.queue_pending or bool(queued)
    counts["invalidations"] += len(announced)
    counts["deferred_recompilations"] += len(queued)
    if quiet:
        _log_per_event(events)
    return compile_now


def _column_wise(writer: PlanWriter, touched: Touched, now: datetime | None, counts: Counter[str],
                 standby: bool, told: frozenset[str]) -> Touched:
    """Many plans: built column-wise (`state.fan_out`), one announcement per group of plans sharing event,
    key and stamps, its plan ids and keys filled in by SQL; an index lookup and a record per plan."""
    state = writer.state
    causes: list[Cause] = []
    index: dict[Cause, int] = {}
    dep_keys, cause_of = [], []
    for touch in touched.values():
        cause = touch.cause
        dep_keys.append(touch.dependency_key)
        cause_of.append(index.setdefault(cause, len(causes)))
        if cause_of[-1] == len(causes):
            causes.append(cause)
    fan = FanOut(state.store, state.outbox)
    try:
        heads, groups = fan.stage(list(touched), dep_keys, cause_of)
        if heads <= writer.eager_limit and not told & touched.keys():
            return touched
        announced, memo, events = [], {}, Counter()
        view = CatalogSnapshot(state.catalog)
        for group in groups:
            cause = causes[group.cause]
            request = {} if group.decision_type is None else {"decision_type": group.decision_type}
            took_over = view.policy_took_over(group.dep_key, request, now)
            visible = None if group.redact else {group.dep_key.partition(":")[2]}
            for _ in range(group.plans - 1):  # `caused` observes the latency of one of them
                writer.observe_latency(cause)
            entry = writer.caused("", "", group.dep_key, cause, None, now, memo, visible,
                                  "policy_changed" if took_over else None, quiet=True)
            template = entry.template()
            if template is None:
                raise ValueError("an invalidation's cause holds its own placeholders")
            announced.append(Announcement(group, entry.reason, orjson.dumps(entry.cause).decode(), template,
                                          (cause.topic, cause.partition, cause.offset)))
            events[cause.event_id] += group.plans
        fan.write(announced, writer.topic_of("plan-invalidations"), writer.topic_of("receipts"), standby, now)
    finally:
        fan.drop()
    total = sum(events.values())
    writer.queue_pending = writer.queue_pending or bool(total)
    counts["invalidations"] += total
    counts["deferred_recompilations"] += total
    _log_per_event(events)
    return {}


def _log_per_event(events: Counter[str]) -> None:
    """One line per event: the plan ids are on the topic."""
    for event_id, n in events.items():
        log.info("invalidated %d plans, successors to follow", n,
                 extra={"event_id": event_id, "plans": n, "reason": "fan_out"})
