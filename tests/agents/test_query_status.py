"""A plan's status is its owner's to give, unless this worker knows it invalidated (final)."""

from __future__ import annotations

import pytest

from agents.web.peers import NotOwner
from schemas.plan_partition import plan_partition
from tests.agents.test_ownership import _event, nodes  # noqa: F401 - the two-node fixture
from tests.conftest import ATLAS_REQUEST
from tests.events import revoke_role

pytestmark = pytest.mark.timeout(60)


def test_a_handed_back_or_parked_plans_status_is_referred_to_its_owner(nodes):  # noqa: F811
    a, b = nodes
    a.own(0, 1)
    plan = a.query.select(ATLAS_REQUEST)
    mine = plan_partition(plan["entity_id"], 2)
    assert a.query.plan_status(plan["plan_id"])["status"] == "fresh"
    a.own(1 - mine)  # handed back: "fresh" here may be stale, the new owner knows
    with pytest.raises(NotOwner) as referred:
        a.query.plan_status(plan["plan_id"])
    assert referred.value.partition == mine
    b.parked.park(a.published("plan-dependencies"))
    b.own(1 - mine)  # known only parked
    with pytest.raises(NotOwner):
        b.query.plan_status(plan["plan_id"])
    assert b.query.plan_status("plan-unknown") is None


def test_an_invalidation_known_here_is_answered_here(nodes):  # noqa: F811
    a, _ = nodes
    a.own(0, 1)
    plan = a.query.select(ATLAS_REQUEST)
    a.apply(_event(revoke_role("maya", "credit_analyst")))
    a.own(1 - plan_partition(plan["entity_id"], 2))
    status = a.query.plan_status(plan["plan_id"])
    assert status["status"] == "invalidated" and status["reason"] == "principal_changed"
