"""Successors of plans announced before they were recompiled (fan-outs beyond the eager limit)."""

from __future__ import annotations

from collections import Counter
from typing import Callable

from agents.plan_writer import PlanWriter


def recompile_queued(writer: PlanWriter, limit: int, owns: Callable[[str, int], bool]) -> int:
    """Compile successors of up to `limit` announced plans; publish those whose cause this worker owns.

    `owns(topic, partition)` says whether this worker publishes for that input partition now.
    Returns how many queue entries were handled.
    """
    state = writer.state
    with state.store.transaction():
        entries = state.queue.oldest(limit) if writer.queue_pending else []
        if not entries:
            writer.queue_pending = False
            return 0
        now = state.store.now()
        heads = state.plans.heads([e[0] for e in entries])
        view = writer.snapshot([request for _, request, _ in heads.values()])
        counts: Counter[str] = Counter()
        published, local, successors, dropped = [], [], [], []
        for plan_key, topic, partition, _ in entries:
            if plan_key not in heads or heads[plan_key][2] == "fresh":
                continue  # compiled on demand by a select in the meantime
            old_id, request, _ = heads[plan_key]
            compiled = writer.compile_one(plan_key, request, view, now)
            if compiled is None:
                dropped.append(plan_key)
                continue
            counts["announced_unchanged"] += compiled.plan_id == old_id
            successors.append((old_id, compiled.plan_id))
            (published if owns(topic, partition) else local).append(compiled)
        state.plans.set_successors(successors)
        writer.store(published, now, counts, publish=True)
        writer.store(local, now, counts, publish=False)
        state.plans.drop_heads(dropped)
        state.index.drop_many(dropped)
        state.queue.remove([e[0] for e in entries])
        state.store.bump_many(counts)
    return len(entries)
