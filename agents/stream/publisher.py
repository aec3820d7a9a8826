"""Publish the outbox: promote what owned partitions caused, send, await acknowledgements, forget what was sent."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from aiokafka.errors import MessageSizeTooLargeError, RecordTooLargeError
from aiokafka.partitioner import DefaultPartitioner

from schemas.outbound import shown_key
from state.local_state import LocalState
from agents.stream.outbox_prefetch import OutboxPrefetch
from streams.batches import Batch, partitions_of, plan_batches

log = logging.getLogger(__name__)

PERMANENT_SEND_ERRORS = (MessageSizeTooLargeError, RecordTooLargeError)
SENDS_PER_YIELD = 200  # records handed to the producer between turns of the event loop (a fan-out has many)
READ_ROWS = 50_000  # records read from the outbox per round: a 100,000-plan fan-out goes out in two
BATCH_FROM = 64  # from this many records a round is sent as pre-built batches, not record by record
PLAN_PER_YIELD = 5_000  # records framed into batches between turns of the event loop
# Acknowledged rows are deleted by the next apply batch's transaction, or by a flush from this many
# on (a fan-out), or by the idle timer (see `state.outbox.Acknowledged`).
FORGET_NOW = 2_000

Spans = dict[tuple[str, int], tuple[int, int]]  # (input topic, partition) -> (first, last) offset
_WARNED: set[str] = set()  # topics whose partition count was found short of a record's own partition
Record = tuple[str, bytes | None, bytes | None, int | None]  # (topic, key, value, its own partition or None)


class HeldBack(Exception):
    """Not sent: an earlier record of its key failed in the same round, and keys keep their order."""


def _sent_through(rows: list[tuple[int, str, bytes | None, bytes]], failed: set[int]) -> int | None:
    """The sequence number of a round's last row before the first that failed (None: the first failed)."""
    through = None
    for seq, *_ in rows:
        if seq in failed:
            break
        through = seq
    return through


def _within(topic: str, partition: int, partitions: int) -> bool:
    """Whether the topic has this partition; if not, the record goes where the producer's partitioner puts it.

    A record places itself on the partition its worker computes from `FRESHPLAN_PARTITIONS`; a topic
    created beforehand with fewer partitions would refuse it for ever, which loses more than a record
    on another partition (every worker's plan feed still reads every partition).
    """
    if 0 <= partition < partitions:
        return True
    if topic not in _WARNED:  # once: a fan-out would say it for every record
        _WARNED.add(topic)
        log.warning("%s has %d partitions, not the %d+ its records are placed by; check FRESHPLAN_PARTITIONS",
                    topic, partitions, partition + 1,
                    extra={"topic": topic, "error_class": "partition_count_mismatch"})
    return False


