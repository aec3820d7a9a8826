"""An event applier over a real DuckDB file loaded with the Atlas scenario, fed raw messages (no broker).

Its `setup` fixture reaches every test through tests/conftest.py."""

from __future__ import annotations

import itertools

import orjson
import pytest

from agents.plans.backlog import recompile_queued
from agents.plans.plan_writer import PlanWriter
from agents.stream.event_apply import EventApplier, RawMessage
from agents.web.query import QueryService
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS

_offsets = itertools.count()


def raw(topic: str, event: dict | bytes, partition: int = 0, offset: int | None = None) -> RawMessage:
    value = event if isinstance(event, bytes) else orjson.dumps(event)
    return RawMessage(topic, partition, next(_offsets) if offset is None else offset, b"k", value)


def settle(inv) -> None:
    """Compile every queued successor, as the worker's backlog loop does after each batch."""
    while recompile_queued(inv.plans, 16):
        pass


@pytest.fixture
def setup(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    inv = EventApplier(state, PlanWriter(state, lambda name: f"x-{name}"))
    inv.apply([raw(item["topic"], item["event"]) for item in
               map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines())])
    yield state, inv, QueryService(state, inv.plans)
    state.close()


def outbox(state: LocalState, topic: str) -> list[dict]:
    return [orjson.loads(v) for _, t, _, v in state.outbox.pending() if t == f"x-{topic}"]
