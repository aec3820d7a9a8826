"""The garbage collector's policy: freeze what startup built, and measure every collection's pause."""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

GENERATIONS = 3


class Collector:
    """Keeps full collections short, and counts how long each generation's collections held the interpreter.

    A collection holds the GIL until it is done, whichever thread triggered it, so a full one
    stops the event loop that answers selects. After start-up about a hundred thousand
    long-lived objects (modules, the Faust app, compiled schemas) sit in the oldest generation,
    and every full collection walked them again: 65-95 ms each, several a minute while events
    apply, which is most of the tail of cached selects. `freeze` moves them out of every scan
    (`gc.freeze`); objects made later are collected as before. Nearly all of what startup built
    lives as long as the process: the cost of freezing once is at most that a little of it, if
    it later becomes a reference cycle, is never reclaimed.
    """

    def __init__(self, enabled: bool = True, clock: Callable[[], float] = time.perf_counter) -> None:
        self.enabled = enabled  # freeze at `settle` (the setting GC_FREEZE); pauses are measured either way
        self.clock = clock
        self.frozen = 0  # objects frozen by `settle`
        self.collections = [0] * GENERATIONS  # collections seen, by generation
        self.pause_max = [0.0] * GENERATIONS  # longest pause seen, by generation, in seconds
        self.pause_total = 0.0  # seconds spent collecting since installed
        # The one full collection `settle` makes on purpose, before the ready line: apart, so that an alert on the
        # pauses above fires on what serving meets, not at every start (about 80 ms with the app loaded).
        self.settle_seconds = 0.0
        self._settling: int | None = None  # the thread making that collection, while it does
        self._started: float | None = None

    def install(self) -> "Collector":
        """Start measuring collections (the callback list is the interpreter's: `remove` on close)."""
        if self._observe not in gc.callbacks:
            gc.callbacks.append(self._observe)
        return self

    def remove(self) -> None:
        """Stop measuring."""
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)

    def settle(self) -> int:
        """Once the worker is ready: collect what startup left over, then freeze the survivors (if enabled)."""
        if not self.enabled:
            return 0
        started = self.clock()
        self._settling = threading.get_ident()  # only this thread's collections: another's may run meanwhile
        try:
            gc.collect()
            gc.freeze()
        finally:
            self._settling = None
        self.settle_seconds = self.clock() - started
        self.frozen = gc.get_freeze_count()
        log.info("froze %d objects built at start-up out of garbage collection (%.0f ms); full collections "
                 "now scan only what was made since", self.frozen, self.settle_seconds * 1000)
        return self.frozen

    def _observe(self, phase: str, info: dict) -> None:
        if self._settling == threading.get_ident():
            return
        if phase == "start":
            self._started = self.clock()
            return
        if self._started is None:
            return
        pause, self._started = self.clock() - self._started, None
        generation = min(int(info.get("generation", 0)), GENERATIONS - 1)
        self.collections[generation] += 1
        self.pause_total += pause
        self.pause_max[generation] = max(self.pause_max[generation], pause)

    def as_dict(self) -> dict:
        """Shape shown in /healthz."""
        return {"frozen": self.frozen, "settle_seconds": round(self.settle_seconds, 4),
                "collections": list(self.collections),
                "pause_max_seconds": [round(p, 4) for p in self.pause_max],
                "pause_total_seconds": round(self.pause_total, 3)}
