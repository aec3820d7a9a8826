"""Finding 13: a worker stops cleanly and promptly, with its broker or without it."""

from __future__ import annotations

import asyncio
import time

import pytest

from streams.broker import EmbeddedBroker
from tests.conftest import ATLAS_REQUEST

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def broker():
    """A broker of this module's own (overrides the session's): one test stops it."""
    with EmbeddedBroker() as running:
        yield running


async def test_a_clean_stop_leaves_no_unclosed_client(worker):
    await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
    await asyncio.sleep(6)  # past the first standby pruning, which opens a group consumer
    worker.stop()
    log = worker.log_path.read_text()
    assert worker.proc.returncode == 0, log[-3000:]
    assert "Unclosed" not in log, [line for line in log.splitlines() if "Unclosed" in line]


async def test_sigterm_without_a_broker_exits_within_ten_seconds(worker, broker):
    await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
    broker.stop()
    for _ in range(100):
        if (await worker.get("/healthz"))["revocations"]["state"] == "unknown":
            break
        await asyncio.sleep(0.1)
    started = time.monotonic()
    worker.proc.terminate()
    try:
        worker.proc.wait(timeout=10)
    except Exception:  # noqa: BLE001 - report the log, then clean up
        worker.proc.kill()
        worker.proc.wait()
        raise AssertionError(f"no exit within 10 s of SIGTERM:\n{worker.log_path.read_text()[-3000:]}") from None
    assert time.monotonic() - started < 10
