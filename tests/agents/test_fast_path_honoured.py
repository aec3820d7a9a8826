"""A plan announced stale early is invalidated in the file under the cause it was announced with, however the
writer would have judged the batch (found by a hostile review)."""

from __future__ import annotations

import pytest

from tests.agents.test_fast_path import edit_of, invalidations, raw, world  # noqa: F401 - the fixture
from tests.conftest import ATLAS_REQUEST
from tests.events import revoke_role

pytestmark = pytest.mark.timeout(60)

WHO = ATLAS_REQUEST["principal"]


async def test_a_withdrawal_announced_early_holds_in_the_file_when_plans_are_recompiled_at_once(world):  # noqa: F811
    """With an eager recompile limit the writer compiles touched plans first and adopts identical outcomes: a
    withdrawal of a role the plan never used compiles identical, yet subscribers were told it is stale."""
    fast, query = world["fast"], world["query"]
    world["applier"].plans.eager_limit = 100
    plan = query.select(ATLAS_REQUEST)
    message = raw(*revoke_role(WHO, "nobody_reads_this_role"))
    assert fast.announce([message]) == 1
    await fast.settle()
    world["applier"].apply([message])
    assert query.plan_status(plan["plan_id"])["status"] == "invalidated"


async def test_an_early_announcement_wins_over_an_edit_that_touched_the_plan_first(world):  # noqa: F811
    """The batch's first touch of the plan is an edit of a resource it rejected (compiled first by default, and
    adopted when identical): the early announcement's cause is the one the file keeps."""
    state, fast, query = world["state"], world["fast"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    assert "rm-note-N7" in [r["resource_id"] for r in plan["rejected"]]
    edit = raw(*edit_of(state, "rm-note-N7", 2))
    withdrawal = raw(*revoke_role(WHO, "nobody_reads_this_role"))
    assert fast.announce([edit, withdrawal]) == 1
    world["applier"].apply([edit, withdrawal])  # before the acknowledgement: the writer queues its own record
    assert query.plan_status(plan["plan_id"])["status"] == "invalidated"
    queued = [(r["plan_id"], r["cause"]["offset"]) for r in invalidations(state)]
    assert queued == [(plan["plan_id"], withdrawal.offset)]


async def test_a_head_compiled_after_a_withdrawal_was_applied_is_not_announced_stale_by_it(world):  # noqa: F811
    """The head cache tells the fast path of a head at its commit, on the writer, before the replica hears that the
    batch holding the withdrawal committed: judged by the replica alone, that fresh head looked stale."""
    import asyncio
    fast, sent, query = world["fast"], world["sent"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    withdrawal = raw(*revoke_role(WHO, "credit_analyst"))  # the role the plan used: its successor differs
    assert fast.announce([withdrawal]) == 1
    await fast.settle()
    fast.applied = lambda topic, partition, offset: False  # the replica has not resumed yet
    world["applier"].apply([withdrawal])
    again = query.select(ATLAS_REQUEST)  # compiled after the withdrawal was applied: fresh
    await asyncio.sleep(0)
    await fast.settle()
    assert again["plan_id"] != plan["plan_id"]
    assert [r["plan_id"] for r in sent.records] == [plan["plan_id"]]  # not the fresh successor
