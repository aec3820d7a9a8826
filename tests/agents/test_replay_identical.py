"""Replay keeps a plan announced before its successor was compiled when that successor came out the same plan."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson
import pytest

import agents.cli.replay as replay_module
from agents.plans.backlog import recompile_queued
from agents.plans.plan_writer import PlanWriter
from agents.stream.event_apply import EventApplier, RawMessage
from agents.web.query import QueryService
from state.local_state import LocalState
from streams.settings import Settings
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from tests.events import resource

STAMP = 1_787_990_000.0  # 2026-08-29, the scenario's event time
ATLAS = [orjson.loads(line) for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("eager_limit", [0, 500], ids=["announced_first", "recompiled_first_control"])
def test_replay_restores_a_plan_whose_announced_successor_came_out_identical(tmp_path, monkeypatch, eager_limit):
    """An announcement now precedes every recompilation; when the successor comes out the same plan id, the
    backlog publishes that id again on `plans` as the current plan (subscribers cache it again). Replay drops
    every plan id ever named on `plan-invalidations` (`agents/cli/replay.py`, `gone`), so the replayed worker
    holds no head and no dependency edges for it: the next change to its inputs is never announced, and the
    subscribers keep serving the plan the backlog re-published."""
    # A left-out note's edit is compiled first when few: at 0 it is announced first, as any larger batch's.
    monkeypatch.setattr("agents.plans.announce_first.COMPILE_FIRST", 0)
    settings = Settings(state_dir=tmp_path / "replayed")
    topics: dict[str, list] = {}
    offsets: dict[tuple[str, int], int] = {}

    def message(topic: str, event: dict) -> RawMessage:
        offset = offsets[(topic, 0)] = offsets.get((topic, 0), -1) + 1
        m = RawMessage(topic, 0, offset, b"k", orjson.dumps(event), STAMP)
        topics.setdefault(settings.topic(topic), []).append(
            SimpleNamespace(partition=0, offset=offset, key=b"k", value=m.value, timestamp=int(STAMP * 1000)))
        return m

    state = LocalState.open(tmp_path / "live.duckdb")
    try:
        writer = PlanWriter(state, settings.topic, eager_limit=eager_limit)  # 0: the branch's default
        applier = EventApplier(state, writer)
        applier.apply([message(i["topic"], i["event"]) for i in ATLAS])
        plan = QueryService(state, writer).select(ATLAS_REQUEST)
        same = resource("rm-note-N7", version=2, cls="case_note", valid_to=None,
                        provenance_group="relationship-management",
                        content="The relationship manager says renewal was requested (typo fixed).")
        applier.apply([message(*same)])
        while recompile_queued(writer, 16):
            pass
        assert state.store.counters().get("announced_unchanged", 0) == (0 if eager_limit else 1)
        assert QueryService(state, writer).select(ATLAS_REQUEST)["plan_id"] == plan["plan_id"]  # current again
        for seq, topic, key, value in state.outbox.pending(100_000):  # what the worker published, in order
            box = topics.setdefault(topic, [])
            # Stamped as the broker would: each record later than the one published before it.
            box.append(SimpleNamespace(partition=0, offset=len(box), key=key, value=value,
                                       timestamp=int(STAMP * 1000) + seq))
    finally:
        state.close()
    republished = [orjson.loads(m.value)["plan_id"] for m in topics[settings.topic("plans")]]
    if not eager_limit:
        assert republished.count(plan["plan_id"]) == 2  # compiled by the select, then again by the backlog

    async def read_all(bootstrap, topic, on_batch, progress=None, kafka=None):
        records = topics.get(topic, [])
        if records:
            on_batch(records)
        return len(records)

    async def read_cluster_id(bootstrap, **kafka):
        return "cluster-1"

    monkeypatch.setattr(replay_module, "read_all", read_all)
    monkeypatch.setattr(replay_module, "read_cluster_id", read_cluster_id)
    summary = asyncio.run(replay_module.replay(settings, "127.0.0.1:1"))

    replayed = LocalState.open(settings.db_path)
    try:
        writer = PlanWriter(replayed, settings.topic)
        applier = EventApplier(replayed, writer)
        applier.apply([message(*resource("approved-waiver-W2"))])  # changes the plan's outcome
        announced = [orjson.loads(v)["plan_id"] for _, t, _, v in replayed.outbox.pending(100_000)
                     if t == settings.topic("plan-invalidations")]
        assert summary["plans_restored"] == 1 and plan["plan_id"] in announced, (summary, announced)
    finally:
        replayed.close()
