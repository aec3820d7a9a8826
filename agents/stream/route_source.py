"""The Faust agent that routes `source-changes` to the lanes: over the partitions the group assigns this worker."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from agents.stream.raw_message import RawMessage
from agents.stream.router import Router
from schemas.routed_batch import pack, split

log = logging.getLogger(__name__)

Send = Callable[[str, int, bytes], Awaitable[asyncio.Future]]
"""(logical topic, partition, value) -> a future acknowledged by the broker (the producer's `send`)."""


class SourceRouter:
    """Routes each batch Faust delivers, one span per source partition, and waits for every lane's acknowledgement.

    Faust never commits `source-changes` (its topic is cloned without acks): the duty commits it
    up to what this worker applied from the lanes, which only ever hold acknowledged batches. So
    a router killed between sends resumes, here or at its successor, at the group's offset, and
    the lanes' readers drop what comes twice.
    """

    def __init__(self, router: Router, send: Send) -> None:
        self.router = router
        self.send = send
        self.routed = 0  # source records routed (for /healthz)
        self.batches = 0  # routed batches sent

    async def route(self, messages: list[RawMessage]) -> None:
        """Route one delivery: every lane gets its batch of each source partition it holds records of."""
        spans: dict[int, list[RawMessage]] = {}
        for m in messages:
            spans.setdefault(m.partition, []).append(m)
        pending = []
        for partition, records in spans.items():
            records.sort(key=lambda m: m.offset)
            batches = self.router.route(partition, records, records[0].offset, records[-1].offset + 1)
            for lane, batch in batches.items():
                for part in split(batch, self.router.max_bytes):
                    pending.append(await self.send(lane.topic, lane.partition, pack(part)))
            self.routed += len(records)
            self.batches += len(batches)
        if pending:
            await asyncio.gather(*pending)


def register_router(app, topic, source: SourceRouter, batch_size: int, batch_window: float) -> None:
    """The agent on `source-changes` (a clone without acks): Faust assigns it the worker's duty partitions."""

    async def route_source_changes(stream) -> None:
        async for events in stream.take_events(batch_size, within=batch_window):
            messages = [RawMessage("source-changes", e.message.partition, e.message.offset, e.message.key,
                                   e.message.value, e.message.timestamp or None) for e in events]
            await source.route(messages)

    app.agent(topic, name="freshplan.agents.route_source_changes")(route_source_changes)
