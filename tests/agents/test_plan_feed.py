"""Judging another worker's plan: adopt it when local state agrees, announce it stale when it does not."""

from __future__ import annotations

import orjson
import pytest

from agents.event_apply import EventApplier
from agents.plan_writer import PlanWriter
from agents.plan_feed import PlanFeed
from agents.query import QueryService
from state.local_state import LocalState
from tests.agents.test_invalidation import outbox, raw
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from tests.events import resource


def _worker(path):
    state = LocalState.open(path)
    inv = EventApplier(state, PlanWriter(state, lambda name: f"x-{name}"))
    inv.apply([raw(item["topic"], item["event"], offset=i) for i, item in
               enumerate(map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines()))])
    return state, inv


@pytest.fixture
def pair(tmp_path):
    a, b = _worker(tmp_path / "a.duckdb"), _worker(tmp_path / "b.duckdb")
    yield a, b
    a[0].close()
    b[0].close()


def _published_plan(state: LocalState) -> dict:
    [plan] = outbox(state, "plans")
    return plan


def test_a_plan_compiled_on_the_same_state_is_adopted(pair):
    (a, a_inv), (b, b_inv) = pair
    QueryService(a, a_inv.plans).select(ATLAS_REQUEST)
    plan = _published_plan(a)
    assert plan["compiled_as_of"]["source-changes"]
    PlanFeed(b, b_inv.plans, None, "", "x-plans")._judge([(0, 0, plan)])
    assert b.plans.status(plan["plan_id"])["status"] == "fresh"
    assert outbox(b, "plan-invalidations") == []
    # Adopted means indexed: the next relevant event on this worker invalidates it.
    b_inv.apply([raw(*resource("approved-waiver-W2"), offset=100)])
    [announced] = outbox(b, "plan-invalidations")
    assert announced["plan_id"] == plan["plan_id"]


def test_a_plan_older_than_local_state_is_announced_stale_with_a_successor(pair):
    (a, a_inv), (b, b_inv) = pair
    QueryService(a, a_inv.plans).select(ATLAS_REQUEST)
    plan = _published_plan(a)
    b_inv.apply([raw(*resource("approved-waiver-W2"), offset=100)])   # b is ahead of the plan
    PlanFeed(b, b_inv.plans, None, "", "x-plans")._judge([(1, 7, plan)])
    [announced] = outbox(b, "plan-invalidations")
    assert announced["plan_id"] == plan["plan_id"] and announced["reason"] == "stale_on_arrival"
    assert announced["cause"] == {"topic": "x-plans", "partition": 1, "offset": 7, "event_id": plan["plan_id"],
                                  "dependency_key": f"plan:{plan['plan_id']}"}
    successor = QueryService(b, b_inv.plans).select(ATLAS_REQUEST)
    assert announced["successor_plan_id"] == successor["plan_id"] != plan["plan_id"]
    assert b.plans.status(plan["plan_id"])["status"] == "invalidated"
