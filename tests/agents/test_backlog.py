"""Fan-outs beyond the eager limit: announced first, successors compiled from the durable queue."""

from __future__ import annotations

import orjson
import pytest

from agents.plans.backlog import recompile_queued
from tests.agents.applier_kit import outbox, raw
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST


def test_a_fan_out_beyond_the_eager_limit_is_announced_first_and_recompiled_later(setup):  # noqa: F811
    state, inv, query = setup
    inv.plans.eager_limit = 1
    first = query.select(ATLAS_REQUEST)
    other = query.select(dict(ATLAS_REQUEST, principal="omar", purpose="annual_credit_review"))
    bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    inv.apply([raw("policy-versions", dict(bundle, event_id="v2", version=2))])
    announced = {r["plan_id"]: r for r in outbox(state, "plan-invalidations")}
    assert set(announced) == {first["plan_id"], other["plan_id"]}
    assert all(r["successor_plan_id"] is None and r["reason"] in ("policy_changed", "contract_changed")
               for r in announced.values())
    compiled_by_selects = {p["plan_id"] for p in outbox(state, "plans")}
    assert state.queue.size() == 2 and compiled_by_selects == set(announced)
    # Nothing stale in between: the head is invalidated, so a select compiles against version 2.
    assert query.plan_status(first["plan_id"])["status"] == "invalidated"

    assert recompile_queued(inv.plans, 10) == 2
    assert state.queue.size() == 0 and recompile_queued(inv.plans, 10) == 0
    successors = {p["plan_id"] for p in outbox(state, "plans")} - compiled_by_selects
    assert len(successors) == 2 and not successors & set(announced)
    assert query.plan_status(first["plan_id"])["successor_plan_id"] in successors
    served = query.select(ATLAS_REQUEST)
    assert served["served_from"] == "cache" and served["plan_id"] in successors
    assert served["policy"]["version"] == 2


def test_a_caller_passing_a_third_positional_argument_is_refused(setup):  # noqa: F811
    # Before 2026-12-07 the third argument was an `owns(topic, partition)` callback: taken for anything else (a truthy
    # flag), such a call could compile nothing, silently.
    _, inv, _ = setup
    with pytest.raises(TypeError):
        recompile_queued(inv.plans, 10, lambda topic, partition: True)  # type: ignore[misc]
