"""Successors of plans announced before they were recompiled (fan-outs beyond the eager limit)."""

from __future__ import annotations

from collections import Counter
from typing import Callable

from agents.plans.plan_writer import PlanWriter

# Announced plans one backlog job recompiles at most. Bigger jobs compile more per second (a job's statements cost
# about the same for 16 plans as for 64: in process, 4.4 ms a successor in jobs of 16 against 1.8 ms in jobs of 64),
# but an edit fetched while its plan's successor compiles is announced only when that job stores it, so subscribers
# wait for whole jobs: in a worker at 1,000 events/s the bench workload's p99 was 605-823 ms with 64, 288-317 ms
# with 16 (2026-12-06, two runs each).
PASS_PLANS = 16


def recompile_queued(writer: PlanWriter, limit: int, owns: Callable[[str, int], bool],
                     after_outbox: bool = False) -> int:
    """Compile successors of up to `limit` announced plans; publish those whose cause this worker owns.

    `owns(topic, partition)` says whether this worker publishes for that input partition now.
    With `after_outbox`, nothing is compiled while records that were due when this job first
    found the outbox busy are still waiting: a fan-out's announcements go out before this job
    runs (for about a second at 100,000 plans). Records queued since do not hold it back: a
    steady stream of them (dead letters, other fan-outs) would otherwise leave the queued plans
    announced without successors for as long as it lasts.
    Returns how many queue entries were handled.
    """
    state = writer.state
    if after_outbox and writer.queue_pending:
        if writer.backlog_waits_for is None:
            writer.backlog_waits_for = state.outbox.last_due()
        if writer.backlog_waits_for is not None and state.outbox.last_due(writer.backlog_waits_for) is not None:
            return 0
        writer.backlog_waits_for = None
    with state.store.transaction():
        entries = state.queue.oldest(limit) if writer.queue_pending else []
        if not entries:
            writer.queue_pending = False
            return 0
        now = state.store.now()
        heads = state.plans.heads([e[0] for e in entries])
        view = writer.snapshot([request for _, request, _ in heads.values()], now)
        counts: Counter[str] = Counter()
        published, local, successors, dropped = [], [], [], []
        # Skipped: compiled on demand by a select in the meantime.
        due = [(e[0], heads[e[0]].request) for e in entries if e[0] in heads and heads[e[0]].status != "fresh"]
        compiled_all = writer.compile_all(due, view, now)
        for plan_key, topic, partition, _ in entries:
            if plan_key not in compiled_all:
                continue
            old_id, _, _ = heads[plan_key]
            compiled = compiled_all[plan_key]
            if compiled is None:
                dropped.append(plan_key)
                continue
            counts["announced_unchanged"] += compiled.plan_id == old_id
            successors.append((old_id, compiled.plan_id))
            (published if owns(topic, partition) else local).append(compiled)
        state.plans.set_successors(successors)
        replaced = {plan_key: head.plan_id for plan_key, head in heads.items()}  # read above: not again
        writer.store(published, now, counts, publish=True, replaces=replaced)
        writer.store(local, now, counts, publish=False, replaces=replaced)
        state.plans.drop_heads(dropped)
        state.index.drop_many(dropped)
        state.queue.remove([e[0] for e in entries])
        state.store.bump_many(counts)
    return len(entries)
