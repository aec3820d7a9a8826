"""Background jobs' error policy: a failure is recorded and retried after a doubling backoff, never fatal."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from agents.ops.chores import Chores

ROOT = Path(__file__).resolve().parents[2]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_failing_timer_is_recorded_and_skipped_for_a_doubling_backoff():
    clock, runs = _Clock(), []
    chores = Chores(clock=clock, max_backoff=4.0)

    @chores.timer("retention")
    async def body() -> str:
        runs.append(clock.now)
        if len(runs) <= 3:
            raise OSError("disk full at /var/lib/freshplan/secret-name")
        return "done"

    assert await body() is None  # failed: 1 s backoff
    assert chores.failures["retention"] == 1 and chores.last_error == {"retention": "OSError"}
    assert chores.as_dict()["failing_now"] == ["retention"]
    clock.now += 0.5
    assert await body() is None and len(runs) == 1  # skipped within the backoff
    clock.now += 0.6
    assert await body() is None and len(runs) == 2  # failed again: 2 s
    clock.now += 1.9
    assert await body() is None and len(runs) == 2
    clock.now += 0.2
    assert await body() is None and len(runs) == 3  # third failure: 4 s, the cap
    clock.now += 4.1
    assert await body() == "done" and len(runs) == 4
    assert chores.failures["retention"] == 3 and chores.as_dict()["failing_now"] == []
    assert "secret-name" not in str(chores.as_dict())  # the type, never the message


async def test_the_backoff_is_capped_and_starts_again_after_a_success():
    clock = _Clock()
    chores = Chores(clock=clock, max_backoff=8.0)
    assert [chores.failed("j", ValueError()) for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    chores.succeeded("j")
    assert chores.failed("j", ValueError()) == 1.0


async def test_a_failing_loop_keeps_running_after_its_backoff():
    chores = Chores(max_backoff=0.01)
    steps = []
    done = asyncio.Event()

    async def step() -> float:
        steps.append(len(steps))
        if len(steps) in (2, 3):
            raise RuntimeError("broker unreachable")
        if len(steps) == 5:
            done.set()
        return 0

    task = asyncio.ensure_future(chores.loop("recompile_backlog", step)())
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert chores.failures["recompile_backlog"] == 2 and chores.as_dict()["failing_now"] == []


async def test_a_cancelled_job_is_not_a_failure():
    chores = Chores()

    async def step() -> float:
        await asyncio.Event().wait()
        return 0

    task = asyncio.ensure_future(chores.loop("follow_duty", step)())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not chores.failures


# Long-lived services with a policy of their own: the apply path and the plan feed (a failure there
# must stop the worker rather than serve from a replica that stopped applying), the revocation
# guard's thread, ownership (its own backoff and counter), the idle checkpoint (postpones itself),
# the metrics port and the shutdown hook.
OWN_POLICY = {"apply_replica", "adopt_plans", "watch_revocations", "follow_ownership", "checkpoint_when_idle",
              "close_on_stop", "metrics_port", "follower.run", "route_source_changes"}


def test_every_timer_and_task_a_worker_registers_goes_through_the_policy():
    unguarded = []
    for module in ("agents/worker/loops.py", "agents/web/routes.py"):
        tree = ast.parse((ROOT / module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.AsyncFunctionDef):
                decorators = [ast.unparse(d) for d in node.decorator_list]
                registered = any(d.startswith(("app.timer", "app.task")) for d in decorators)
                guarded = any(d.startswith("chores.timer") for d in decorators)
                if registered and not guarded and node.name not in OWN_POLICY:
                    unguarded.append(f"{module}:{node.name}")
            elif isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-2:] == ["app", "task"] and node.args:
                task = ast.unparse(node.args[0])
                if not task.startswith("chores.loop(") and task not in OWN_POLICY:
                    unguarded.append(f"{module}:{ast.unparse(node)}")
    assert unguarded == []
