"""Apply the input topics (`source-changes` through its lanes) to local state, batch after batch, on the writer."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import NoOffsetForPartitionError, OffsetOutOfRangeError

from agents.stream.apply_progress import ApplyProgress
from agents.stream.batch_fetcher import TOP_UP, BatchFetcher
from agents.stream.fast_path import FastPath
from agents.stream.lane_reader import LANES, Fetched, FetchQueue, LaneReader
from agents.stream.incarnation import verify
from agents.stream.writer import inline
from agents.stream.event_apply import EventApplier
from agents.stream.raw_message import RawMessage
from state.store import Store
from streams.admin import stop_within
from streams.incarnation import read_cluster_id
from streams.partitions import discover

log = logging.getLogger(__name__)

# Behind (a fetch came back full), a batch takes up to this many times the batch size: a plan
# touched by several events of one batch is recompiled once, and a batch's fixed statements are
# shared by more events (events/s per CPU second 2x at 4x, measured on the bench workload).
CATCH_UP_BATCHES = 4
QUEUED_BATCHES = 8  # fetched batches waiting for the writer before fetching pauses (of up to the batch size each)


class Replica(ApplyProgress):
    """Reads the input partitions (no consumer group) and applies them on standby.

    `source-changes` is read through its lanes (`shared-changes`, and the `entity-changes` lanes
    of the shards held), merged back into source order (see `LaneReader`); the other inputs are
    read whole. Selects can then be answered by any worker from its own state. What an event
    causes is held on standby in the outbox until the worker the consumer group gave the event's
    partition promotes it (`wait_applied` lets that duty path wait for this replica to reach it).
    """

    def __init__(self, applier: EventApplier, store: Store, bootstrap_servers: str, topics: dict[str, str],
                 batch_size: int = 500, batch_window: float = 0.05, fetch_bytes: int = 2_000_000,
                 after_apply: Callable[..., Awaitable[object]] | None = None,
                 auto_rebase: bool = False, kafka: dict | None = None,
                 run: Callable[..., Awaitable[Any]] = inline, catch_up_batches: int = CATCH_UP_BATCHES,
                 top_up: float = TOP_UP, on_batch: Callable[[float | None, float], object] | None = None,
                 early: FastPath | None = None, partitions: int = 1,
                 held_lanes: Callable[[], frozenset[int]] = frozenset,
                 lanes_applied: Callable[[Fetched], object] | None = None,
                 after_commit: Callable[[], object] | None = None) -> None:
        self.applier = applier
        self.store = store  # for reads beside the writer (its own cursor in a worker)
        self.run_writes = run  # runs a state write on the writer thread
        self.bootstrap_servers = bootstrap_servers
        self.topics = topics  # logical name -> broker-side name
        self.batch_size = batch_size
        self.catch_up_size = batch_size * max(1, catch_up_batches)  # records per batch while behind
        self.batch_window = batch_window
        self.top_up = top_up  # seconds to wait for what arrived while a prefetched batch sat in the buffer
        self.fetch_bytes = fetch_bytes
        self.after_apply = after_apply
        self.after_commit = after_commit  # run last in each apply job, on the writer thread (`OutboxPrefetch.read`)
        self.positions: dict[str, dict[int, int]] = store.next_offsets()
        self._progress = asyncio.Condition()
        self._consumer: AIOKafkaConsumer | None = None
        self.paused: set[str] = set()
        self.auto_rebase = auto_rebase  # embedded broker or `run --rebase`: re-read reset topics from their start
        self.blocked: dict[str, str] = {}  # reset input topics not applied until an operator rebases
        self.cluster_id: str | None = None
        self.ready = asyncio.Event()  # set once offsets are known to belong to the broker's topics
        self.kafka = kafka or {}  # KafkaSecurity.client_kwargs()
        self.batches = BatchFetcher(batch_size, self.catch_up_size, batch_window, top_up)
        self.applied_at = 0.0  # loop time of the last batch applied (idle checkpoints wait for a quiet second)
        # Called with (seconds the oldest event waited for its batch, seconds the batch took) after each batch.
        self.on_batch = on_batch
        self._hook_failed = False
        # Announces from memory what a fetched batch makes stale, before the batch waits for the writer.
        self.early = early
        self._early_failed = False
        self._unapplied: deque[float] = deque()  # loop time each fetched batch not yet applied was fetched at
        self._applying = 0  # of those, the batches in the apply job the writer runs or has just finished
        # Routed `source-changes` (when the topics hold the lanes), and what to do on the writer with a batch's
        # gained and caught-up lanes.
        self.lanes = LaneReader(partitions, held_lanes)
        self.lanes_applied = lanes_applied
        self._assigning = asyncio.Lock()
        self._fetched: FetchQueue | None = None  # merge steps waiting for the writer, while running
        self._queueing = asyncio.Lock()  # taken from a merge step until it is queued
        self._read_to: dict[TopicPartition, int] = {}  # next offset to read per assigned partition (None: its start)

    def pause(self, topic: str) -> list[int]:
        """Stop applying one input topic (operators; the revocation guard keeps watching its end)."""
        self.paused.add(topic)
        return self._set_paused(topic, True)

    def resume(self, topic: str) -> list[int]:
        """Apply a paused topic again."""
        self.paused.discard(topic)
        return self._set_paused(topic, False)

    def _set_paused(self, topic: str, paused: bool) -> list[int]:
        if self._consumer is None:
            return []
        names = {self.topics[t] for t in (LANES if topic == "source-changes" and self.routed else (topic,))
                 if t in self.topics}
        tps = [tp for tp in self._consumer.assignment() if tp.topic in names]
        if paused:
            self._consumer.pause(*tps)
        else:
            self._consumer.resume(*tps)
        return sorted(tp.partition for tp in tps)

    @property
    def routed(self) -> bool:
        """Whether `source-changes` is read through its lanes (a worker's), not directly."""
        return "shared-changes" in self.topics

    def _readable(self, tps: list[TopicPartition], logical: dict[str, str]) -> list[TopicPartition]:
        """What to read of the discovered partitions: routed, the lanes held, never `source-changes` itself."""
        if not self.routed:
            return tps
        lanes = self.lanes.reading()
        return [tp for tp in tps if logical[tp.topic] != "source-changes" and
                (logical[tp.topic] != "entity-changes" or tp.partition in lanes)]

    async def gain_lanes(self, lanes: frozenset[int]) -> None:
        """Read these entity lanes from their start: their history restores the shard, then they join the merge.

        Nothing changes when the read cannot start (its first offsets unknown): the caller tries again.
        """
        if self._consumer is None:
            raise RuntimeError("the replica is not reading yet")
        topic = self.topics["entity-changes"]
        async with self._assigning:
            for q in lanes:
                self._read_to.pop(TopicPartition(topic, q), None)
            await self._assign_now(self._wanted(extra=lanes))
            self.lanes.gain(lanes)

    async def lose_lanes(self, lanes: frozenset[int]) -> None:
        """Stop reading these entity lanes."""
        self.lanes.lose(lanes)
        await self._reassign()

    def reading_lanes(self) -> frozenset[int]:
        """The entity lanes read now (held, or catching up)."""
        return self.lanes.reading()

    async def _reassign(self) -> None:
        """Read the lanes the merge holds; every other partition goes on from where it was."""
        async with self._assigning:  # one change at a time: each sets every position after its `assign`
            await self._assign_now()

    def _wanted(self, extra: frozenset[int] = frozenset()) -> list[TopicPartition]:
        """The partitions to read: the assigned ones of every unblocked topic, and the lanes read (with `extra`)."""
        logical = {v: k for k, v in self.topics.items()}
        lane_topic = self.topics.get("entity-changes")
        tps = [tp for tp in self._consumer.assignment()
               if tp.topic != lane_topic and logical[tp.topic] not in self.blocked]
        if lane_topic is not None and "entity-changes" not in self.blocked:
            tps += [TopicPartition(lane_topic, q) for q in sorted(self.lanes.reading() | extra)]
        return tps

    async def _assign_now(self, tps: list[TopicPartition] | None = None) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        tps = self._wanted() if tps is None else tps
        # aiokafka forgets every position on `assign`: each is set again, from what was read so far, with no
        # await between (the fetch loop would meet a partition without a position and take it for a reset).
        starts = [tp for tp in tps if self._read_to.get(tp) is None]
        firsts = await consumer.beginning_offsets(starts) if starts else {}
        consumer.assign(tps)
        for tp in tps:
            nxt = self._read_to.get(tp)
            consumer.seek(tp, firsts[tp] if nxt is None else nxt)
            self._read_to[tp] = firsts[tp] if nxt is None else nxt

    async def run(self) -> None:
        """Consume and apply until cancelled."""
        consumer = self._new_consumer()
        await consumer.start()
        self._consumer = consumer
        logical = {v: k for k, v in self.topics.items()}
        try:
            tps = await discover(consumer, self.topics.values())
            consumer.assign(tps)
            await self._verify_incarnation(consumer)
            tps = [tp for tp in tps if logical[tp.topic] not in self.blocked]
            # A fresh consumer: the probe's out-of-range errors must not surface in the first fetch.
            await consumer.stop()
            consumer = self._consumer = self._new_consumer()
            await consumer.start()
            if self.routed:
                self.lanes.start(self.store.next_offsets(), self.store.next_offsets(lanes=True))
            tps = self._readable(tps, logical)
            if not tps:
                await asyncio.Event().wait()  # every input was reset: apply nothing until restarted
            async with self._assigning:
                for tp in tps:
                    nxt = {**self.positions, **self.store.next_offsets(lanes=True)}.get(logical[tp.topic], {}).get(
                        tp.partition)
                    if nxt is not None:
                        self._read_to[tp] = nxt
                await self._assign_now(tps)
            self.ready.set()
            for topic in self.paused:
                self._set_paused(topic, True)
            log.info("replica applying %d input partitions", len(tps))
            # Fetching goes on while the writer applies: what a batch announces early must not wait
            # for the batch before it (the writer takes everything fetched meanwhile as one batch).
            fetched = FetchQueue(QUEUED_BATCHES, self.batch_size)
            self._fetched = fetched
            fetching = asyncio.ensure_future(self._fetch_loop(consumer, fetched, logical))
            try:
                while True:
                    batch, taken = await self._next(fetched, fetching)
                    messages = batch.messages
                    if self.early is not None:
                        await self.early.settle()  # what the broker acknowledged is not queued again
                    started, begun = time.time(), time.perf_counter()
                    self._applying = taken
                    try:
                        self.positions = await self.run_writes(self._apply, batch)
                    finally:
                        self._applying = 0
                    self.applied_at = asyncio.get_running_loop().time()
                    self.last_batch_records = len(batch)
                    for _ in range(taken):
                        self._unapplied.popleft()
                    if self.early is not None:
                        self.early.forget_applied()
                    if self.on_batch is not None and messages:  # not a batch of lane positions only
                        self._observe(messages, started, time.perf_counter() - begun)
                    async with self._progress:
                        self._progress.notify_all()
                    self.lanes.applied(batch)
                    if self.after_apply:
                        # A writer job fewer per batch when nothing waits on standby to be promoted.
                        await self.after_apply(messages, held=self.applier.held_on_standby)
            finally:
                self._fetched = None
                fetching.cancel()
                await asyncio.gather(fetching, return_exceptions=True)
        finally:
            self._consumer = None
            await stop_within(consumer)

    async def _fetch_loop(self, consumer: AIOKafkaConsumer, queue: FetchQueue,
                          logical: dict[str, str]) -> None:
        """Fetch batches, announce what each makes stale at once, and queue them for the writer."""
        while True:
            try:
                batch = await self.batches.fetch(consumer)
            except (OffsetOutOfRangeError, NoOffsetForPartitionError) as exc:
                # The broker lost offsets this worker applied: stop reading those topics (the
                # guard refuses selects with input_reset) rather than skip to the log start.
                arg = exc.args[0] if exc.args else None
                lost = list(arg) if isinstance(arg, dict) else [arg] if isinstance(arg, TopicPartition) else []
                topics = {logical[tp.topic] for tp in lost} or set(self.topics)
                self._block({t: "position_out_of_range" for t in topics})
                await self._reassign()
                continue
            for tp, records in batch.items():
                if records:
                    self._read_to[tp] = records[-1].offset + 1
            read_at = self.lanes.epoch  # a lane gained while this batch waits must not get the old read's records
            async with self._queueing:
                await self._queue(queue, self.lanes.fetched(batch, logical, read_at))

    async def sent(self, batches: list) -> None:
        """Merge routed batches this worker's router just had acknowledged without reading them back (the lane
        hop saved); left to the lanes' reader while it is queueing a batch (the writer is behind anyway)."""
        queue = self._fetched
        if (queue is None or not self.routed or self._queueing.locked()
                or queue.waits(sum(len(b[3].frames) for b in batches))):
            return  # never hold the router up: what it sent comes back through the lanes anyway
        async with self._queueing:  # a merge step and its place in the queue go together: source order holds
            fetched = self.lanes.sent(batches)
            if fetched is not None:
                await self._queue(queue, fetched, wait=False)

    async def _queue(self, queue: FetchQueue, fetched: Fetched, wait: bool = True) -> None:
        """Announce what a merge step makes stale at once, and queue it for the writer (see `FetchQueue`)."""
        if not (fetched.messages or fetched.history or fetched.caught_up or fetched.gained or fetched.reports
                or self.lanes.advanced(fetched)):
            return  # lane records that released nothing: their positions go with the next batch
        if self.early is not None:
            try:
                self.early.announce(fetched.messages)
            except Exception:  # noqa: BLE001 - the writer announces the same plans: only later
                if not self._early_failed:
                    log.exception("announcing a fetched batch early failed; the writer announces it (logged once)")
                self._early_failed = True
        if await queue.put_joined(fetched, wait):
            self._unapplied.append(asyncio.get_running_loop().time())  # a joined batch is as old as the one it joined

    async def _next(self, fetched: FetchQueue, fetching: asyncio.Future) -> tuple[Fetched, int]:
        """The next batch to apply: everything fetched meanwhile, up to the catch-up size, and how many fetched
        batches it holds; a fetch error is raised."""
        if fetched.empty():
            getting = asyncio.ensure_future(fetched.get())
            try:
                await asyncio.wait({getting, fetching}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getting.done():
                    getting.cancel()
            if not getting.done() or getting.cancelled():
                fetching.result()  # the fetch loop ended: raise what ended it
                raise RuntimeError("the replica's fetch loop ended")
            batch = getting.result()
        else:
            batch = fetched.get_nowait()
        taken = 1
        while not fetched.empty() and len(batch.messages) < self.catch_up_size:
            batch = batch.join(fetched.get_nowait())
            taken += 1
        return batch, taken

    def _observe(self, messages: list[RawMessage], started: float, took: float) -> None:
        """Report a batch's timings to `on_batch`; a failing hook is logged once and never stops applying."""
        stamps = [m.timestamp for m in messages if m.timestamp]
        try:
            self.on_batch(max(0.0, started - min(stamps)) if stamps else None, took)
        except Exception:  # noqa: BLE001 - metrics are a by-product: the batch is committed either way
            if not self._hook_failed:
                log.exception("reporting a batch's timings failed; applying goes on (logged once)")
            self._hook_failed = True

    def _apply(self, batch: Fetched) -> dict[str, dict[int, int]]:
        """Apply a batch on standby (on the writer thread); the offsets applied once it committed.

        Gained lanes are cleaned and their history restored first, each in a transaction of its
        own: a crash between leaves them not held, and a restart reads them from their start again.
        """
        if self.lanes_applied is not None and (batch.gained or batch.history):
            self.lanes_applied(batch, before=True)
        self.applier.apply(batch.messages, standby=True, positions=batch.positions)
        try:  # after the records: a report covers what was applied below it
            if batch.reports:
                with self.applier.state.store.transaction():
                    self.applier.state.outbox.reported(batch.reports)
        except Exception:  # noqa: BLE001 - the batch is committed; an unpruned kept letter is only sent twice
            log.exception("dropping lane letters covered by reports failed; a later report drops them")
        if self.lanes_applied is not None and batch.caught_up:
            self.lanes_applied(batch, before=False)
        if self.after_commit is not None:
            self.after_commit()
        return self.applier.state.store.next_offsets()

    def _new_consumer(self) -> AIOKafkaConsumer:
        # No reset policy: a position the broker lost is an error to report, never a silent skip.
        return AIOKafkaConsumer(bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False,
                                auto_offset_reset="none", max_partition_fetch_bytes=self.fetch_bytes,
                                fetch_max_wait_ms=int(self.batch_window * 1000), **self.kafka)

    async def _verify_incarnation(self, consumer: AIOKafkaConsumer) -> None:
        """Compare the recorded offsets with the broker's topics; rebase or block what was reset."""
        self.cluster_id = await read_cluster_id(self.bootstrap_servers, **self.kafka)
        blocked = await verify(consumer, self.store, self.applier.state.store, self.topics, self.cluster_id,
                               self.auto_rebase, self.run_writes)
        if blocked:
            self._block(blocked)
        self.positions = self.store.next_offsets()

    def _block(self, resets: dict[str, str]) -> None:
        self.blocked.update(resets)
        log.error("input topics were reset (%s): their recorded offsets belong to another broker or topic "
                  "incarnation; selects are refused with input_reset until an operator runs `freshplan replay` "
                  "or `freshplan run --rebase`", ", ".join(f"{t}: {why}" for t, why in sorted(resets.items())),
                  extra={"reason": "input_reset", "topics": sorted(resets)})
