"""Successors of plans announced before they were recompiled (fan-outs beyond the eager limit)."""

from __future__ import annotations

from collections import Counter

import orjson

from agents.plans.plan_writer import PlanWriter

# Announced plans one backlog job recompiles at most. Bigger jobs compile more per second (a job's statements cost
# about the same for 16 plans as for 64: in process, 4.4 ms a successor in jobs of 16 against 1.8 ms in jobs of 64),
# but an edit fetched while its plan's successor compiles is announced only when that job stores it, so subscribers
# wait for whole jobs: in a worker at 1,000 events/s the bench workload's p99 was 605-823 ms with 64, 288-317 ms
# with 16 (2026-12-06, two runs each).
PASS_PLANS = 16
IDLE_STEP_FACTOR = 4
"""A backlog job takes this many times its step (`FRESHPLAN_BACKLOG_STEP`, `PASS_PLANS` by default) while no input
would wait for it: the replica catches up (`Replica.catching_up`: input waited in the broker for its last batch,
or fetched input waits), or no input came for `INPUT_IDLE` seconds. Jobs of 64 compile about twice as many
successors per second; latency is then the backlog's age, or nobody's. 20,000 events of the bench workload
published while a worker was paused (2026-12-07, 3 runs each, one core): 7,050-7,430 events/s with jobs of 16
always, 8,060-10,400 with 64 always."""
INPUT_IDLE = 0.2  # seconds without an input batch: a stream of 200 events/s applies one every 5-50 ms


def pass_plans(catching_up: bool, idle_seconds: float, step: int = PASS_PLANS) -> int:
    """How many announced plans the next backlog job recompiles at most (see `IDLE_STEP_FACTOR`)."""
    return step * IDLE_STEP_FACTOR if catching_up or idle_seconds >= INPUT_IDLE else step


def announcements_out(writer: PlanWriter) -> bool:
    """Whether the records that were due when the backlog first found the outbox busy have gone out (the worker's
    backlog job compiles nothing until they have).

    A fan-out's announcements go out before its successors are compiled (for about a second at
    100,000 plans). Records queued since do not hold the backlog back: a steady stream of them
    (dead letters, other fan-outs) would otherwise leave the queued plans announced without
    successors for as long as it lasts.
    """
    if not writer.queue_pending:
        return True
    state = writer.state
    if writer.backlog_waits_for is None:
        writer.backlog_waits_for = state.outbox.last_due()
    if writer.backlog_waits_for is not None and state.outbox.last_due(writer.backlog_waits_for) is not None:
        return False
    writer.backlog_waits_for = None
    return True


def recompile_queued(writer: PlanWriter, limit: int) -> int:
    """Compile and publish successors of up to `limit` announced plans (this worker owns every plan it queued);
    how many queue entries were handled."""
    state = writer.state
    with state.store.transaction():
        entries = state.queue.oldest(limit) if writer.queue_pending else []
        if not entries:
            writer.queue_pending = False
            return 0
        now = state.store.now()
        heads = {key: head._replace(request=orjson.loads(head.request))
                 for key, head in state.plans.heads(entries).items()}
        view = writer.snapshot([head.request for head in heads.values()], now)
        counts: Counter[str] = Counter(backlog_jobs=1, backlog_job_plans=len(entries))  # their ratio: plans a job
        published, successors, dropped = [], [], []
        # Skipped: compiled on demand by a select in the meantime.
        due = [(k, heads[k].request) for k in entries if k in heads and heads[k].status != "fresh"]
        compiled_all = writer.compile_all(due, view, now)
        for plan_key in entries:
            if plan_key not in compiled_all:
                continue
            old_id = heads[plan_key].plan_id
            compiled = compiled_all[plan_key]
            if compiled is None:
                dropped.append(plan_key)
                continue
            counts["announced_unchanged"] += compiled.plan_id == old_id
            successors.append((old_id, compiled.plan_id))
            published.append(compiled)
        state.plans.set_successors(successors)
        replaced = {plan_key: head.plan_id for plan_key, head in heads.items()}  # read above: not again
        writer.store(published, now, counts, publish=True, replaces=replaced)
        state.plans.drop_heads(dropped)
        state.index.drop_many(dropped)
        state.queue.remove(entries)
        state.store.bump_many(counts)
    return len(entries)
