"""The bare Faust baselines join with the bench's session timeout: Apache Kafka refuses one under 6 s."""

from __future__ import annotations

import asyncio

import pytest

from bench.faust_ceiling import baseline_group
from bench.harness import run_ceiling
from streams.app import UnpausedTableManager


def test_a_baseline_joins_as_the_workers_it_is_compared_with_do():
    assert baseline_group(6.0) == {"broker_session_timeout": 6.0, "broker_heartbeat_interval": 0.75,
                                   "TableManager": UnpausedTableManager}
    assert baseline_group(4.0)["broker_heartbeat_interval"] == 0.5


@pytest.mark.timeout(30)
async def test_the_ceiling_is_started_with_the_bench_session_timeout(monkeypatch, tmp_path):
    started: list[tuple] = []

    async def spawn(*args, **kwargs):
        started.append(args)
        raise RuntimeError("not started here")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spawn)
    with pytest.raises(RuntimeError, match="not started here"):
        await run_ceiling("kafka:9092", ["t-source-changes"], 10, tmp_path, 6.0)
    [args] = started
    assert args[args.index("--session-timeout") + 1] == "6"
