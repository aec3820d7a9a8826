"""A loop-lag probe: how long the HTTP event loop was kept from running (applying and compiling must not)."""

from __future__ import annotations

import asyncio

INTERVAL_SECONDS = 0.01


class LoopProbe:
    """Sleeps a short interval again and again; whatever the wake-up comes late by is a stall of the loop."""

    def __init__(self, interval: float = INTERVAL_SECONDS) -> None:
        self.interval = interval
        self.max_stall = 0.0  # longest stall seen since start, in seconds
        self.last_stall = 0.0
        self.samples = 0

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

    def as_dict(self) -> dict:
        """Shape shown in /healthz."""
        return {"loop_stall_max_seconds": round(self.max_stall, 4), "loop_stall_samples": self.samples}
