"""The backlog compiles successors first announced first, whatever partition and offset announced them."""
from __future__ import annotations

from agents.plans.backlog import recompile_queued
from tests.agents.applier_kit import raw
from tests.conftest import ATLAS_REQUEST
from tests.events import principal, regrant

COPIES = 16  # one backlog job's worth (agents/worker/loops.py compiles 16 plans per writer job)


def test_a_plan_announced_first_is_not_starved_by_plans_announced_after_it(setup):  # noqa: F811
    """Ordered by raw offsets, a partition whose offsets are high (an old, busy partition) waited behind every
    entry of a partition with lower offsets, however late those arrived: while the backlog was behind, omar's
    plan, announced first, was never recompiled (its successor never reached `plans`)."""
    state, inv, query = setup
    maya = [query.select(dict(ATLAS_REQUEST, query=f"copy {i}")) for i in range(COPIES)]
    omar = query.select(dict(ATLAS_REQUEST, principal="omar", purpose="annual_credit_review"))
    # omar's change arrives first, on source-changes partition 1 (a busy partition: its offsets are high).
    inv.apply([raw(*principal("omar", delegation_version=7), partition=1, offset=5_000_000)])
    assert query.plan_status(omar["plan_id"])["status"] == "invalidated"
    rounds = 20
    for i in range(rounds):
        # Later events on partition 0 (low offsets) touch maya's plans, one batch per backlog job.
        inv.apply([raw(*regrant("maya", 10 + i), partition=0, offset=100 + i)])
        recompile_queued(inv.plans, COPIES)
    status = query.plan_status(omar["plan_id"])
    waiting = state.queue.size()
    compiled = state.store.counters().get("compilations", 0)
    assert status["successor_plan_id"] is not None, (
        f"after {rounds} backlog jobs ({compiled} compilations, all of maya's {len(maya)} plans recompiled "
        f"{rounds} times) omar's plan, announced before all of them, still has no successor; queue={waiting}")
