"""An entity lane owner's reports: how far its refusals were dead-lettered, so a successor's restore sends the rest."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from schemas.routed_batch import REPORT_HEADER, RoutedBatch, pack
from state.local_state import LocalState
from state.shard_state import ShardState

log = logging.getLogger(__name__)

REPORT_EVERY = 1.0  # seconds between reports: a successor may dead-letter about this much of a dead owner's again

SendReport = Callable[[int, bytes, list[tuple[str, bytes]]], Awaitable[asyncio.Future]]
"""(entity lane, value, headers) -> a future acknowledged by the broker."""


class LaneReports:
    """Appends a report to each entity lane this worker owns: per source partition, the offset below which it
    applied the lane and had every dead letter that caused acknowledged (up to its oldest letter still due).

    The owner of a lane alone dead-letters its refusals. A worker that gains the lane restores
    its history, and dead-letters the refusals no report covers (`Shards.restore`): the old
    owner may have died before applying them, or before its letters left its outbox. So a
    refusal is dead-lettered at least once, twice at worst for what the last second held. A
    report is an empty routed batch marked with a header: to any reader it is a harmless mark.
    """

    def __init__(self, shards: ShardState, state: LocalState, run: Callable[..., Awaitable[Any]],
                 send: SendReport, letters_topic: str) -> None:
        self.shards = shards
        self.state = state
        self.letters_topic = letters_topic  # broker-side `dead-letters`
        self.run_writes = run  # reads on the writer, between batches: positions and outbox agree
        self.send = send
        self.sent: dict[tuple[int, int], int] = {}  # (entity lane, source partition) -> last offset reported
        self.reports = 0  # reports acknowledged (for /healthz)

    async def report(self) -> int:
        """Report what moved since the last report on every owned lane, each source partition up to its oldest
        dead letter not acknowledged yet; how many reports were sent."""
        positions, owned, kept = await self.run_writes(self._look)
        self.sent = {k: v for k, v in self.sent.items() if k[0] in owned}  # a lane gained again starts over
        pending = []
        for q in sorted(owned):
            for p, upto in sorted(positions.items()):
                upto = min(upto, kept.get((q, p), upto))
                if upto > self.sent.get((q, p), 0):
                    value = pack(RoutedBatch(p, upto, upto, ()))
                    pending.append(((q, p), upto, await self.send(q, value, [(REPORT_HEADER, b"1")])))
        for key, upto, ack in pending:
            await ack
            self.sent[key] = upto
        self.reports += len(pending)
        return len(pending)

    def figures(self) -> dict:
        """Reports sent, and how far each owned lane is reported per source partition (for /healthz)."""
        reported: dict[str, dict[str, int]] = {}
        for (q, p), upto in sorted(self.sent.items()):
            reported.setdefault(str(q), {})[str(p)] = upto
        return {"sent": self.reports, "reported": reported}

    def _look(self) -> tuple[dict[int, int], frozenset[int], dict[tuple[int, int], int]]:
        """Per source partition, how far every refusal applied was dead-lettered and acknowledged; the lanes
        owned (read together on the writer: a lane caught up since has letters still due); and per lane and
        source partition the oldest letter kept for a lane's owner, not sent (a restarted worker takes its
        copies for owned until its first move)."""
        applied = self.state.store.next_offsets().get("source-changes", {})
        due = self.state.outbox.oldest_due(self.letters_topic, "source-changes")
        owned = frozenset(q for q in self.shards.held if self.shards.owns_lane(q))
        return {p: min(n, due.get(p, n)) for p, n in applied.items()}, owned, self.state.outbox.oldest_kept()