def _batching_producer(app):
    """The aiokafka producer under Faust's, if it takes pre-built batches (not a transactional one)."""
    producer = getattr(app.producer, "_producer", None)  # Faust keeps no public handle on it
    if producer is None or not hasattr(producer, "send_batch") or getattr(producer, "_txn_manager", None):
        return None
    return producer


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
                 duty: Callable[[], dict[str, list[int]] | dict[str, dict[int, int]]],
                 prefetching: bool = False) -> None:
        self.state = state  # the read-write state: touched only through `run`
        self.app = app
        self.run_writes = run
        # What the last apply job read of the outbox, for the next flush (None: flushes read it themselves)
        self.prefetched = OutboxPrefetch(state, READ_ROWS) if prefetching else None
        self._read_on = False  # the flush's last round was prefetched and more was queued after its read
        self.duty = duty  # input partitions this worker publishes for (see `publish_owned`)
        self.lock = asyncio.Lock()  # one flush at a time: records leave in outbox order
        self._again = False  # promoted records wait for a flush that has not read the outbox yet
        self._flushing: asyncio.Task | None = None
        # Every record due at or before this sequence number when a flush read it was acknowledged (or, refused
        # for good, replaced by its dead letter): a select waits for its own plan's records, not the whole outbox.
        self.acknowledged_through = -1
        self._waiting: list[tuple[int, asyncio.Future]] = []

    async def publish_owned(self, messages, held: bool = True) -> None:
        """Publish at once what the replica's batch caused on partitions this worker owns.

        `duty` gives the owned partitions by topic; where it maps each to an offset (`Duty.owned`:
        the group's committed offset when it was taken on), earlier events stay on standby, as
        their previous owner published what they caused. `held` False says the batch queued
        nothing on standby (plans' records never are, only dead letters): nothing to promote.
        """
        duty = self.duty()
        spans: Spans = {}
        for m in messages:
            owned = duty.get(m.topic, ())
            if m.partition in owned and (not isinstance(owned, dict) or m.offset >= owned[m.partition]):
                first, last = spans.get((m.topic, m.partition), (m.offset, m.offset))
                spans[(m.topic, m.partition)] = (min(first, m.offset), max(last, m.offset))
        if spans and held:
            await self.run_writes(self.promote, spans, drop_earlier=False)
        # Plans of owned partitions are announced due at once (not on standby): after a restart,
        # before the group has assigned this worker anything, they must not wait for the timer.
        due = self.prefetched.due() if self.prefetched is not None else None
        if spans or (due if due is not None else await self.run_writes(self.state.outbox.any_due)):
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

    async def published(self, seq: int, timeout: float) -> bool:
        """Whether the records queued up to sequence number `seq` were acknowledged within `timeout` seconds.

        A select that compiled waits here for its plan's records: under a stream, a flush of the whole
        outbox waited for every batch's records as well (1.7 s of a 2.4 s select at 1,000 events/s).
        """
        if seq <= self.acknowledged_through:
            return True
        done = asyncio.get_running_loop().create_future()
        self._waiting.append((seq, done))
        self.kick()
        try:
            await asyncio.wait_for(done, timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self._waiting = [(s, f) for s, f in self._waiting if f is not done]

    def _acknowledged(self, through: int | None) -> None:
        """Every record due at or before `through` when a flush read it was acknowledged: wake who waits on it."""
        if through is None or through <= self.acknowledged_through:
            return
        self.acknowledged_through = through
        for seq, done in self._waiting:
            if seq <= through and not done.done():
                done.set_result(None)

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
        sent, after, forgetting = 0, None, None
        async with self.lock:
            # Acknowledged by an earlier call (a retry's rounds pass over them): the reads below find every other
            # record due, so a call that sends them all has every record due up to here acknowledged.
            earlier = max(self.state.outbox.acked.current(), default=-1)
            try:
                while True:
                    # Past the rows still being forgotten: forgetting (its commit may checkpoint the
                    # file) runs on the writer thread while the next round is sent.
                    rows = await self._pending(after)
                    if not rows and forgetting is not None:  # it may queue dead letters: read once more
                        await forgetting
                        forgetting = None
                        continue
                    if not rows:
                        self._acknowledged(max(earlier, -1 if after is None else after))
                        return sent
                    results = await self._send([row[1:] for row in rows])
                    done, refused, failed = [], [], set()
                    for row, result in zip(rows, results, strict=True):
                        if not isinstance(result, BaseException):
                            done.append(row[0])
                        elif isinstance(result, PERMANENT_SEND_ERRORS) or _refused_at_send(result):
                            log.error("outbound %s record %s refused for good: %s", row[1], shown_key(row[2]),
                                      type(result).__name__,
                                      extra={"topic": row[1], "error_class": "record_too_large"})
                            refused.append(row)
                        else:
                            failed.add(row[0])
                    retry = len(failed)
                    if refused or len(done) + len(self.state.outbox.acked) >= FORGET_NOW:
                        # A fan-out's rows are forgotten as it goes, by number: reads that pass over a long
                        # list of acknowledged rows would cost tens of ms each (a round holds 50,000). The
                        # next read queues behind this job on the writer thread, so it never sees them; an
                        # apply job's read (`prefetched`) may run first, and passes over them as `leaving`.
                        if forgetting is not None:  # first: if it fails, these rows are never marked `leaving`
                            await forgetting
                        if self.prefetched is not None:
                            self.prefetched.leaving(done + [row[0] for row in refused])
                        forgetting = asyncio.ensure_future(self.run_writes(self._forget_sent, refused, done))
                    else:
                        self.state.outbox.acked.add(done)
                        if self.prefetched is not None:  # after: a read in between passes over `acked`
                            self.prefetched.gone(done)
                    sent, after = sent + len(done), rows[-1][0]
                    # Rounds of one call read on from the last: each read every record due up to its last row.
                    self._acknowledged(_sent_through(rows, failed))
                    if retry:
                        log.warning("%d records not acknowledged; they stay queued", retry)
                        return sent
                    if len(rows) < READ_ROWS and forgetting is None and not self._read_on:
                        # Everything due was read: a read more would find nothing (a writer job saved
                        # per batch). Records queued since come with a kick or a publish of their own.
                        self._acknowledged(max(earlier, after))
                        return sent
            finally:
                if forgetting is not None:
                    await forgetting

    async def _pending(self, after: int | None) -> list[tuple[int, str, bytes | None, bytes]]:
        """The next records due (past `after`), read on the writer in turn.

        Not on a cursor of its own: those reads waited on the writer's open transaction, and the
        hot plan's p50 went from 23 to 48 ms. Nor ahead of input batches (`Writer.run_first`):
        selects were answered sooner (p50 91-120 ms against 157-231 ms under 1,000 events/s), but
        the stream's own p99 at 5,000 events/s went from about 500 to 630 ms.
        """
        if after is None and self.prefetched is not None and (taken := self.prefetched.take()) is not None:
            rows, complete = taken
            self._read_on = not complete  # records queued since come after these: the flush reads on for them
            return rows
        self._read_on = False
        return await self.run_writes(self.state.outbox.due, READ_ROWS, after)

    async def _send(self, rows: list[Record]) -> list:
        """Send records; per record, its acknowledgement or the error that stopped it."""
        producer = _batching_producer(self.app)
        if producer is None or len(rows) < BATCH_FROM:
            return await self._send_each(rows)
        partition_of = await self._partitions(producer, rows)
        if partition_of is None:
            return await self._send_each(rows)
        plan, limit = None, self.app.conf.producer_max_request_size
        for start in range(0, len(rows), PLAN_PER_YIELD):
            if start:
                await asyncio.sleep(0)  # framing 50,000 records holds the loop for 0.1-0.2 s: let HTTP in
            end = start + PLAN_PER_YIELD
            plan = plan_batches([row[:3] for row in rows[start:end]], partition_of[start:end], limit, plan, start)
        results: list = [None] * len(rows)

        async def send_partition(batches: list[Batch]) -> None:
            # One partition's batches go in order, each once the last is acknowledged (aiokafka has
            # one in flight per partition anyway): a batch sent behind one the broker then refuses
            # would land ahead of that batch's records when they are sent again.
            failed = None
            for batch in batches:
                if failed is None:  # after a refusal the rest waits too: records keep their order
                    try:
                        ack = await producer.send_batch(batch.builder, batch.topic, partition=batch.partition)
                    except Exception as exc:  # noqa: BLE001 - not queued: these records stay for the next flush
                        failed = exc
                    else:
                        outcome = (await asyncio.gather(ack, return_exceptions=True))[0]
                        for i in batch.rows:
                            results[i] = outcome
                        if isinstance(outcome, BaseException):
                            failed = outcome
                        continue
                for i in batch.rows:
                    results[i] = failed

        await asyncio.gather(*(send_partition(b) for b in plan.batches.values()))
        # A batch refused for its size holds a record too large for the broker: find it record by record.
        single = set(plan.single)
        again = plan.single + [i for i, r in enumerate(results) if isinstance(r, PERMANENT_SEND_ERRORS)
                               and i not in single]
        if again:
            for i, result in zip(again, await self._send_each([rows[i] for i in again]), strict=True):
                results[i] = result
        return results

    async def _partitions(self, producer, rows: list[Record]) -> list[int] | None:
        """The partition each record goes to: its own, or the one the producer would pick; None unless the
        producer partitions as aiokafka's default."""
        if not isinstance(getattr(self.app.producer, "partitioner", None), DefaultPartitioner):
            return None
        out = [0] * len(rows)
        for topic in dict.fromkeys(row[0] for row in rows):
            # The lists in the order the producer makes them (`AIOKafkaProducer._partition`).
            partitions = list(await producer.partitions_for(topic))
            available = list(producer.client.cluster.available_partitions_for_topic(topic))
            where = [i for i, row in enumerate(rows) if row[0] == topic]
            picked = partitions_of([rows[i][1] for i in where], partitions, available)
            for i, partition in zip(where, picked, strict=True):
                own = rows[i][3] if len(rows[i]) > 3 else None
                out[i] = own if own is not None and _within(topic, own, len(partitions)) else partition
        return out

    async def _own_partition(self, topic: str, partition: int) -> int | None:
        """A record's own partition, or None (the producer's partitioner) when the topic has no such partition."""
        # The aiokafka producer under Faust's, transactional or not: a send to a partition the topic lacks fails
        # in a way no retry fixes, and would hold every later record of its key for ever.
        producer = getattr(self.app.producer, "_producer", None)
        if producer is None or not hasattr(producer, "partitions_for"):
            return partition  # a producer that places records itself (a test's double)
        return partition if _within(topic, partition, len(await producer.partitions_for(topic))) else None

    async def _send_each(self, rows: list[Record]) -> list:
        """Send records one by one through the app's producer (its partitioner and size checks).

        After a record fails for a reason that may pass, later records of its key wait for the
        next flush too: sent now, they would land ahead of it, and on a compacted topic the older
        record would then win.
        """
        results: list = []
        held: set[tuple[str, bytes | None]] = set()
        for i, (topic, key, value, *place) in enumerate(rows):
            if i and not i % SENDS_PER_YIELD:
                await asyncio.sleep(0)  # a send that need not wait never yields: let HTTP in
            if (topic, key) in held:
                results.append(HeldBack())
                continue
            try:
                partition = await self._own_partition(topic, place[0]) if place and place[0] is not None else None
                results.append(await self.app.producer.send(topic, key, value, partition=partition,
                                                            timestamp=None, headers=None))
            except Exception as exc:  # noqa: BLE001 - refused before it left: never retry it as it is
                results.append(exc)
                if not (isinstance(exc, PERMANENT_SEND_ERRORS) or _refused_at_send(exc)):
                    held.add((topic, key))
        pending = [r for r in results if not isinstance(r, BaseException)]
        acked = iter(await asyncio.gather(*pending, return_exceptions=True))
        return [r if isinstance(r, BaseException) else next(acked) for r in results]

    async def forget_acknowledged(self) -> None:
        """Delete the rows of acknowledged records that no apply batch has taken along yet (an idle timer's job)."""
        if len(self.state.outbox.acked):
            await self.run_writes(self._forget_sent, [])

    def _forget_sent(self, refused: list, done: list[int] = ()) -> None:
        """Delete acknowledged rows (`done`, and those waiting in `acked`) and dead-letter refused ones."""
        outbox = self.state.outbox
        committed = False
        try:
            with self.state.store.transaction():
                forgotten = outbox.forget_acked()
                outbox.remove(list(done))
                outbox.replace_with_dead_letters(refused, "refused by the producer or broker")
            committed = True
            outbox.acked.deleted(forgotten)
        finally:
            if self.prefetched is not None:
                self.prefetched.deleted(list(done) + [row[0] for row in refused], committed)
