"""A loop-lag probe: how long the HTTP event loop was kept from running (applying and compiling must not)."""

from __future__ import annotations

import asyncio
from typing import Callable

INTERVAL_SECONDS = 0.01
STALL_BUDGET_SECONDS = 0.02
"""The longest the loop may be held (by applying, compiling, a collection, anything): longer stalls are counted."""


class LoopProbe:
    """Sleeps a short interval again and again; whatever the wake-up comes late by is a stall of the loop."""

    def __init__(self, interval: float = INTERVAL_SECONDS, budget: float = STALL_BUDGET_SECONDS,
                 on_sample: Callable[[float], object] | None = None) -> None:
        self.interval = interval
        self.budget = budget  # stalls longer than this are counted in `over_budget`
        self.max_stall = 0.0  # longest stall seen since start, in seconds
        self.last_stall = 0.0
        self.samples = 0
        self.over_budget = 0  # samples late by more than `budget` since start
        # Called with each sample's lateness in seconds (a histogram of them is the metric operators alert on).
        self.on_sample = on_sample

    async def run(self) -> None:
        """Measure until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(self.interval)
            self.observe(loop.time() - started - self.interval)

    def observe(self, stall: float) -> None:
        """Record one sample's lateness."""
        self.last_stall = max(0.0, stall)
        self.max_stall = max(self.max_stall, self.last_stall)
        self.samples += 1
        self.over_budget += self.last_stall > self.budget
        if self.on_sample is not None:
            self.on_sample(self.last_stall)

    def as_dict(self) -> dict:
        """Shape shown in /healthz."""
        return {"loop_stall_max_seconds": round(self.max_stall, 4), "loop_stall_samples": self.samples,
                "loop_stalls_over_budget": self.over_budget, "loop_stall_budget_seconds": self.budget}
