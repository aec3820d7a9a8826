"""Publish the outbox: promote what owned partitions caused, send, await acknowledgements, forget what was sent."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from aiokafka.errors import MessageSizeTooLargeError, RecordTooLargeError

from state.local_state import LocalState

log = logging.getLogger(__name__)

PERMANENT_SEND_ERRORS = (MessageSizeTooLargeError, RecordTooLargeError)
SENDS_PER_YIELD = 200  # records handed to the producer between turns of the event loop (a fan-out has many)

Spans = dict[tuple[str, int], tuple[int, int]]  # (input topic, partition) -> (first, last) offset


def _refused_at_send(exc: BaseException) -> bool:
    """Whether a send failed for a reason no retry can fix (Faust wraps the producer's error)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, PERMANENT_SEND_ERRORS + (TypeError, ValueError)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class Publisher:
    """Sends the outbox through the app's producer; the outbox itself is read and written on the writer thread."""

    def __init__(self, state: LocalState, app, run: Callable[..., Awaitable[Any]],
                 duty: Callable[[], dict[str, list[int]]]) -> None:
        self.state = state  # the read-write state: touched only through `run`
        self.app = app
        self.run_writes = run
        self.duty = duty  # input partitions the consumer group gave this worker
        self.lock = asyncio.Lock()  # one flush at a time: records leave in outbox order
        self._again = False  # promoted records wait for a flush that has not read the outbox yet
        self._flushing: asyncio.Task | None = None

    async def publish_owned(self, messages) -> None:
        """Publish at once what the replica's batch caused on partitions this worker owns.

        Faust's group consumer long-polls for up to 1.5 s per fetch, so waiting for it to deliver
        the same events would add that much latency; it still promotes (and commits) later, which
        keeps a hand-over lossless. Duplicates after a hand-over carry the same cause.
        """
        duty = self.duty()
        spans: Spans = {}
        for m in messages:
            if m.partition in duty.get(m.topic, ()):
                first, last = spans.get((m.topic, m.partition), (m.offset, m.offset))
                spans[(m.topic, m.partition)] = (min(first, m.offset), max(last, m.offset))
        if not spans:
            return
        await self.run_writes(self.promote, spans, drop_earlier=False)
        self.kick()

    def kick(self) -> None:
        """Publish in the background: the replica applies its next batch while the broker acknowledges.

        One flush task at a time; a kick during a flush makes it read the outbox once more, so a
        record promoted after its last read is never left for the timer.
        """
        self._again = True
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self._flush_while_asked())

    async def _flush_while_asked(self) -> None:
        while self._again:
            self._again = False
            await self.publish()

    def promote(self, spans: Spans, drop_earlier: bool = True) -> None:
        """Release what events first..last of these input partitions caused (on the writer thread)."""
        with self.state.store.transaction():
            for (topic, partition), (first, last) in spans.items():
                self.state.outbox.promote(topic, partition, first, last, drop_earlier=drop_earlier)

    async def publish(self) -> int:
        """Publish the outbox; never raises (what failed stays queued and is retried by the timer)."""
        try:
            return await self._publish()
        except Exception:  # noqa: BLE001 - callers are the apply path, timers and routes: none may die of it
            log.exception("publishing the outbox failed; the records stay queued")
            return 0

    async def _publish(self) -> int:
        """Send queued records, wait for the broker's acknowledgements, then forget them.

        A record the broker can never accept (too large, refused at send or acknowledgement) is
        replaced by its dead letter so that it cannot block the queue or stop the worker; records
        that failed for a transient reason stay queued for the next flush.
        """
        sent = 0
        async with self.lock:
            while True:
                rows = await self.run_writes(self.state.outbox.pending, 20_000)
                if not rows:
                    return sent
                results: list = []
                for i, (_, topic, key, value) in enumerate(rows):
                    if i and not i % SENDS_PER_YIELD:
                        await asyncio.sleep(0)  # a send that need not wait never yields: let HTTP in
                    try:
                        results.append(await self.app.producer.send(topic, key, value, partition=None,
                                                                    timestamp=None, headers=None))
                    except Exception as exc:  # noqa: BLE001 - refused before it left: never retry it as it is
                        results.append(exc)
                pending = [r for r in results if not isinstance(r, BaseException)]
                acked = iter(await asyncio.gather(*pending, return_exceptions=True))
                results = [r if isinstance(r, BaseException) else next(acked) for r in results]
                done, refused, retry = [], [], 0
                for row, result in zip(rows, results, strict=True):
                    if not isinstance(result, BaseException):
                        done.append(row[0])
                    elif isinstance(result, PERMANENT_SEND_ERRORS) or _refused_at_send(result):
                        log.error("outbound %s record %r refused for good: %s", row[1], row[2],
                                  type(result).__name__, extra={"topic": row[1], "error_class": "record_too_large"})
                        refused.append(row)
                    else:
                        retry += 1
                await self.run_writes(self._forget_sent, done, refused)
                sent += len(done)
                if retry:
                    log.warning("%d records not acknowledged; they stay queued", retry)
                    return sent

    def _forget_sent(self, done: list[int], refused: list) -> None:
        with self.state.store.transaction():
            self.state.outbox.remove(done)
            self.state.outbox.replace_with_dead_letters(refused, "refused by the producer or broker")
