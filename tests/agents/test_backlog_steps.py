"""How many announced plans a backlog job recompiles: few while a stream's events could wait behind it, more when none
would (input catching up, or stopped)."""

from __future__ import annotations

import asyncio
from collections import deque

import orjson
import pytest

from agents.plans.backlog import IDLE_STEP_FACTOR, INPUT_IDLE, PASS_PLANS, pass_plans
from agents.stream.apply_progress import CATCH_UP_FACTOR, ApplyProgress
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST, eventually, launch


PASS_PLANS_BEHIND = PASS_PLANS * IDLE_STEP_FACTOR


def test_a_backlog_job_takes_more_plans_only_when_no_input_would_wait_for_it():
    assert pass_plans(False, 0.0) == PASS_PLANS
    assert pass_plans(False, INPUT_IDLE / 2) == PASS_PLANS  # a stream's batches keep coming
    assert pass_plans(True, 0.0) == PASS_PLANS_BEHIND  # catching up: its events waited in the broker already
    assert pass_plans(False, INPUT_IDLE) == PASS_PLANS_BEHIND  # the input stopped: nobody waits
    assert pass_plans(False, 0.0, 4) == 4 and pass_plans(True, 0.0, 4) == 4 * IDLE_STEP_FACTOR  # FRESHPLAN_BACKLOG_STEP
    assert PASS_PLANS_BEHIND > PASS_PLANS


@pytest.mark.timeout(10)
async def test_catching_up_follows_the_last_batch_and_the_input_fetched_and_waiting():
    progress = ApplyProgress()
    progress._unapplied, progress._applying, progress.batch_size = deque(), 0, 500
    assert not progress.catching_up()
    progress.last_batch_records = CATCH_UP_FACTOR * 500 + 1  # taken at once: more waited in the broker
    assert progress.catching_up()
    progress.last_batch_records = 150  # a stream's batch
    assert not progress.catching_up()
    progress._unapplied.append(asyncio.get_running_loop().time() - 1.0)  # fetched a second ago, still waiting
    assert progress.catching_up()


@pytest.mark.timeout(240)
async def test_an_idle_worker_recompiles_a_fan_out_in_bigger_jobs_through_the_broker(broker, tmp_path):
    async with launch(broker, tmp_path, FRESHPLAN_EAGER_RECOMPILE_LIMIT="0") as worker:
        loaded = await worker.load("atlas.jsonl")
        plans = {(await worker.select(dict(ATLAS_REQUEST, query=f"copy {i}"), loaded))["plan_id"]
                 for i in range(3 * PASS_PLANS_BEHIND)}
        before = (await worker.get("/healthz"))["counters"]
        bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
        await worker.publish_events(("policy-versions", dict(bundle, event_id="steps-v2", version=2)))

        async def drained() -> dict:
            health = await worker.get("/healthz")
            counters = health["counters"]
            done = counters.get("backlog_job_plans", 0) - before.get("backlog_job_plans", 0) >= len(plans)
            return counters if done and not health["recompile_queue"] else {}
        after = await eventually(drained, 120, "every announced plan recompiled")
        jobs = after["backlog_jobs"] - before.get("backlog_jobs", 0)
        compiled = after["backlog_job_plans"] - before.get("backlog_job_plans", 0)
        # Nothing else arrives: after the first INPUT_IDLE seconds every job may take PASS_PLANS_BEHIND plans.
        assert compiled == len(plans) and compiled / jobs > PASS_PLANS, (compiled, jobs)
