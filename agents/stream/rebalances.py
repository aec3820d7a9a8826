"""Faust's rebalance signals as wake-ups: what follows the group's assignment acts on a signal, not a poll."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

log = logging.getLogger(__name__)

class Rebalances:
    """The assignment each `on_partitions_assigned` signal carries, and an event per follower to wake it.

    Faust's consumer sends `on_partitions_revoked` when a rebalance starts and
    `on_partitions_assigned` with the whole new assignment (the protocol is eager) before it
    resumes its streams. A follower waits on its event and reads `assigned`; a failed follow
    retries after its own backoff, so no signal is lost to an error.
    """

    def __init__(self, app: Any, topics: dict[str, str]) -> None:
        self.logical = {broker: name for name, broker in topics.items()}  # broker-side name -> logical name
        self.assignment: dict[str, frozenset[int]] | None = None
        """The latest assignment of the input topics (logical name -> partitions); None before the first."""
        self.revoking = False
        """Between a revocation and the next assignment: the group is moving partitions."""
        self.signals: Counter[str] = Counter()  # signals received, for /healthz
        self._wakers: list[asyncio.Event] = []
        app.on_partitions_revoked.connect(self._revoked)
        app.on_partitions_assigned.connect(self._assigned)

    def waker(self) -> asyncio.Event:
        """An event set at every signal, for one follower (already set: the first look needs no signal)."""
        event = asyncio.Event()
        event.set()
        self._wakers.append(event)
        return event

    def assigned(self, topic: str) -> frozenset[int] | None:
        """The partitions of a logical input topic the group gave this worker; None before any assignment
        and while a rebalance is under way."""
        if self.assignment is None or self.revoking:
            return None
        return self.assignment.get(topic, frozenset())

    def keys(self) -> set[tuple[str, int]] | None:
        """The assignment as (logical topic, partition) pairs; None as for `assigned`."""
        if self.assignment is None or self.revoking:
            return None
        return {(topic, p) for topic, parts in self.assignment.items() for p in parts}

    async def _revoked(self, sender: Any, revoked: Any = None, **kwargs: Any) -> None:
        self.signals["revoked"] += 1
        self.revoking = True
        log.info("the group is rebalancing: partitions revoked", extra={"reason": "partitions_revoked"})
        self._wake()

    async def _assigned(self, sender: Any, assigned: Any = None, **kwargs: Any) -> None:
        self.signals["assigned"] += 1
        out: dict[str, set[int]] = {}
        for tp in assigned or ():
            if tp.topic in self.logical:
                out.setdefault(self.logical[tp.topic], set()).add(tp.partition)
        self.assignment = {topic: frozenset(parts) for topic, parts in out.items()}
        self.revoking = False
        log.info("the group assigned %s", ", ".join(f"{t} {sorted(p)}" for t, p in sorted(self.assignment.items())),
                 extra={"reason": "partitions_assigned"})
        self._wake()

    def wake(self) -> None:
        """Wake every follower though no signal came (what they want changed: a peer seems dead)."""
        self._wake()

    def _wake(self) -> None:
        for event in self._wakers:
            event.set()


async def woken(event: asyncio.Event, timeout: float | None = None) -> bool:
    """Wait for a follower's event (at most `timeout` seconds) and clear it; whether it was set."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        return False
    event.clear()
    return True
