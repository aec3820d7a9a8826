"""Successors wait for fetched input: the hold's bound, and the replica's signal through the broker."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest

from agents.cli.loader import publish, read_scenario
from agents.plans.plan_writer import PlanWriter
from agents.plans.successor_hold import SuccessorHold
from agents.stream.event_apply import EventApplier
from agents.stream.replica import Replica
from schemas.freshness import decode_token
from state.local_state import LocalState
from streams.settings import INPUT_TOPICS, Settings
from tests.catalog_double import SCENARIOS
from tests.conftest import token_key_file
from tests.events import resource

pytestmark = pytest.mark.timeout(60)


def record(rid: str) -> tuple[str, bytes, bytes]:
    topic, event = resource(rid)
    return topic, rid.encode(), orjson.dumps(event)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_input_waiting_never_holds():
    hold = SuccessorHold(lambda: False, at_most=0.1, clock=Clock())
    assert not hold.holding() and hold.as_dict() == {"holds": 0, "overdue": 0}


def test_a_hold_lasts_at_most_its_bound_then_the_job_the_loop_submits_runs_and_the_next_hold_starts():
    clock, waiting = Clock(), {"yes": True}
    hold = SuccessorHold(lambda: waiting["yes"], at_most=0.1, clock=clock)
    assert hold.holding()
    clock.now += 0.05
    assert hold.holding() and hold.holding(job=True)  # the same hold, on either side
    assert hold.left() == pytest.approx(0.05)
    clock.now += 0.06
    assert not hold.holding()  # overdue on the loop: it submits a job although input still waits
    assert not hold.holding(job=True)  # and the job runs: it starts no hold of its own
    assert hold.holding()  # the next job waits again, from now
    assert hold.as_dict() == {"holds": 2, "overdue": 1}


def test_a_hold_that_runs_out_in_the_job_lets_that_job_alone_run():
    clock = Clock()
    hold = SuccessorHold(lambda: True, at_most=0.1, clock=clock)
    assert hold.holding(job=True)
    clock.now += 0.2
    assert not hold.holding(job=True)
    assert hold.holding()  # nothing granted to the next one
    assert hold.as_dict() == {"holds": 2, "overdue": 1}


def test_input_applied_ends_the_hold():
    clock, waiting = Clock(), {"yes": True}
    hold = SuccessorHold(lambda: waiting["yes"], at_most=0.1, clock=clock)
    assert hold.holding()
    waiting["yes"] = False
    clock.now += 0.09
    assert not hold.holding()
    waiting["yes"] = True
    clock.now += 0.05
    assert hold.holding()  # a new hold: the earlier one's time does not count
    assert hold.as_dict() == {"holds": 2, "overdue": 0}


async def test_the_replica_says_input_waits_only_while_a_batch_beyond_the_one_applied_is_fetched(broker, tmp_path):
    settings = Settings(topic_prefix=f"hold{uuid.uuid4().hex[:8]}-", token_key_file=token_key_file())
    loaded = await publish(settings, broker.bootstrap_servers, read_scenario(SCENARIOS / "atlas.jsonl"))
    state = LocalState.open(tmp_path / "f.duckdb")
    applier = EventApplier(state, PlanWriter(state, settings.topic))
    gate: asyncio.Event | None = None
    entered = asyncio.Event()

    async def run(fn, *args):
        if gate is not None:
            entered.set()
            await gate.wait()  # the writer is busy with this batch
        return fn(*args)

    replica = Replica(applier, state.store, broker.bootstrap_servers,
                      {name: settings.topic(name) for name in INPUT_TOPICS}, batch_size=500, auto_rebase=True,
                      run=run)
    running = asyncio.ensure_future(replica.run())
    try:
        await replica.wait_covers(decode_token(loaded))
        assert not replica.input_waiting()  # everything fetched is applied
        gate = asyncio.Event()
        await publish(settings, broker.bootstrap_servers, [record("hold-1")])
        await asyncio.wait_for(entered.wait(), 10)
        assert not replica.input_waiting()  # only the batch the writer applies
        last = await publish(settings, broker.bootstrap_servers,
                             [record("hold-2")])
        for _ in range(500):  # fetched while the first one applies
            if replica.input_waiting():
                break
            await asyncio.sleep(0.01)
        assert replica.input_waiting()
        gate.set()
        await replica.wait_covers(decode_token(last))
        assert not replica.input_waiting()
    finally:
        if gate is not None:
            gate.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        state.close()
