"""A hostile review of the writer's queues (agents/stream/writer.py `Writer._next`): selects that must compile
go ahead of input batches, bounded both ways.

The first test failed on 0bf77f7, whose rule ran every select job queued before a batch ahead of it, however many
(the replica submits its next batch only once the last returned, so every job queued meanwhile is older).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from agents.stream.writer import FIRST_IN_A_ROW, Writer
from tests.agents.test_writer import _blocked

@pytest.mark.timeout(30)
async def test_select_jobs_queued_before_a_batch_hold_it_for_at_most_first_in_a_row():
    """`FIRST_IN_A_ROW` bounds the select jobs run in a row while an input batch waits, those queued before it
    included: every select job queued while the previous batch ran is older than the next one."""
    writer = Writer(later_waits_at_most=60)  # defaults: FIRST_IN_A_ROW=4, FIRST_AHEAD_AT_MOST=0.1
    running, release = await _blocked(writer.run)  # the previous input batch
    try:
        seen: list[str] = []
        firsts = [asyncio.ensure_future(writer.run_first(lambda i=i: (time.sleep(0.02), seen.append(f"select-{i}"))))
                  for i in range(12)]  # 12 selects' jobs, as 12 gatherings of 32 would be
        await asyncio.sleep(0.01)
        batch = asyncio.ensure_future(writer.run(lambda: seen.append("batch")))
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(running, batch, *firsts)
        ahead = [s for s in seen[:seen.index("batch")] if s.startswith("select-")]
        assert len(ahead) <= FIRST_IN_A_ROW, f"{len(ahead)} select jobs ran before the input batch: {seen}"
    finally:
        release.set()
        writer.close()


@pytest.mark.timeout(30)
async def test_a_select_is_not_starved_by_a_stream_of_input_batches():
    """Held: a `run_first` job waits for the running job and at most the batches queued before it (oldest first)."""
    writer = Writer(later_waits_at_most=60, first_ahead_at_most=0.01)
    stop = asyncio.Event()

    async def replica() -> None:
        while not stop.is_set():
            await writer.run(time.sleep, 0.02)

    try:
        feeding = [asyncio.ensure_future(replica()) for _ in range(3)]  # always a batch queued
        await asyncio.sleep(0.1)
        waits = []
        for _ in range(10):
            queued = time.monotonic()
            await writer.run_first(lambda: None)
            waits.append(time.monotonic() - queued)
        stop.set()
        await asyncio.gather(*feeding)
        assert max(waits) < 2.0, waits  # bounded, not timed: starved, it would never return
    finally:
        stop.set()
        writer.close()


@pytest.mark.timeout(30)
async def test_later_work_still_runs_under_selects_and_batches():
    """Held: `run_later` runs once it waited `later_waits_at_most`, whatever the other two queues hold."""
    writer = Writer(later_waits_at_most=0.2)
    stop = asyncio.Event()

    async def keep(submit) -> None:
        while not stop.is_set():
            await submit(time.sleep, 0.01)

    try:
        feeding = [asyncio.ensure_future(keep(writer.run)) for _ in range(2)] + \
                  [asyncio.ensure_future(keep(writer.run_first)) for _ in range(2)]
        await asyncio.sleep(0.05)
        queued = time.monotonic()
        await writer.run_later(lambda: None)
        waited = time.monotonic() - queued
        stop.set()
        await asyncio.gather(*feeding)
        assert waited < 3.0, waited  # bounded, not timed
    finally:
        stop.set()
        writer.close()
