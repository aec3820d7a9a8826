"""A cache following plans and plan-invalidations stays coherent, idempotent and restartable."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import orjson

from streams.plan_cache import PlanCache
from tests.conftest import ATLAS_REQUEST, ROOT
from tests.events import resource


async def follow(cache: PlanCache, until, timeout: float = 30.0) -> None:
    async def loop():
        while not until():
            await cache.poll(200)
    await asyncio.wait_for(loop(), timeout)


async def test_cache_follows_invalidations_and_survives_restart(worker, tmp_path):
    fresh = await worker.load("atlas.jsonl")
    old = await worker.select(ATLAS_REQUEST, fresh)
    path = tmp_path / "cache.sqlite"
    cache = PlanCache(worker.bootstrap, group_id="cache-test", path=path, topic_prefix=worker.settings.topic_prefix,
                      session_timeout=worker.settings.session_timeout)
    await cache.start()
    await follow(cache, lambda: cache.get(old["plan_id"]) is not None)
    await cache.stop()

    fresh = await worker.publish_events(resource("approved-waiver-W2"))
    new = await worker.select(ATLAS_REQUEST, fresh)
    cache = PlanCache(worker.bootstrap, group_id="cache-test", path=path, topic_prefix=worker.settings.topic_prefix,
                      session_timeout=worker.settings.session_timeout)
    await cache.start()  # resumes from committed offsets with its file
    await follow(cache, lambda: cache.get(new["plan_id"]) is not None and cache.is_invalidated(old["plan_id"]))
    assert cache.get(old["plan_id"]) is None and cache.successor(old["plan_id"]) == new["plan_id"]

    # A republished announcement (same cause) changes nothing.
    announcement = next(r for r in await worker.everything("plan-invalidations") if r["plan_id"] == old["plan_id"])
    announcement.pop("_key")
    await worker.publish([("plan-invalidations", old["plan_id"].encode(), orjson.dumps(announcement))])
    await follow(cache, lambda: cache.duplicates >= 1)
    assert cache.get(new["plan_id"])["plan_id"] == new["plan_id"]
    await cache.stop()

    example = subprocess.run([sys.executable, "examples/cache_subscriber.py", "--state-dir",
                              str(worker.settings.state_dir), "--cache-file", str(tmp_path / "example.sqlite"),
                              "--max-seconds", "8"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert example.returncode == 0, example.stderr[-2000:]
    last = orjson.loads(example.stdout.strip().splitlines()[-1])
    assert last["plans_known"] >= 2 and last["invalidated"] >= 1


def test_an_evicted_plan_is_forgotten_not_marked_invalid(tmp_path):
    cache = PlanCache("unused:9092", group_id="g", path=tmp_path / "c.sqlite")
    plan = {"plan_id": "plan-1", "plan_key": "pk-1"}
    cache._apply("plans", plan)
    assert cache.get("plan-1") == plan
    cache._apply("plan-invalidations", {"plan_id": "plan-1", "reason": "evicted", "successor_plan_id": None,
                                        "cause": {"event_id": "retention-x", "dependency_key": "retention:plan"}})
    assert cache.get("plan-1") is None and not cache.is_invalidated("plan-1")
    cache._apply("plans", plan)                     # compiled again after the eviction: served again
    assert cache.get("plan-1") == plan
    cache.db.close()


def test_a_plan_announced_first_learns_its_successor_from_plans_and_an_identical_one_is_valid_again(tmp_path):
    cache = PlanCache("unused:9092", group_id="g", path=tmp_path / "c.sqlite", topic_prefix="p-")

    def plan(plan_id: str, applied: int) -> dict:
        return {"plan_id": plan_id, "plan_key": "pk-1", "compiled_as_of": {"source-changes": {"0": applied}}}

    def announced(plan_id: str, offset: int) -> dict:
        return {"plan_id": plan_id, "plan_key": "pk-1", "reason": "source_changed", "successor_plan_id": None,
                "cause": {"topic": "p-source-changes", "partition": 0, "offset": offset, "event_id": f"e{offset}",
                          "dependency_key": "resource:r"}}

    cache._apply("plans", plan("plan-1", 5))
    cache._apply("plan-invalidations", announced("plan-1", 7))
    assert cache.is_invalidated("plan-1") and cache.successor("plan-1") is None
    cache._apply("plans", plan("plan-2", 8))  # compiled past the cause: the successor
    assert cache.successor("plan-1") == "plan-2" and cache.get("plan-1") is None and cache.get("plan-2")

    cache._apply("plans", plan("plan-3", 9))  # read before the announcement it succeeds
    cache._apply("plan-invalidations", announced("plan-2", 8))
    assert cache.successor("plan-2") == "plan-3"

    cache._apply("plan-invalidations", announced("plan-3", 9))
    cache._apply("plans", plan("plan-3", 9))  # the same plan, not yet past the cause: still invalid
    assert cache.get("plan-3") is None
    cache._apply("plans", plan("plan-3", 10))  # recompiled past it and identical: valid again
    assert cache.get("plan-3") is not None and not cache.is_invalidated("plan-3")


def test_a_cache_joins_with_the_session_timeout_it_is_given_and_heartbeats_an_eighth_of_it_apart(tmp_path):
    default = PlanCache("unused:9092", group_id="g", path=tmp_path / "a.sqlite")
    embedded = PlanCache("unused:9092", group_id="g", path=tmp_path / "b.sqlite", session_timeout=4.0)
    assert default._group_timing() == {}  # aiokafka's own (10 s): the embedded broker holds a join 5 s
    assert embedded._group_timing() == {"session_timeout_ms": 4000, "heartbeat_interval_ms": 500}
    default.db.close()
    embedded.db.close()
