"""The Faust app's wiring: what it changes of Faust's defaults, and why."""

from __future__ import annotations

import pytest

from streams.app import UnpausedTableManager, create_app
from streams.settings import Settings


@pytest.mark.timeout(30)
async def test_the_app_subscribes_at_start_without_faust_s_one_second_table_pause(tmp_path):
    app = create_app(Settings.from_env({"FRESHPLAN_STATE_DIR": str(tmp_path)}), "127.0.0.1:9")
    manager = app.tables
    assert isinstance(manager, UnpausedTableManager) and len(manager) == 0  # no tables to wait for
    done: list[str] = []

    async def paused(seconds: float) -> None:
        raise AssertionError(f"the table manager paused {seconds} s before subscribing")

    async def subscribe() -> None:
        done.append("subscribed")

    async def recover() -> None:
        done.append("recovery started")

    manager.sleep = paused
    manager._update_channels = subscribe
    manager.recovery.start = recover
    await manager.on_start()
    assert done == ["subscribed", "recovery started"]
